"""Trajectory reconstruction (RetroGen §2): a plan over Search / Open / Extract / Compare /
Outline / Draft, materialized one step at a time into a tool-use trace that ends in a draft ỹ.

The model chooses each step; the observation of every Search, Open, Extract and Compare is the
corpus environment's own output for that call (agents/corpus.py, run here), never text the model
wrote. At most `max_tool_steps` (30) tool steps: at the cap the model is told to draft, and a
tool call instead withholds the artifact as `step_cap`. The model sees its history through a
sliding window of the last `window_chars` (8,000) characters of the trace, whole entries, newest
kept (a newest entry longer than the window alone: its start, marked as cut). A failed retrieval
(no match) or a malformed tool execution (an error observation) ends the trace: the gate of
`rossjax retrogen` discards such a trajectory, so nothing more is asked.

Diversity (`draws`): per artifact and method a seeded draw, independent of row order, picks the
query formulation, plan realization, outline granularity, reflection frequency and surface
formatting the prompts ask for, and (App. A.2) the agent's persona (its system prompt), the
tool-schema rendering and the thought template of its notes; each record carries its draw.
"""

from __future__ import annotations

import hashlib
import json
import threading

import numpy as np

from rossjax.agents.env import ToolCall
from rossjax.reconstruct import prompts
from rossjax.reconstruct.asking import Asker, Settled, bad, want_items, want_text

QUERY_STYLES = ("short keyword queries", "natural-language questions", "entity-first phrases")
REALIZATIONS = ("breadth-first (search widely, then read the best hits)",
                "depth-first (read each promising hit before the next search)")
OUTLINES = ("coarse (3-4 points)", "fine (6-8 points)")
REFLECT_EVERY = (0, 2, 4)  # tool steps between reflections; 0 = never
FORMATS = ("prose paragraphs", "bulleted points")
NO_RESULT = ("no match", "pattern not found")


def draws(seed: int, artifact_id: str, method: str) -> dict:
    h = hashlib.blake2b(f"{seed}:{method}:{artifact_id}".encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(h, "little"))
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    out = {"query_style": pick(QUERY_STYLES), "plan_realization": pick(REALIZATIONS),
           "outline": pick(OUTLINES), "reflect_every": int(pick(REFLECT_EVERY)),
           "format": pick(FORMATS)}
    # A.2's further axes, drawn after the first five so their draws are unchanged
    out.update(persona=pick(sorted(prompts.PERSONAS)), tool_schema=pick(prompts.SCHEMAS),
               thought=pick(prompts.THOUGHTS))
    return out


class Tools:
    """The corpus environment's search / open / extract, plus compare (extract of one aspect
    from each of several documents, side by side). One lock: bm25s is not promised to be
    thread-safe and artifacts run concurrently."""

    def __init__(self, env):
        self.env, self._lock = env, threading.Lock()

    def run(self, name: str, args: dict, call_id: str) -> str:
        with self._lock:
            if name != "compare":
                return self.env.call(ToolCall(name, args, call_id)).content
            parts = []
            for doc_id in args["ids"]:
                got = self.env.call(ToolCall("extract", {"id": doc_id, "pattern": args["aspect"]},
                                             call_id)).content
                if got.startswith("error:"):
                    return got
                parts.append((doc_id, got))
            if all(got in NO_RESULT for _, got in parts):  # nothing to compare
                return "pattern not found"
            return "\n\n".join(f"[{doc_id}]\n{got}" for doc_id, got in parts)


def failed(content: str) -> str | None:
    """The reason code of an observation the gate would discard, else None."""
    if content.startswith("error:"):
        return "malformed_tool_call"
    if content.strip() in NO_RESULT or not content.strip():
        return "failed_retrieval"
    return None


def render(trace: list[dict]) -> list[str]:
    """One line per trace entry, numbered from 1 (what the window and the verifier read)."""
    out = []
    for k, e in enumerate(trace, 1):
        if e["type"] == "note":
            out.append(f"[{k}] note: {e['content']}")
        elif e["type"] == "call":
            out.append(f"[{k}] call {e['name']} {json.dumps(e['arguments'], ensure_ascii=False)}")
        else:
            out.append(f"[{k}] observation: {e['content']}")
    return out


def window(trace: list[dict], chars: int) -> str:
    """The newest whole entries that fit in `chars` characters, oldest first; when the newest
    alone does not fit (a compare over five documents), its start, saying it is cut."""
    lines, kept, used = render(trace), [], 0
    for line in reversed(lines):
        if used + len(line) + 1 > chars:
            break
        kept.append(line)
        used += len(line) + 1
    if not kept and lines:  # the newest entry alone is longer: its start, marked as cut
        line = lines[-1]
        kept.append(f"{line[:chars - 120]}\n({len(line) - (chars - 120)} characters of this entry "
                    f"are cut: it is longer than the window)")
    elided = len(lines) - len(kept)
    head = [f"({elided} earlier entries are outside the {chars}-character window)"] if elided else []
    return "\n".join(head + kept[::-1])


