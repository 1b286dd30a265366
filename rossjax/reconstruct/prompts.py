"""The prompts of every reconstruction stage (PROMPT_VERSION names them in each record).

Every request is [system, user]; the user turn opens with `STAGE: <name>` and
`Artifact id: <id>` lines, so a transcript (or a scripted test server) can tell the stages and
artifacts apart. Answers are one JSON object of the shape each prompt ends with.

Which stages see the expert artifact y* (RetroGen App. A.1, C): cues, task and rubric
(induction), and the quality judge's reference. The execution stages (plan, step, whose last
answer is the draft) see the induced task x̂, the retrieved evidence Ê (ids and titles; RetroGen
only) and the tool observations, never y*: the draft is written from what the agent found, not
copied (tests/test_reconstruct_blind.py checks every request for an 8-word span of y*).
"""

from __future__ import annotations

import json

PROMPT_VERSION = "reconstruct-v2"  # v2: plan and step never carry y*
SYSTEM = ("You reconstruct the evidence-seeking work behind expert documents: the task an expert "
          "was given, the searches and readings that led to the document, and checks of the "
          "result. Answer with one JSON object only, exactly in the shape asked for.")
ACTIONS = ("search", "open", "extract", "compare", "outline", "draft")
TOOL_ACTIONS = ("search", "open", "extract", "compare")
_ARGS = {"search": '{"query": "keywords or a question"}',
         "open": '{"id": "a document id from a search result"}',
         "extract": '{"id": "a document id", "pattern": "text to find in its lines"}',
         "compare": '{"ids": ["id1", "id2"], "aspect": "a word or phrase both are read for"}',
         "outline": '{"outline": ["section or point", "..."]}',
         "draft": '{"text": "the finished document"}'}


def _head(stage: str, art: dict) -> str:
    return (f"STAGE: {stage}\nArtifact id: {art['id']}\nDomain: {art['domain']}"
            + (f" ({art['kind']})" if art.get("kind") else ""))


def _artifact(art: dict) -> str:
    return f"EXPERT ARTIFACT:\n<<<\n{art['text']}\n>>>"


