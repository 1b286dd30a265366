"""The rollout as the reviewer sees it, and which procedure it gets.

The transcript is shown part by part exactly as `rossjax curate` renders it (the configured chat
template), so the text the reviewer quotes is the text the selectors resolve against: each
message with its 0-based index and role, each part (content, reasoning, tool_calls) with 1-based
line numbers. Two procedures (docs/review.md):

  single_turn  one assistant answer: proposal of keep spans, checks, audit, repair;
  agentic      tool use or several assistant turns: semantic discovery over the assistant's
               steps, then boundary localization of each finding (exclude/protect/omissions).
"""

from __future__ import annotations

from rossjax.errors import ConfigError

MODES = ("auto", "keep", "exclude")  # config.mode: keep = single_turn, exclude = agentic


def review_mode(record: dict, mode: str = "auto") -> str:
    """'keep' (single-turn procedure) or 'exclude' (agentic): `mode` itself, or for 'auto'
    exclude when the rollout is agentic or multi-turn (a tool message, a tool call, or more than
    one assistant turn), keep otherwise."""
    if mode not in MODES:
        raise ConfigError(f"config.mode is {mode!r}, not one of {', '.join(MODES)}.")
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


def render_transcript(record: dict, rendered) -> str:
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


def context(record: dict) -> str:
    """Rollout id, domain, task, reference and verdict: what the reviewer judges against."""
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


def assistant_steps(record: dict) -> list[tuple[int, int]]:
    """(message index, number of calls) of each assistant step the rollout owns. A call is one
    tool call of the step; a step without tool calls is one call (its text)."""
    return [(i, max(1, len(m.get("tool_calls") or []))) for i, m in enumerate(record["messages"])
            if m["role"] == "assistant"]


def step_groups(record: dict, size: int) -> list[list[tuple[int, int]]]:
    """The assistant steps in consecutive groups of `size` (each group is one discovery call)."""
    steps = assistant_steps(record)
    return [steps[k:k + size] for k in range(0, len(steps), max(1, size))]
