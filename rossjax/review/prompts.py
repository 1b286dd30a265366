"""The requests of each review stage, written for rossjax (docs/review.md shows them in order).

Every request is [system, user] (a retry or repair continues the conversation), asks for one
JSON object, and names the stage it serves. `SCHEMAS[stage]` is the answer's JSON schema, sent as
`response_format` when config.endpoint.response_format = "json_schema" (vLLM/SGLang guided
decoding, OpenAI structured outputs). Bump PROMPT_VERSION whenever a wording changes: it is
recorded in every reviewed row, and cached answers are keyed on the exact messages, so a new
wording is asked afresh.
"""

from __future__ import annotations

from rossjax.errors import ConfigError
from rossjax.review.render import context, render_transcript

PROMPT_VERSION = "ross-review-v5"

# The proposal's risk tags (a rossjax vocabulary: the reviewer names what makes a response risky
# to learn from, whether or not its spans leave that text out).
RISKS = ("lucky_answer", "unjustified_step", "calculation_error", "self_corrected_error",
         "unverified_claim", "missing_dependency", "missing_derivation", "format_problem")
AUDIT_KINDS = ("error", "dependency", "derivation")

SYSTEM = """\
You review rollouts of a language model that a verifier has already judged correct. The model \
will be trained again on parts of its own rollout, so you decide which assistant text is worth \
learning from. Judge the reasoning and actions, not only the final answer.

The transcript lists every message as [message I] with its 0-based index I, and every part of a \
message (content, reasoning, tool_calls) with 1-based line numbers written as "  N | text". The \
line numbers and the " | " separator are NOT part of the text: quote only the text after them, \
character for character (same spaces, punctuation, LaTeX backslashes).

Answer with exactly one JSON object and nothing else."""

_PROPOSAL = """\
PROPOSAL. Decide what of this single-turn response the model should learn from. The kept text \
is a training target: it must teach nothing wrong and must stand on its own.
- Leave out only text that is wrong: a false statement, an invalid or unjustified step, a \
calculation mistake, reasoning that does not support the answer. Redundancy alone is not an \
error: a correct second check, a restatement or a verification of earlier work stays.
- The kept text must be self-contained: every quantity, definition or intermediate result it \
uses is stated in the task or in the kept text (dependencies present), and the final answer is \
derived in it, not merely asserted (derivation present).
Decide "whole" (the whole assistant response, reasoning and answer, is clean), "spans" (only \
parts are: list them as keep spans) or "reject" (no clean, self-contained selection containing \
the complete final answer exists: e.g. a right answer by luck, or wrong or unjustified \
reasoning throughout).
A keep span is {"message": I, "start": "...", "end": "...", "reason": "..."}: it runs from the \
beginning of the verbatim text `start` to the end of the verbatim text `end`. Each anchor must \
occur EXACTLY ONCE in message I (make it long enough to be unique, within one line), `end` must \
come after `start`, spans must be listed in the order they appear and must not overlap, and \
only the assistant message can be kept (a span may begin in its reasoning and end in its \
content). The kept text must contain the complete final answer{final}.
Also report: "whole_clean" (true exactly when the whole response is clean as it stands), \
"clean_solution" (true exactly when a clean, self-contained solution can be kept, i.e. you do \
not reject), a "reason" per keep span (why that text is kept), "left_out" (one sentence: what \
the spans leave out and why; "" for whole), and "risk": the tags that apply to the response, \
from {risks} ([] if none).

Reply: {"decision": "whole" | "spans" | "reject", "whole_clean": false, "clean_solution": true, \
"keep": [{"message": 2, "start": "...", "end": "...", "reason": "..."}], "left_out": "...", \
"risk": [], "reason": "one sentence"}"""

_AUDIT = """\
AUDIT. Below is the exact text selected from a model's answer as a training target (kept spans \
in order; [...] marks left-out text). Judge it as a target that must stand on its own:
- "error": a false statement, an invalid or unjustified step, a calculation mistake, a claim \
contradicted by the task, or reasoning that does not support the final answer;
- "dependency": the text uses a quantity, definition or result that is neither in the task nor \
in the selected text (it was left out);
- "derivation": the final answer is asserted, not derived in the selected text.
Redundancy alone is not an error: a correct second check or a restatement is fine. Quote the \
wrong text verbatim for an error; for a dependency or derivation problem quote the text that \
relies on what is missing.
Then decide: "accept" (nothing wrong: the text can be learned as it is; no errors), "revise" \
(list the errors: a revised selection can leave them out or add what is missing) or "drop" (no \
clean, self-contained selection with the complete final answer can exist in this response, e.g. \
the answer is right by luck: say why in "reason").

Selected text:
<<<
{selected}
>>>

Reply: {{"verdict": "accept" | "revise" | "drop", "errors": [{{"kind": "error" | "dependency" | \
"derivation", "quote": "verbatim text from the selected text", "problem": "what is wrong"}}], \
"reason": "one sentence"}}"""