def _msgs(user: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def cues(art: dict, found: list[dict], max_new: int) -> list[dict]:
    listed = "\n".join(f"- [{c['kind']}] {c['text']}" for c in found) or "- (none)"
    return _msgs(f"""{_head("cues", art)}

{_artifact(art)}

Cues the rules already found:
{listed}

List up to {max_new} further cues a researcher had to look up to write this artifact: named
entities, organizations, datasets, methods, defined terms, dates the rules missed. Copy each
exactly as it is written in the artifact; do not repeat the cues above.
Answer: {{"cues": [{{"text": "...", "kind": "entity|organization|dataset|method|term|date|other"}}]}}""")


def task(art: dict, cue_list: list[dict], rules: dict) -> list[dict]:
    named = ", ".join(repr(c["text"]) for c in cue_list if c["kind"] in rules["leak_kinds"])
    return _msgs(f"""{_head("task", art)}

{_artifact(art)}

1. Write the task the expert was given before writing this artifact: what to research and what
to produce, as a request to an analyst, in 1-3 sentences. It must not give away the content:
no run of {rules["ngram"]} or more consecutive words of the artifact, none of its citations,
statutes, case names or figures ({named or "none found"}), at most {rules["max_chars"]} characters.
2. Write an instance rubric of {rules["rubric_min"]}-{rules["rubric_max"]} criteria a reviewer can
apply to any answer to that task, each with the aspect it checks (coverage, accuracy, grounding,
structure, reasoning or style).
Answer: {{"task": "...", "rubric": [{{"criterion": "...", "aspect": "..."}}]}}""")


def evidence_lines(evidence: list[dict]) -> str:
    return "\n".join(f"- {e['id']}: {e['title']}" for e in evidence) or "- (none)"


def _found(evidence: list[dict] | None) -> str:
    # Ê by id and title, what artifact-conditioned retrieval found: never y*'s text
    return (f"\n\nCorpus documents retrieved for this task:\n{evidence_lines(evidence)}"
            if evidence is not None else "")


def plan(art: dict, task_text: str, evidence: list[dict] | None, draws: dict,
         max_steps: int) -> list[dict]:
    """evidence: Ê (RetroGen) or None (ForwardGen: x̂ alone)."""
    return _msgs(f"""{_head("plan", art)}

TASK: {task_text}{_found(evidence)}

Plan the work for this task, as steps over the actions {", ".join(ACTIONS)} ({max_steps} tool
steps at most: search, open, extract and compare run on a document corpus; outline and draft
are your own writing). The plan ends with draft. Realize it {draws["plan_realization"]}.
Answer: {{"plan": [{{"action": "search", "purpose": "why this step"}}, ...]}}""")


def step(art: dict, task_text: str, evidence: list[dict] | None, plan_steps: list[dict],
         history: str, used: int, max_steps: int, draws: dict, reflect: bool) -> list[dict]:
    planned = "\n".join(f"{k + 1}. {p['action']}: {p['purpose']}" for k, p in enumerate(plan_steps))
    actions = "\n".join(f"- {a} {_ARGS[a]}" for a in ACTIONS)
    if used >= max_steps:
        nxt = f"The tool budget is spent ({used} of {max_steps} tool steps): the action must be draft."
    else:
        nxt = f"Tool steps used: {used} of {max_steps}. Take the next step of the plan, or change course if the observations call for it."
    style = (f"Write search queries as {draws['query_style']}; outline at {draws['outline']} "
             f"granularity; format notes and the draft as {draws['format']}.")
    if reflect:
        style += " In this step's note, first reflect on what the evidence so far shows and lacks."
    return _msgs(f"""{_head("step", art)}

TASK: {task_text}{_found(evidence)}

PLAN:
{planned}

HISTORY:
{history or "(nothing yet)"}

{nxt}
{style}
Actions:
{actions}
Answer: {{"note": "what you do and why", "action": "...", "arguments": {{...}}}}""")


def _evidence_texts(evidence: list[dict], per_doc: int) -> str:
    return "\n\n".join(f"[{e['id']}] {e['title']}\n{e['text'][:per_doc]}" for e in evidence)


def verify_rubric(art: dict, task_text: str, rubric: list[dict], draft: str) -> list[dict]:
    crit = "\n".join(f"{k + 1}. ({r['aspect']}) {r['criterion']}" for k, r in enumerate(rubric))
    return _msgs(f"""{_head("verify_rubric", art)}

TASK: {task_text}

RUBRIC:
{crit}

ANSWER TO JUDGE:
<<<
{draft}
>>>

For every rubric criterion, say whether the answer meets it fully, partially or misses it.
Answer: {{"verdicts": [{{"criterion": 1, "verdict": "full|partial|missed", "why": "..."}}, ...]}}""")


def verify_quality(art: dict, task_text: str, draft: str) -> list[dict]:
    return _msgs(f"""{_head("verify_quality", art)}

TASK: {task_text}

{_artifact(art)}

ANSWER TO JUDGE:
<<<
{draft}
>>>

Rate the answer's quality as a {art.get("kind") or art["domain"]} document for this task, with
the expert artifact as the reference for what good looks like: clarity, organization,
specificity and fitness for purpose. 1 = unusable, 3 = adequate, 5 = expert quality.
Answer: {{"score": 1-5, "why": "..."}}""")


def verify_grounding(art: dict, task_text: str, notes: list[str], draft: str,
                     evidence: list[dict], per_doc: int) -> list[dict]:
    listed = "\n".join(f"note {k + 1}: {n}" for k, n in enumerate(notes)) or "(no notes)"
    return _msgs(f"""{_head("verify_grounding", art)}

TASK: {task_text}

EVIDENCE (the documents the claims may rest on):
{_evidence_texts(evidence, per_doc)}

NOTES OF THE WORK:
{listed}

FINAL ANSWER:
<<<
{draft}
>>>

List the factual claims of the notes and of the final answer (every claim of the final answer;
the notes' claims that the answer relies on). For each, say whether the evidence supports it
and which document does.
Answer: {{"claims": [{{"source": "note 1|draft", "claim": "...", "supported": true, "evidence": "doc id or null"}}, ...]}}""")


def verify_consistency(art: dict, task_text: str, steps_text: str) -> list[dict]:
    return _msgs(f"""{_head("verify_consistency", art)}

TASK: {task_text}

WORKFLOW (numbered entries):
{steps_text}

List the workflow's internal references: every place where an entry relies on an earlier one
(a note citing a search result, an open of an id a search returned, an extract of an opened
document, a draft sentence resting on an earlier observation). Say whether each is consistent:
the earlier entry exists and says what the later one takes from it.
Answer: {{"references": [{{"entry": 4, "refers_to": 2, "consistent": true, "why": "..."}}, ...]}}""")


def as_json(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)
