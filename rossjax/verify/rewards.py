"""GRPO's CPU rewards: `score(kind, record) -> (reward, verdict)`, never raising.

Kinds: "verifier" (the curation verifiers: 1 pass, 0 fail, NaN undecided), "contains" (the
task's reference letter occurs in the answer), "validity" (the answer is a valid generated
induction task). `score_batch` is the job a rossjax.verify.pool.WorkerPool runs for a step's
candidates (no jax here: it runs in spawned worker processes).
"""

from __future__ import annotations

import math

from rossjax.errors import InputError
from rossjax.verify.answers import _FENCE
from rossjax.verify.base import verifier_name, verify_one
from rossjax.verify.induction import task_valid

CPU_REWARDS = ("verifier", "contains", "validity")


def parse_induction_task(text: str) -> dict | None:
    """A generated induction task (program + inputs) from the generator's answer, or None."""
    program, inputs = None, None
    for lang, body in _FENCE.findall(text or ""):
        if lang.lower() in ("python", "py") and program is None:
            program = body
        elif lang.lower() == "inputs" and inputs is None:
            inputs = [ln.strip() for ln in body.splitlines() if ln.strip()]
    if program is None or not inputs:
        return None
    return {"program": program, "inputs": inputs}


def score(kind: str, record: dict) -> tuple[float, dict | None]:
    """(reward, verifier verdict dict or None) for one record; never raises.

    verifier: 1 if the curation verifier passes, 0 if it fails, NaN if it cannot decide;
    contains: 1 if task.reference occurs in the answer; validity: 1 if the answer is a valid
    induction task (parse + `task_valid`), else 0.
    """
    content = record["messages"][-1].get("content") or ""
    if kind == "contains":
        ref = (record.get("task") or {}).get("reference") or ""
        ok = bool(ref) and ref in content
        return float(ok), {"name": "contains", "passed": ok,
                           "evidence": f"{ref!r} {'found' if ok else 'not found'} in the answer"}
    if kind == "verifier":
        name = verifier_name(record)
        v = verify_one(record, name)
        r = math.nan if v.passed is None else float(v.passed)
        return r, {"name": name or "?", "passed": v.passed, "evidence": v.evidence[:300]}
    if kind == "validity":
        task = parse_induction_task(content)
        if task is None:
            return 0.0, {"name": "induction_task_valid", "passed": False,
                         "evidence": "no ```python and ```inputs blocks"}
        v = task_valid(task)
        return float(bool(v.passed)), {"name": "induction_task_valid", "passed": bool(v.passed),
                                       "evidence": v.evidence[:300]}
    raise InputError(f"reward kind {kind!r} is not one of {', '.join(CPU_REWARDS)}.")


def score_batch(kinds: tuple, records: list[dict]) -> list[dict]:
    """For a worker: {kind: (reward, verdict)} per record."""
    return [{k: score(k, r) for k in kinds} for r in records]