_REPAIR = """\
REPAIR. An independent audit of the text your proposal selects found these errors:
{errors}
Revise the proposal: leave out the text of every "error" (a revision that still keeps it is \
refused), and for a "dependency" or "derivation" problem keep the text the selection relies on \
(widen or add spans); or reject the rollout if no clean, self-contained selection that contains \
the complete final answer exists. Never invent text: spans select verbatim text only. Same \
rules and same reply format as before."""

_DISCOVERY = """\
SEMANTIC ERROR DISCOVERY. Judge these assistant steps of the rollout: {steps}. A step's calls \
are its tool calls, counted from 0 in order; a step without tool calls is one call (0), its \
text. Judge every call on these six checks, each "ok", "fail" or "unresolved":
- contract: does the call respect the task's instructions and the tool's interface?
- operation: is it the right operation with the right arguments for the state at that point?
- environment: does the step read the environment (tool results, files, errors) correctly?
- execution: is the call carried out and its result used correctly, without false claims?
- narrative: do the step's own statements (reasoning, summaries, claims of progress or \
success) match what the transcript shows?
- causal: does the step follow from what it had at that point, rather than from an earlier \
wrong step or result, or from something it never observed?
"unresolved" means the transcript does not let you decide (e.g. a claim nothing confirms).
Account for every line of every step: under "lines", give each numbered line of each text \
part (content, reasoning, tool_calls) of these steps exactly one verdict, as ranges \
{{"message": 2, "part": "content", "from": 1, "to": 3, "verdict": "ok" | "fail" | \
"unresolved"}} that together cover every line once. A line is "fail" when it holds or carries \
an error (its message then needs an error or omission finding), "unresolved" when it holds a \
claim you cannot settle; every error finding needs a "fail" line in its message.
Then list findings: "error" (something wrong is present), "omission" (something needed is \
missing: a check not run, a result not read), "unresolved" (a claim you cannot settle). Every \
axis judged fail needs an error or omission of that call naming that axis; every axis judged \
unresolved needs an unresolved finding of that call naming it. Do not give text boundaries yet.

Reply: {{"calls": [{{"message": 2, "call": 0, "contract": "ok", "operation": "fail", \
"environment": "ok", "execution": "ok", "narrative": "ok", "causal": "ok"}}], "lines": \
[{{"message": 2, "part": "content", "from": 1, "to": 2, "verdict": "ok"}}, {{"message": 2, \
"part": "content", "from": 3, "to": 3, "verdict": "fail"}}], "findings": [{{"kind": "error" \
| "omission" | "unresolved", "message": 2, "call": 0, "axes": ["operation"], "what": "one \
sentence"}}]}}"""

_LOCALIZE_ERROR = """\
BOUNDARY LOCALIZATION for this finding: an error in message {message} call {call} ({axes}): \
{what}
Give the exact text that must NOT be learned, as selectors {{"message": {message}, "line": N, \
"quote": "verbatim text on that line", "occurrence": K, "part": "content" | "reasoning" | \
"tool_calls"}}: line N is 1-based within that part, occurrence K (0-based) picks among repeated \
matches of the quote on the line, omit "quote" to select the whole line. Exclude as little as \
possible: only the wrong text, in message {message}. List under "protect" correct text near it \
that must stay learned (same selector form, any message); an exclusion may never touch it.
If the transcript does not let you point to the text of this error (it is nowhere you can \
quote), do not guess: reply {{"unresolved": "why it cannot be located"}}; the rollout is then \
not trained on.

Reply: {{"exclude": [{{"message": {message}, "line": 1, "quote": "...", "occurrence": 0}}], \
"protect": []}}"""

_LOCALIZE_OMISSION = """\
BOUNDARY LOCALIZATION for this finding: an omission in message {message} call {call} ({axes}): \
{what}
Say where the missing action belonged: after which verbatim text, as a selector \
{{"message": I, "line": N, "quote": "verbatim text on that line", "occurrence": K, "part": \
"content" | "reasoning" | "tool_calls"}}. An omission is recorded, not masked. If you cannot say \
where it belonged, do not guess: reply {{"unresolved": "why it cannot be located"}}; the \
rollout is then not trained on.

Reply: {{"after": {{"message": {message}, "line": 1, "quote": "...", "occurrence": 0}}, \
"note": "what was missing"}}"""

_RETRY = """\
Your answer failed a check and cannot be used: {detail}
Fix exactly that and reply with the corrected JSON object only (quote the transcript verbatim, \
without the line-number prefix)."""


def _user(record: dict, rendered, task: str) -> str:
    return f"{context(record)}\n\nTranscript:\n{render_transcript(record, rendered)}\n{task}"


