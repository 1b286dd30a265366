"""GRPO's CPU rewards: `score(kind, record) -> (reward, verdict)`, never raising.

Kinds: "verifier" (the curation verifiers: 1 pass, 0 fail, NaN undecided), "contains" (the
task's reference letter occurs in the answer), "validity" (the answer is a valid generated
induction task). `score_batch` is the job a rossjax.verify.pool.WorkerPool runs for a step's
candidates (no jax here: it runs in spawned worker processes).
"""

from __future__ import annotations

import math

from rossjax.errors import InputError
from rossjax.verify.base import verifier_name, verify_one
from rossjax.verify.induction_task import check_task, parse_generated_task, protocol_from
from rossjax.verify.math_task import check_problem, parse_generated_problem

CPU_REWARDS = ("verifier", "contains", "validity", "math_validity")


def parse_induction_task(text: str) -> dict | None:
    """A generated induction task (program, inputs, message) from the generator's answer, or None."""
    return parse_generated_task(text)


def score(kind: str, record: dict) -> tuple[float, dict | None]:
    """(reward, verifier verdict dict or None) for one record; never raises.

    verifier: 1 if the curation verifier passes, 0 if it fails, NaN if it cannot decide;
    contains: 1 if task.reference occurs in the answer; validity: 1 if the answer is a valid
    induction task under the AZR protocol (rossjax.verify.induction_task.check_task: N inputs, a
    message, `task_valid`; the protocol rides on the record's task), else 0; math_validity: 1 if
    the answer is a valid generated math problem (rossjax.verify.math_task.check_problem).
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
        protocol = protocol_from((record.get("task") or {}).get("protocol"))
        v = check_task(parse_generated_task(content), protocol)
        return float(bool(v.passed)), {"name": "induction_task_valid", "passed": bool(v.passed),
                                       "evidence": v.evidence[:300]}
    if kind == "math_validity":
        v = check_problem(parse_generated_problem(content))
        return float(bool(v.passed)), {"name": "math_problem_valid", "passed": bool(v.passed),
                                       "evidence": v.evidence[:300]}
    raise InputError(f"reward kind {kind!r} is not one of {', '.join(CPU_REWARDS)}.")


def score_batch(kinds: tuple, records: list[dict]) -> list[dict]:
    """For a worker: {kind: (reward, verdict)} per record."""
    return [{k: score(k, r) for k in kinds} for r in records]
