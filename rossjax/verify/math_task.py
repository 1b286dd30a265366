"""PROPEL's Math domain: what a generator is asked for and the validity gate W of its answer.

The generator writes a problem in a ```problem block and its final answer in \\boxed{} after
it. W: the problem is non-empty, the boxed answer parses with math-verify, and the problem does
not give its own answer away in a \\boxed{}. A valid problem becomes a solver task
{"domain": "math", "prompt": problem, "reference": answer} (the curation math verifier scores
a solver's answers against it). No jax here (reward workers).
"""

from __future__ import annotations

from rossjax.verify.answers import _FENCE, extract_boxed
from rossjax.verify.verdict import Verdict

GENERATOR_PROMPT = (
    "Write a challenging math problem with a single final answer. Put the problem statement in a "
    "```problem block, then give its final answer in \\boxed{} after the block. Make it hard but "
    "solvable.")


def parse_generated_problem(text: str) -> dict | None:
    """{"prompt", "reference"} from a generator's answer, or None."""
    problem = next((body for lang, body in _FENCE.findall(text or "") if lang.lower() == "problem"),
                   None)
    if problem is None:
        return None
    rest = (text or "").split(problem, 1)[-1]
    ref = extract_boxed(rest)
    return {"prompt": problem.strip(), "reference": ref.strip() if ref is not None else None}


def check_problem(task: dict | None) -> Verdict:
    from math_verify import parse

    if task is None or not task["prompt"]:
        return Verdict(False, "no ```problem block")
    if task["reference"] is None or not task["reference"]:
        return Verdict(False, "no \\boxed{} final answer after the problem")
    if extract_boxed(task["prompt"]) is not None:
        return Verdict(False, "the problem states its own answer in \\boxed{}")
    if not any(not isinstance(x, str) for x in parse(f"\\boxed{{{task['reference']}}}")):
        return Verdict(False, f"math-verify cannot parse the answer {task['reference'][:60]!r}")
    return Verdict(True, "valid: a problem and a parseable final answer")