def proposal(record: dict, rendered, answer: str | None) -> list[dict]:
    final = f" ({answer[:300]})" if answer else ""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": _user(record, rendered,
                                              _PROPOSAL.replace("{final}", final)
                                              .replace("{risks}", ", ".join(RISKS)))}]


def audit(record: dict, selected: str) -> list[dict]:
    """Judged without the transcript: the selected text itself, with the task it answers."""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{context(record)}\n\n"
                                        f"{_AUDIT.format(selected=selected)}"}]


def repair(proposal_messages: list[dict], accepted_answer: str, errors: list[dict]) -> list[dict]:
    lines = "\n".join(f"- {e.get('kind', 'error')}: {e['problem']}"
                      + (f" (at {e['quote']!r})" if e.get("quote") else "") for e in errors)
    return [*proposal_messages[:2], {"role": "assistant", "content": accepted_answer},
            {"role": "user", "content": _REPAIR.format(errors=lines)}]


def discovery(record: dict, rendered, group: list[tuple[int, int]]) -> list[dict]:
    steps = ", ".join(f"message {m} ({n} call{'s' if n > 1 else ''})" for m, n in group)
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": _user(record, rendered, _DISCOVERY.format(steps=steps))}]


def localization(record: dict, rendered, finding: dict) -> list[dict]:
    tmpl = _LOCALIZE_OMISSION if finding["kind"] == "omission" else _LOCALIZE_ERROR
    task = tmpl.format(message=finding["message"], call=finding["call"],
                       axes=", ".join(finding["axes"]), what=finding["what"])
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": _user(record, rendered, task)}]


def retry(messages: list[dict], answer: str, detail: str) -> list[dict]:
    """The same conversation plus the rejected answer and the exact check it failed."""
    return [*messages, {"role": "assistant", "content": answer},
            {"role": "user", "content": _RETRY.format(detail=detail)}]


def _obj(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": props, "required": required}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_SEL = _obj({"message": _INT, "line": _INT, "quote": _STR, "occurrence": _INT,
             "part": {"type": "string", "enum": ["content", "reasoning", "tool_calls"]}},
            ["message", "line"])
_JUDGE = {"type": "string", "enum": ["ok", "fail", "unresolved"]}
_AXES = ("contract", "operation", "environment", "execution", "narrative", "causal")
SCHEMAS = {
    "proposal": _obj({"decision": {"type": "string", "enum": ["whole", "spans", "reject"]},
                      "whole_clean": _BOOL, "clean_solution": _BOOL,
                      "keep": {"type": "array", "items": _obj(
                          {"message": _INT, "start": _STR, "end": _STR, "reason": _STR},
                          ["message", "start", "end", "reason"])},
                      "left_out": _STR,
                      "risk": {"type": "array", "items": {"type": "string", "enum": list(RISKS)}},
                      "reason": _STR}, ["decision", "whole_clean", "clean_solution", "risk"]),
    "audit": _obj({"verdict": {"type": "string", "enum": ["accept", "revise", "drop"]},
                   "errors": {"type": "array", "items": _obj(
                       {"kind": {"type": "string", "enum": list(AUDIT_KINDS)}, "quote": _STR,
                        "problem": _STR}, ["kind", "problem"])},
                   "reason": _STR}, ["verdict"]),
    "discovery": _obj({"calls": {"type": "array", "items": _obj(
        {"message": _INT, "call": _INT, **{a: _JUDGE for a in _AXES}},
        ["message", "call", *_AXES])},
        "findings": {"type": "array", "items": _obj(
            {"kind": {"type": "string", "enum": ["error", "omission", "unresolved"]},
             "message": _INT, "call": _INT, "axes": {"type": "array", "items": {
                 "type": "string", "enum": list(_AXES)}}, "what": _STR},
            ["kind", "message", "call", "axes", "what"])},
        "lines": {"type": "array", "items": _obj(
            {"message": _INT, "part": {"type": "string", "enum": ["content", "reasoning",
                                                                   "tool_calls"]},
             "from": _INT, "to": _INT, "verdict": _JUDGE},
            ["message", "part", "from", "to", "verdict"])}}, ["calls", "lines", "findings"]),
    "localization": _obj({"exclude": {"type": "array", "items": _SEL},
                          "protect": {"type": "array", "items": _SEL},
                          "after": _SEL, "note": _STR, "unresolved": _STR}, []),
}
SCHEMAS["repair"] = SCHEMAS["proposal"]
# excluded-content classification (classify.py checks the category against its seven)
SCHEMAS["classify"] = _obj({"category": _STR, "reason": _STR}, ["category", "reason"])


def response_format(stage: str, kind: str) -> dict | None:
    """The `response_format` field for `stage` under config.endpoint.response_format `kind`."""
    if kind in ("", "none"):
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": f"ross_{stage}",
                                                       "schema": SCHEMAS[stage]}}
    raise ConfigError(f"config.endpoint.response_format is {kind!r}, not one of none, json_object, "
                      "json_schema.")
