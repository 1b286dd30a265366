"""PROPEL's Math domain: what a generator is asked for, the validity gate W of what it wrote, and
the solver task a valid problem becomes.

The generator writes the problem only, in a ```problem block under a "## Problem" heading (a
bare "## Problem" section is read too); it is shown two example problems
drawn from a pool (rossjax/verify/generator_context.py) and gives no answer. W: a non-empty
problem that does not give its own answer away in a \\boxed{}. Anything the generator writes
after the block (a \\boxed{} answer included) is ignored: the reference answer comes from the
two-oracle policy (rossjax/verify/math_oracle.py), never from the generator. A problem with an
agreed reference becomes the solver task {"domain": "math", "problem", "prompt", "reference"}
that the curation math verifier scores. No jax here (reward workers).
"""

from __future__ import annotations

import re

from rossjax.verify.answers import _FENCE, extract_boxed
from rossjax.verify.verdict import Verdict

# PROPEL's Math generator prompt (App. 18), in rossjax's words: the task, its requirements (an
# area of its own each time, one checkable answer, no solution) and the "## Problem" section
INSTRUCTION = (
    "## Task\n"
    "Write one new math problem that is challenging but solvable and has a single final answer "
    "(a number or a short closed-form expression) that can be checked.\n\n"
    "### Requirements\n"
    "- choose a different area of mathematics each time (algebra, geometry, number theory, "
    "combinatorics, probability, calculus, sequences, ...), not only the examples' area\n"
    "- make it self-contained: state every quantity and definition it needs\n"
    "- aim for several steps of reasoning, not a routine exercise\n"
    "- do not solve it, hint at its answer or state the answer\n\n"
    "### Output format\n"
    "A section headed ## Problem holding the statement, and only the statement, in a "
    "```problem block.")
SOLVER_INSTRUCTION = "Solve the problem. Put your final answer in \\boxed{}."
GENERATOR_PROMPT = INSTRUCTION  # the prompt without examples (context kind "instruction")
MAX_PROBLEM_CHARS = 4000


def generator_prompt(examples: list[dict] | None = None) -> str:
    """The generator's prompt: the examples' problems (without answers), then the instruction."""
    if not examples:
        return INSTRUCTION
    shown = "\n\n".join(f"Example {i}:\n```problem\n{e['problem'].strip()}\n```"
                        for i, e in enumerate(examples, 1))
    return (f"## Examples\nHere are {len(examples)} example math problems; yours must be new and "
            f"different from them.\n\n{shown}\n\n" + INSTRUCTION)


_SECTION = re.compile(r"^##[ \t]+Problem[ \t]*\n(.*?)(?=^##[ \t]|\Z)", re.S | re.M | re.I)


def parse_generated_problem(text: str) -> dict | None:
    """{"problem"} from a generator's answer: its first ```problem block, else the text of its
    "## Problem" section (up to the next ## heading) when that section has no block; or None."""
    problem = next((body for lang, body in _FENCE.findall(text or "") if lang.lower() == "problem"),
                   None)
    if problem is None:
        m = _SECTION.search(text or "")
        problem = m.group(1) if m else None
    return None if problem is None else {"problem": problem.strip()}


def check_problem(task: dict | None) -> Verdict:
    """The validity gate W of a generated problem."""
    if task is None:
        return Verdict(False, "no ```problem block")
    problem = task.get("problem") or ""
    if not problem.strip():
        return Verdict(False, "the ```problem block is empty")
    if len(problem) > MAX_PROBLEM_CHARS:
        return Verdict(False, f"the problem has {len(problem)} characters; at most "
                              f"{MAX_PROBLEM_CHARS} are allowed")
    if extract_boxed(problem) is not None:
        return Verdict(False, "the problem states its own answer in \\boxed{}")
    return Verdict(True, "valid: a non-empty problem that does not give its answer away")


def task_text(task: dict) -> str:
    """The problem in canonical form: what the probe reads (as a user turn) in GRPO and in the
    stores `rossjax label-corpus` prepares."""
    return "```problem\n" + task["problem"].strip() + "\n```"


def solver_prompt(problem: str) -> str:
    return problem.strip() + "\n\n" + SOLVER_INSTRUCTION


def solver_task(problem: str, task_id: str, reference: str | None = None) -> dict:
    """The solver's task for a problem; `reference` (the oracles' agreed answer) is None while
    the oracles are still to answer it."""
    t = {"id": task_id, "domain": "math", "problem": problem, "prompt": solver_prompt(problem)}
    if reference is not None:
        t["reference"] = reference
    return t


_TOPICS = (("geometry", r"triangle|circle|angle|polygon|hexagon|square|area|perimeter|radius|"
                        r"cone|sphere|volume|diagonal|coordinate|\(\s*-?\d+\s*,\s*-?\d+\s*\)"),
           ("probability", r"probabilit|dice|die\b|coin|random|expected value|marble"),
           ("combinatorics", r"how many ways|arrange|permutation|combination|subsets?\b|"
                             r"committee|choose"),
           ("number theory", r"prime|divisor|divisible|remainder|gcd|greatest common|lcm|"
                             r"modulo|\\pmod|\\equiv|digits?\b|integers? between"),
           ("calculus", r"\\int|derivative|limit|\\lim|integral"),
           ("sequences", r"sequence|series|\\sum|term\b|terms\b"),
           ("algebra", r"[a-z]\^|equation|polynomial|roots?\b|solve|real numbers|\\log|function"))


def topic(problem: str) -> str:
    """A rule-based topic: the first family whose keywords the problem uses (else "other")."""
    low = (problem or "").lower()
    return next((name for name, pat in _TOPICS if re.search(pat, low)), "other")
