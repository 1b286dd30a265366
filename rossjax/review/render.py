"""The reviewer's request for one rollout, and the repair request after an unusable answer.

The transcript is shown part by part exactly as `rossjax curate` renders it (curate.chat with the
configured template), so the text the reviewer quotes is the text the selectors resolve against:
each message with its 0-based index and role, each part (content, reasoning, tool_calls) with
1-based line numbers. Two annotation modes (DESIGN.md "Data contracts"):

  keep     single-turn rollouts: `keep` anchors around the spans worth learning from;
  exclude  agentic / multi-turn rollouts: `exclude` line quotes of what must not be learned,
           `protect` quotes that must stay supervised, `omissions` (what was missing).

Both always ask for `status` accept | revise | drop and for one JSON object only. Bump
PROMPT_VERSION whenever the wording changes: it is recorded in every reviewed row, and cached
answers are keyed on the exact messages, so a new wording is asked afresh.
"""

from __future__ import annotations

from rossjax.curate.chat import Rendered

PROMPT_VERSION = "ross-review-v1"
MODES = ("auto", "keep", "exclude")

_SYSTEM = """\
You review rollouts of a language model that a verifier has already judged correct. The model \
will be trained again on parts of its own rollout, so you choose which assistant text is worth \
learning from. Judge the reasoning and actions, not only the final answer.

The transcript lists every message as [message I] with its 0-based index I, and every part of a \
message (content, reasoning, tool_calls) with 1-based line numbers written as "  N | text". The \
line numbers and the " | " separator are NOT part of the text: quote only the text after them, \
character for character (same spaces, punctuation, LaTeX backslashes).

Answer with exactly one JSON object and nothing else."""

_KEEP = """\
Annotate this single-turn rollout in KEEP mode: list the spans of assistant text worth learning \
from. Each span is {"message": I, "start": "...", "end": "..."} where `start` is a verbatim \
substring where the span begins and `end` a verbatim substring where it ends (the span runs from \
the start of `start` to the end of `end`). Each anchor must occur EXACTLY ONCE in that message \
(make it long enough to be unique, at most one line), `end` must come after `start`, spans must \
not overlap, and only assistant messages can be kept. A span may begin in the reasoning part and \
end in the content part of the same message. Leave out confused, wrong, or needlessly repeated \
reasoning; a span that ends at the end of the answer also teaches the model to stop there.

status: "accept" (keep it as annotated, nothing wrong), "revise" (worth learning from once the \
bad parts are left out), "drop" (not worth learning from at all, e.g. right answer by luck or \
wrong reasoning).

Reply with one JSON object:
{"status": "accept" | "revise" | "drop",
 "keep": [{"message": 2, "start": "verbatim start anchor", "end": "verbatim end anchor"}],
 "reason": "one sentence"}"""

_EXCLUDE = """\
Annotate this agentic / multi-turn rollout in EXCLUDE mode: every assistant token is learned \
from except what you exclude. Each selector is {"message": I, "line": N, "quote": "...", \
"occurrence": K, "part": P}: `quote` is verbatim text on line N of part P ("content" by default, \
or "reasoning" / "tool_calls") of message I, and `occurrence` (default 0) picks among repeated \
matches of the quote on that line, counted from 0. Omit `quote` to select the whole line.
- "exclude": assistant text that must NOT be learned (harmful or reckless actions, false claims, \
needless detours). Only assistant messages can be excluded.
- "protect": text that must stay learned (an exclusion may not touch it).
- "omissions": what the assistant should have done but did not: {"message": I, "after": \
"verbatim text after which it was missing", "note": "what was missing"}.

status: "accept" (learn from all of it), "revise" (learn from it with the exclusions), "drop" \
(not worth learning from at all).

Reply with one JSON object:
{"status": "accept" | "revise" | "drop",
 "exclude": [{"message": 2, "line": 3, "quote": "verbatim", "occurrence": 0}],
 "protect": [{"message": 4, "line": 1, "quote": "verbatim"}],
 "omissions": [{"message": 4, "after": "verbatim", "note": "what was missing"}],
 "reason": "one sentence"}"""

_REPAIR = """\
Your annotation could not be applied: {error}
Fix it (quote the transcript verbatim, without the line-number prefix) and reply with the \
corrected JSON object only."""


def review_mode(record: dict, mode: str = "auto") -> str:
    """'keep' or 'exclude': `mode` itself, or for 'auto' exclude when the rollout is agentic or
    multi-turn (a tool message, a tool call, or more than one assistant turn), keep otherwise."""
    if mode not in MODES:
        raise ValueError(f"config.mode {mode!r} is not one of {', '.join(MODES)}")
    if mode != "auto":
        return mode
    msgs = record["messages"]
    assistants = [m for m in msgs if m["role"] == "assistant"]
    agentic = (any(m["role"] == "tool" for m in msgs) or len(assistants) > 1
               or any(m.get("tool_calls") for m in assistants))
    return "exclude" if agentic else "keep"


def _numbered(text: str) -> str:
    lines = text.split("\n")
    width = len(str(len(lines)))
    return "\n".join(f"  {n:>{width}} | {line}" for n, line in enumerate(lines, start=1))


def render_transcript(record: dict, rendered: Rendered) -> str:
    """Every message with its index and role, each part's text with 1-based line numbers."""
    out = []
    for i, m in enumerate(record["messages"]):
        head = f"[message {i}] {m['role']}" + (f" (name: {m['name']})" if m.get("name") else "")
        out.append(head)
        parts = [p for p in rendered.message_parts(i) if p.kind != "end"]
        for p in parts:
            text = rendered.text[p.text_start:p.text_end]
            label = "" if p.kind == "content" and len(parts) == 1 else f" {p.kind}:"
            out.append(f"{label}\n{_numbered(text)}" if label else _numbered(text))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _context(record: dict) -> str:
    task, ver = record.get("task") or {}, record.get("verifier") or {}
    lines = [f"Rollout id: {record['id']}"]
    if task.get("domain"):
        lines.append(f"Domain: {task['domain']}")
    if task.get("prompt"):
        lines.append(f"Task:\n{task['prompt']}")
    if task.get("reference") is not None:
        lines.append(f"Reference answer: {task['reference']}")
    if ver:
        verdict = {True: "passed", False: "failed", None: "undecided"}.get(ver.get("passed"), "?")
        lines.append(f"Verifier {ver.get('name', '?')}: {verdict}"
                     + (f" ({ver['evidence']})" if ver.get("evidence") else ""))
    if record.get("reward") is not None:
        lines.append(f"Reward: {record['reward']}")
    return "\n".join(lines)


def build_messages(record: dict, rendered: Rendered, mode: str) -> list[dict]:
    """The chat request asking the reviewer to annotate `record` in `mode` ('keep' | 'exclude')."""
    if mode not in ("keep", "exclude"):
        raise ValueError(f"annotation mode {mode!r} must be 'keep' or 'exclude'")
    user = (f"{_context(record)}\n\nTranscript:\n{render_transcript(record, rendered)}\n"
            f"{_KEEP if mode == 'keep' else _EXCLUDE}")
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


def repair_messages(messages: list[dict], answer: str, error: str) -> list[dict]:
    """The same conversation plus the reviewer's answer and the exact error it caused."""
    return [*messages, {"role": "assistant", "content": answer},
            {"role": "user", "content": _REPAIR.format(error=error)}]

