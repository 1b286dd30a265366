"""The AZR induction-task protocol (PROPEL's function-induction domain), in one place for the
GRPO generator rollout and its validity reward, `rossjax label-corpus`, `rossjax eval-generator`
and what the probe reads.

A generated task is (program f, N = 10 inputs, a natural-language message). The generator writes
three fenced blocks: ```python (defines f), ```inputs (one argument list per line) and
```message (a hint for the solver). It is valid when it has exactly N inputs and a non-empty
message and passes `induction.task_valid` (parses, defines f, nothing banned, deterministic,
every input runs, outputs distinct). The solver is shown n_visible = 5 input/output pairs plus the
message and is scored on the other 5 inputs, which it never saw (`solver_task`), so a solver that
only memorises the pairs it was shown scores 0. Which inputs are shown: `split="first"` (the first
five as written) or `"seeded"` (a shuffle keyed by the task id). No jax here (reward workers).
"""

from __future__ import annotations

import dataclasses
import random

from rossjax.errors import ConfigError
from rossjax.verify.answers import _FENCE
from rossjax.verify.induction import BANNED_CALLS, BANNED_MODULES, _run_f, task_valid
from rossjax.verify.verdict import Verdict

SPLITS = ("first", "seeded")


@dataclasses.dataclass(frozen=True)
class Protocol:
    n_inputs: int = 10     # inputs per generated task
    n_visible: int = 5     # shown to the solver with their outputs; the rest are hidden
    split: str = "first"   # first | seeded (shuffle keyed by the task id)

    def __post_init__(self):
        if not 0 < self.n_visible < self.n_inputs:
            raise ConfigError(f"induction protocol: n_visible {self.n_visible} must lie strictly "
                              f"between 0 and n_inputs {self.n_inputs}.")
        if self.split not in SPLITS:
            raise ConfigError(f"induction protocol: split {self.split!r} is not one of {SPLITS}.")


def protocol_from(section) -> Protocol:
    """A Protocol from a config section with n_inputs / n_visible / split (any may be missing)."""
    d = dict(section) if section is not None else {}
    return Protocol(**{k: d[k] for k in ("n_inputs", "n_visible", "split") if k in d})


SEED_PROGRAM = "def f(a):\n    return a"  # AZR's seed: the identity function
SEED_INPUTS = ("'Hello World'", "[1, 2, 3]", "7")


def _shown(t: dict, n: int) -> str:
    return ("```python\n" + t["program"].rstrip("\n") + "\n```\n```inputs\n"
            + "\n".join(list(t["inputs"])[:n]) + "\n```\n```message\n" + t["message"] + "\n```")


def generator_prompt(p: Protocol = Protocol(), examples: list[dict] | None = None) -> str:
    """The generator's prompt. Without `examples`: one fixed instruction. With them (the paper's
    context, AZR-style): the task, the code requirements with the banned imports and calls
    (`task_valid` refuses them), the seed function and the reference tasks (pool rows, each
    shown with at most n_inputs inputs)."""
    if examples:
        refs = "\n\n".join(f"Reference {i}:\n{_shown(t, p.n_inputs)}"
                            for i, t in enumerate(examples, 1))
        seed = _shown({"program": SEED_PROGRAM, "inputs": SEED_INPUTS,
                       "message": "the output is the input"}, p.n_inputs)
        return (
            "## Task: write a new function-induction task\n"
            "Design a Python function f, new and different from the reference tasks below, that "
            "takes real reasoning to recover from examples. Give f in a ```python block, then "
            f"exactly {p.n_inputs} different inputs in an ```inputs block (one argument list per "
            "line, e.g. [1, 2], 'a'), then a short hint for the solver in a ```message block. A "
            f"solver will see {p.n_visible} of the inputs with their outputs and the hint, and "
            f"must write an f that also gets the other {p.n_inputs - p.n_visible} right.\n\n"
            "### Code requirements\n"
            "- name the entry function f; it takes at least one argument and returns a value\n"
            "- deterministic: no randomness, dates or times, I/O, printing or outside state; it "
            "finishes in well under a second\n"
            "- every input gives a different output\n"
            f"- do not import or use these modules: {', '.join(BANNED_MODULES)}\n"
            f"- do not call: {', '.join(BANNED_CALLS)}\n\n"
            "### Input requirements\n"
            "- each line is f's arguments as Python literals (numbers, strings, lists, tuples, "
            "dicts), nothing that needs f's code to build\n"
            "- varied: together they exercise every branch of f, edge cases included, so the "
            "shown half does not admit a simpler f that fails the hidden half\n\n"
            "### Message requirements\n"
            "- a short natural-language clue about what f does, that does not give away its "
            "code or any output\n\n"
            "### Output format\n"
            "The ```python block, then the ```inputs block, then the ```message block, nothing "
            "else.\n\n"
            f"### Seed function\n{seed}\n\n### Reference tasks\n{refs}")
    return (f"Write a function-induction task. Give a Python function f in a ```python block, then "
            f"exactly {p.n_inputs} different test inputs in an ```inputs block, one argument list "
            "per line, e.g. [1, 2], 'a', then a short hint for the solver in a ```message block. "
            f"A solver will see {p.n_visible} of the inputs with their outputs and the hint, and "
            f"must write an f that also gets the other {p.n_inputs - p.n_visible} right. Make the "
            "task hard but solvable.")


