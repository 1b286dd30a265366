"""The PROPEL experiment's task families, its solver of tunable competence and the
verifier-free heuristic reward. No jax here: GRPO's reward workers import `heuristic_reward`.

Generated tasks follow the AZR protocol of rossjax.verify.induction_task: a program f, 10
inputs, a message; the solver sees 5 input/output pairs plus the message and is scored on the
other 5. Families (constants drawn from 1..15, inputs ten increasing integers in 0..19):

    add   x + a            mul   x * a            aff   a * x + b
    sq    x * x + a        cond  x + a if x > t else x - b

The solver is mostly hasty and bounded: per trial it reads the message to pick the family it
names (when it knows it); with probability `care` it fits all 5 shown pairs, otherwise one of
them at random, and writes one program drawn uniformly from the hypotheses of that family with
constants up to `competence` that fit. Too easy: families one pair pins down (add, mul, sq).
Too hard: `cond`, which it does not know. In between: `aff` tasks, which one pair rarely pins
down, solved in some trials and not others: the learnable band (solved 1 to 3 times in 8).
Truth is known by construction; the probe has to learn it from the frozen model's activations.
"""

from __future__ import annotations

import numpy as np

FAMILIES = {
    "add": ("x + {a}", "add a number"),
    "mul": ("x * {a}", "multiply by a number"),
    "aff": ("{a} * x + {b}", "scale then shift"),
    "sq": ("x * x + {a}", "square then shift"),
    "cond": ("x + {a} if x > {t} else x - {b}", "it depends on x"),
}
KNOWN = ("add", "mul", "aff", "sq")  # the solver's library (it never writes cond)
SOLVER = dict(competence=15, care=0.1)  # the experiment's solver (rossjax.repro.propel)
# The learnable band: solved LO..HI of K trials (1..3 of 8).
K, LO, HI = 8, 1 / 8, 3 / 8
PROMPT = "Write an induction task."


def sample_task(rng: np.random.Generator, family: str | None = None) -> dict:
    fam = family or str(rng.choice(list(FAMILIES)))
    a, b, t = (int(v) for v in rng.integers(1, 16, size=3))
    body = FAMILIES[fam][0].format(a=a, b=b, t=t)
    # Increasing inputs: a small generator keeps them distinct (the validity gate needs
    # distinct outputs) far more reliably than when they come in random order.
    inputs = [str(int(v)) for v in np.sort(rng.choice(20, size=10, replace=False))]
    return {"program": f"def f(x):\n    return {body}", "inputs": inputs,
            "message": FAMILIES[fam][1], "family": fam}


def task_answer(task: dict) -> str:
    """The generator's answer text for a task (the three fenced blocks of the protocol)."""
    return ("```python\n" + task["program"] + "\n```\n```inputs\n" + "\n".join(task["inputs"])
            + "\n```\n```message\n" + task["message"] + "\n```")


def _hypotheses(family: str, c: int):
    r = range(1, c + 1)
    if family == "add":
        return [(lambda x, a=a: x + a, f"x + {a}") for a in r]
    if family == "mul":
        return [(lambda x, a=a: x * a, f"x * {a}") for a in r]
    if family == "aff":
        return [(lambda x, a=a, b=b: a * x + b, f"{a} * x + {b}") for a in r for b in r]
    if family == "sq":
        return [(lambda x, a=a: x * x + a, f"x * x + {a}") for a in r]
    return []


def family_of_message(message: str) -> str | None:
    return next((f for f, (_, m) in FAMILIES.items() if m == message.strip()), None)


class Solver:
    """The hasty solver (module doc). `trials(solver_task, k, rng) -> [bool] * k`, each trial
    judged on the hidden inputs only, against the reference outputs of the protocol's run."""

    def __init__(self, competence: int = 15, care: float = 0.1):
        self.c, self.care = int(competence), float(care)
        self._lib = {f: _hypotheses(f, self.c) for f in KNOWN}

    def picks(self, st: dict, k: int, rng: np.random.Generator) -> list | None:
        """Per trial the (f, text) hypothesis the solver writes, or None when none fits the
        pairs it read; None for a task whose values are not the integers this solver reads."""
        fam = family_of_message(st.get("message", ""))
        lib = self._lib.get(fam) if fam else None
        lib = lib if lib is not None else [h for f in KNOWN for h in self._lib[f]]
        try:
            xs = [int(x) for x in st["inputs"]]
            ys = [int(y) for y in st["visible_outputs"]]
        except (TypeError, ValueError):
            return None
        out = []
        for _ in range(k):
            m = len(xs) if rng.random() < self.care else 1
            idx = rng.choice(len(xs), size=m, replace=False)
            fits = [h for h in lib if all(h[0](xs[i]) == ys[i] for i in idx)]
            out.append(fits[int(rng.integers(len(fits)))] if fits else None)
        return out

    def trials(self, st: dict, k: int, rng: np.random.Generator) -> list[bool]:
        try:
            hx = [int(x) for x in st["hidden_inputs"]]
            hy = [int(y) for y in st["hidden_outputs"]]
        except (TypeError, ValueError):
            return [False] * k  # not the integer tasks this solver reads
        got = self.picks(st, k, rng)
        if got is None:
            return [False] * k
        return [h is not None and all(h[0](x) == y for x, y in zip(hx, hy)) for h in got]


def solver_fn(task: dict, k: int, seed: int) -> list[str]:
    """The same solver as a `reward.solver.kind=fn` (`module:function`) for GRPO's solver-in-
    the-loop reward: K programs for a solver task, which the reward then judges in the sandbox
    on the hidden inputs as it would a model's answers (a trial with no fitting hypothesis
    answers a program that cannot pass). Seeded by the call's seed and the task id."""
    import zlib

    rng = np.random.default_rng([int(seed) % 2**32, zlib.crc32(str(task.get("id")).encode())])
    got = Solver(**SOLVER).picks(task, k, rng) or [None] * k
    return [f"```python\ndef f(x):\n    return {h[1] if h else 'None'}\n```" for h in got]


def heuristic_reward(prompt: str, completion: str, task: dict) -> float:
    """A verifier-free proxy for "a good task": valid under the protocol (-0.2 otherwise, as
    PROPEL's hard gate) and the more operators and constants f has, the better (capped at 1):
    the common "harder looks better" heuristic, blind to what the solver can learn."""
    import ast

    from rossjax.verify.induction_task import check_task, parse_generated_task, protocol_from

    t = parse_generated_task(completion)
    if not check_task(t, protocol_from(task.get("protocol"))).passed:
        return -0.2
    tree = ast.parse(t["program"])
    ops = sum(isinstance(n, (ast.BinOp, ast.Compare, ast.IfExp)) for n in ast.walk(tree))
    consts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
              and isinstance(n.value, int)]
    return min(1.0, 0.25 * ops + 0.02 * sum(abs(v) for v in consts))


def score_tasks(texts: list[str], seed: int, ids=None) -> list[dict]:
    """Per generated text: valid (the protocol's gate), solves in K trials, family."""
    from rossjax.verify import induction_task as it

    solver, rng, out = Solver(**SOLVER), np.random.default_rng(seed), []
    for i, text in enumerate(texts):
        task = it.parse_generated_task(text)
        ok = bool(it.check_task(task).passed)
        st = it.solver_task(task, it.Protocol(), (ids or {}).get(i, f"gen-{i}")) if ok else None
        trials = solver.trials(st, K, rng) if st is not None else []
        fam = family_of_message(task["message"]) if task else None
        out.append({"valid": st is not None, "trials": trials, "solves": int(sum(trials)),
                    "family": fam or "other", "task": task})
    return out