def _str_list(v, where: str, lo: int, hi: int = 50) -> list[str]:
    if (not isinstance(v, list) or not lo <= len(v) <= hi
            or not all(isinstance(x, str) and x.strip() for x in v)):
        raise bad(where, f"must be a list of {lo} to {hi} non-empty strings, got {v!r:.80}")
    return [x.strip() for x in v]


def check_step(obj) -> tuple[str, str, dict]:
    note = obj.get("note", "")
    if not isinstance(note, str):
        raise bad("step.note", f"must be a string, got {type(note).__name__}")
    action = obj.get("action")
    if action not in prompts.ACTIONS:
        raise bad("step.action", f"must be one of {', '.join(prompts.ACTIONS)}, got {action!r:.40}")
    a = obj.get("arguments")
    if not isinstance(a, dict):
        raise bad("step.arguments", f"must be an object, got {type(a).__name__}")
    if action == "search":
        args = {"query": want_text(a, "query", "step.arguments", 500)}
    elif action == "open":
        args = {"id": want_text(a, "id", "step.arguments", 200)}
    elif action == "extract":
        args = {"id": want_text(a, "id", "step.arguments", 200),
                "pattern": want_text(a, "pattern", "step.arguments", 200)}
    elif action == "compare":
        args = {"ids": _str_list(a.get("ids"), "step.arguments.ids", 2, 5),
                "aspect": want_text(a, "aspect", "step.arguments", 200)}
    elif action == "outline":
        args = {"outline": _str_list(a.get("outline"), "step.arguments.outline", 1)}
    else:
        args = {"text": want_text(a, "text", "step.arguments")}
    return note.strip(), action, args


def check_plan(obj, max_items: int) -> list[dict]:
    items = want_items(obj, "plan", "plan", lo=1, hi=max_items)
    out = []
    for j, p in enumerate(items):
        if p.get("action") not in prompts.ACTIONS:
            raise bad(f"plan.plan[{j}].action", f"must be one of {', '.join(prompts.ACTIONS)}, "
                                                f"got {p.get('action')!r:.40}")
        out.append({"action": p["action"], "purpose": want_text(p, "purpose", f"plan.plan[{j}]", 400)})
    if out[-1]["action"] != "draft":
        raise bad(f"plan.plan[{len(out) - 1}].action", "must be draft: the plan ends in the draft")
    return out


def reconstruct(asker: Asker, art: dict, task: str, evidence: list[dict], tools: Tools,
                method: str, cfg) -> dict:
    """{"plan", "trace", "draft", "draws", "tool_steps"}; raises Settled when the trace fails."""
    d = draws(cfg.seed, art["id"], method)
    # the agent sees x̂, Ê (RetroGen only) and its own observations: y* is never shown (item 1 of
    # issue 38; prompts.py says which stages may read it)
    shown = evidence if method == "retrogen" else None
    plan_steps = asker.ask("plan", prompts.plan(art, task, shown, d, cfg.max_tool_steps),
                           lambda o: check_plan(o, cfg.max_tool_steps + 10))
    trace: list[dict] = []
    used = writing = 0
    while True:
        reflect = bool(d["reflect_every"]) and used > 0 and used % d["reflect_every"] == 0
        msgs = prompts.step(art, task, shown, plan_steps, window(trace, cfg.window_chars), used,
                            cfg.max_tool_steps, d, reflect)
        note, action, args = asker.ask("step", msgs, check_step)
        if action in prompts.TOOL_ACTIONS and used >= cfg.max_tool_steps:
            raise Settled("withheld", "step_cap", f"{asker.where}: the trace reached the cap of "
                          f"{cfg.max_tool_steps} tool steps and the next step was {action} "
                          f"instead of the draft", "step")
        if note:
            trace.append({"type": "note", "content": note})
        if action == "draft":
            return {"plan": plan_steps, "trace": trace, "draft": args["text"], "draws": d,
                    "tool_steps": used}
        if action == "outline":
            writing += 1
            if writing > cfg.max_writing_steps:
                raise Settled("withheld", "no_draft", f"{asker.where}: outline step {writing} "
                              f"is over config.max_writing_steps={cfg.max_writing_steps} "
                              f"({used} tool steps, no draft)", "step")
            trace.append({"type": "note", "content": "Outline:\n" + "\n".join(
                f"- {x}" for x in args["outline"])})
            continue
        used += 1
        cid = f"c{used}"
        content = tools.run(action, args, cid)  # the environment's text, verbatim
        trace.append({"type": "call", "id": cid, "name": action, "arguments": args})
        why = failed(content)
        trace.append({"type": "observation", "call_id": cid, "content": content, "ok": why is None})
        if why:
            raise Settled("withheld", why, f"{asker.where}: tool step {used} {action} "
                          f"{json.dumps(args, ensure_ascii=False)[:120]} returned "
                          f"{content[:120]!r}", "step")