def parse_generated_task(text: str) -> dict | None:
    """{program, inputs, message} from a generator's answer (first block of each kind), or None
    without a ```python and an ```inputs block. A missing message parses as "" (check_task
    rejects it)."""
    found = {}
    for lang, body in _FENCE.findall(text or ""):
        kind = {"python": "program", "py": "program", "inputs": "inputs",
                "message": "message"}.get(lang.lower())
        if kind and kind not in found:
            found[kind] = body
    if "program" not in found or "inputs" not in found:
        return None
    inputs = [ln.strip() for ln in found["inputs"].splitlines() if ln.strip()]
    if not inputs:
        return None
    return {"program": found["program"], "inputs": inputs,
            "message": found.get("message", "").strip()}


def check_task(task: dict | None, p: Protocol = Protocol()) -> Verdict:
    """The validity gate W of a generated task under the protocol."""
    if task is None:
        return Verdict(False, "no ```python and ```inputs blocks")
    n = len(task.get("inputs") or ())
    if n != p.n_inputs:
        return Verdict(False, f"the task has {n} inputs; the protocol needs exactly {p.n_inputs}")
    if not (task.get("message") or "").strip():
        return Verdict(False, "the task has no ```message block for the solver")
    return task_valid(task)


def split_inputs(task: dict, p: Protocol = Protocol(), key: str = "") -> tuple[list, list]:
    """(visible, hidden) inputs of a task; `key` (the task id) seeds the "seeded" split."""
    inputs = list(task["inputs"])
    order = list(range(len(inputs)))
    if p.split == "seeded":
        random.Random(f"induction-split:{key}").shuffle(order)
    vis = sorted(order[:p.n_visible])
    hid = sorted(order[p.n_visible:])
    return [inputs[i] for i in vis], [inputs[i] for i in hid]


def solver_prompt(message: str, inputs: list[str], shown: list[str]) -> str:
    pairs = "\n".join(f"f({i}) = {o}" for i, o in zip(inputs, shown))
    return ("Find the Python function f that matches these input/output pairs and the hint, and "
            "write it in a ```python block. It will be tested on other inputs.\n"
            f"Hint: {message}\n{pairs}")


def solver_task(task: dict, p: Protocol = Protocol(), task_id: str = "task") -> dict | None:
    """The solver's task object for a valid generated task: visible inputs with their shown
    outputs, the message, the prompt, and the hidden inputs with their reference outputs
    (canonical). None when the reference run fails."""
    visible, hidden = split_inputs(task, p, task_id)
    ran, _ = _run_f(task["program"], visible + hidden, 4.0, shown=True)
    if ran is None or not all(r[0] for r in ran):
        return None
    shown = [r[2] for r in ran[:len(visible)]]
    return {"id": task_id, "domain": "induction", "program": task["program"], "inputs": visible,
            "visible_outputs": shown, "message": task.get("message", ""),
            "hidden_inputs": hidden, "hidden_outputs": [r[1] for r in ran[len(visible):]],
            "prompt": solver_prompt(task.get("message", ""), visible, shown)}


def task_text(task: dict) -> str:
    """The generated task in canonical form: what the probe reads (as a user turn) in GRPO and
    in the stores `rossjax label-corpus` prepares, so both see the same text for the same task."""
    return ("```python\n" + task["program"].rstrip("\n") + "\n```\n```inputs\n"
            + "\n".join(task["inputs"]) + "\n```\n```message\n" + (task.get("message") or "")
            + "\n```")


def lookup_answer(task: dict) -> str:
    """A solver that never infers f: a table of the visible pairs (KeyError elsewhere). Under
    the protocol it scores 0; it is the check that hidden inputs really are hidden."""
    rows = ", ".join(f"({i},): {o}" for i, o in zip(task["inputs"], task["visible_outputs"]))
    return f"```python\n_T = {{{rows}}}\ndef f(*a):\n    return _T[a]\n```"
