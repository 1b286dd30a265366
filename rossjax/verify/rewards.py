"""GRPO's CPU rewards: `score(kind, record) -> (reward, verdict)`, never raising.

Kinds: "verifier" (the curation verifiers: 1 pass, 0 fail, NaN undecided), "contains" (the
task's reference letter occurs in the answer), "validity" (the answer is a valid generated
induction task). `score_batch` is the job a rossjax.verify.pool.WorkerPool runs for a step's
candidates (no jax here: it runs in spawned worker processes).

Custom rewards: `config.reward.fn=module:function` names a Python callable
`(prompt, completion, task) -> float` (prompt: the task's user message, completion: the answer's
text, task: the record's task dict), scored as kind "fn" on the same workers. A module on
PYTHONPATH (or the working directory) is found there too: spawned workers get the parent's
sys.path. Setting reward.fn alone makes it the run's reward; list "fn" in reward.functions to
weigh it with others.
"""

from __future__ import annotations

import math
import numbers

from rossjax.errors import ConfigError, InputError
from rossjax.plugins import load_callable
from rossjax.verify.base import verifier_name, verify_one
from rossjax.verify.induction_task import check_task, parse_generated_task, protocol_from
from rossjax.verify.math_task import check_problem, parse_generated_problem

CPU_REWARDS = ("verifier", "contains", "validity", "math_validity", "fn")


def load_custom(spec: str, field: str = "config.reward.fn"):
    """The callable `config.reward.fn` names ("module:function"): rossjax.plugins.load_callable,
    the loader every `module:function` field goes through."""
    return load_callable(spec, field)


def check_custom(reward_cfg):
    """Resolve config.reward.fn before a model loads: importable and callable; set alone, it
    becomes the run's only reward function; "fn" listed without reward.fn is an error."""
    spec = reward_cfg.get("fn", "")
    if not spec:
        if "fn" in reward_cfg.functions:
            raise ConfigError("config.reward.functions lists 'fn' but config.reward.fn is empty; "
                              "give it as module:function.")
        return
    load_custom(spec)
    if "fn" not in reward_cfg.functions:
        reward_cfg.functions, reward_cfg.weights = ("fn",), (1.0,)


def custom_score(spec: str, record: dict) -> float:
    """The custom reward of one record (a user function's error keeps its traceback)."""
    msgs = record["messages"]
    prompt = next((m.get("content") or "" for m in reversed(msgs[:-1]) if m["role"] == "user"), "")
    out = load_custom(spec)(prompt, msgs[-1].get("content") or "", record.get("task") or {})
    if not isinstance(out, numbers.Real):
        raise TypeError(f"config.reward.fn {spec} returned {type(out).__name__}; it must return "
                        f"a float.")
    return float(out)


def parse_induction_task(text: str) -> dict | None:
    """A generated induction task (program, inputs, message) from the generator's answer, or None."""
    return parse_generated_task(text)


def score(kind: str, record: dict, custom: str = "") -> tuple[float, dict | None]:
    """(reward, verifier verdict dict or None) for one record; never raises.

    verifier: 1 if the curation verifier passes, 0 if it fails, NaN if it cannot decide;
    contains: 1 if task.reference occurs in the answer; validity: 1 if the answer is a valid
    induction task under the AZR protocol (rossjax.verify.induction_task.check_task: N inputs, a
    message, `task_valid`; the protocol rides on the record's task), else 0; math_validity: 1 if
    the answer is a valid generated math problem (rossjax.verify.math_task.check_problem);
    fn: the custom function `custom` names (module:function), which may raise.
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
    if kind == "fn":
        return custom_score(custom, record), None
    raise InputError(f"reward kind {kind!r} is not one of {', '.join(CPU_REWARDS)}.")


def score_batch(kinds: tuple, records: list[dict], custom: str = "") -> list[dict]:
    """For a worker: {kind: (reward, verdict)} per record (`custom`: config.reward.fn)."""
    return [{k: score(k, r, custom) for k in kinds} for r in records]
