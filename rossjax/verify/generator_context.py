"""What PROPEL's generators are prompted with: in-context examples drawn from a pool file, seeded
per task, for Math (two example problems) and AZR induction (the seed function, reference tasks
and the banned-import list; rossjax/verify/induction_task.py writes that prompt).

Pools are JSONL files, one example a row: Math rows {"id", "problem"} (other fields are kept:
answer, topic), AZR rows {"id", "program", "inputs", "message"} (the task's canonical blocks).
The shipped pools live in data/propel/ (original problems and tasks written for rossjax);
`examples=PATH` in the config section uses a file of the user's. Which examples a task gets
depends only on (seed, task index): a resumed run, `rossjax eval-generator` and GRPO draw the
same ones for the same index. `kind="instruction"` is the older single fixed instruction.
No jax here (reward workers).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import random
import re

from rossjax.errors import ConfigError, InputError

KINDS = ("paper", "instruction")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
POOLS = {"math": "math_examples.jsonl", "induction": "azr_examples.jsonl"}


def shipped_pool(domain: str) -> str:
    """Path of the shipped example pool of a domain (the package's data/propel/, else the
    checkout's)."""
    shipped = importlib.resources.files("rossjax") / "data" / "propel" / POOLS[domain]
    if shipped.is_file():
        return os.path.realpath(str(shipped))
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(here, "data", "propel", POOLS[domain])


def _check_row(obj, domain: str, where: str) -> str | None:
    """One sentence on what is wrong with a pool row, or None."""
    if not isinstance(obj, dict):
        return f"{where}: the row is not a JSON object"
    if not isinstance(obj.get("id"), str) or not obj["id"]:
        return f"{where}: field 'id' is missing or not a non-empty string"
    for key, v in obj.items():  # json's "\\ud800" is no character: no tokenizer takes it
        if isinstance(v, str) and _LONE_SURROGATE.search(v):
            return f"{where}: field {key!r} holds a lone UTF-16 surrogate, which is not a character"
    if domain == "math":
        from rossjax.verify.math_task import check_problem

        if not isinstance(obj.get("problem"), str) or not obj["problem"].strip():
            return f"{where}: field 'problem' is missing or empty"
        if "```" in obj["problem"]:
            return f"{where}: field 'problem' holds ```, which would end its ```problem block"
        v = check_problem({"problem": obj["problem"]})  # the generator imitates what it is shown
        return None if v.passed else f"{where}: field 'problem' is not a valid problem: {v.evidence}"
    for key in ("program", "message"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            return f"{where}: field {key!r} is missing or empty"
    inputs = obj.get("inputs")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(x, str) for x in inputs):
        return f"{where}: field 'inputs' must be a non-empty list of argument strings"
    return None


def load_pool(path: str, domain: str, field: str) -> list[dict]:
    """The example rows of a pool file; a bad row is one sentence naming file, row and field."""
    if domain not in POOLS:
        raise ConfigError(f"{field}: no example pool for domain {domain!r} (one of "
                          f"{', '.join(POOLS)}).")
    if not os.path.isfile(path):
        raise ConfigError(f"{field} is {path!r}, which is not a file.")
    rows, seen = [], set()
    with open(path, encoding="utf-8", errors="replace") as f:  # verify may not import curate
        lines = [(n, ln) for n, ln in enumerate(f, 1) if ln.strip()]
    for n, line in lines:
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise InputError(f"{path} row {n}: not JSON ({e}) ({field}).") from None
        bad = _check_row(obj, domain, f"{path} row {n}")
        if bad:
            raise InputError(f"{bad} ({field}).")
        if obj["id"] in seen:
            raise InputError(f"{path} row {n}: field 'id' {obj['id']!r} repeats an earlier row "
                             f"({field}).")
        seen.add(obj["id"])
        rows.append(obj)
    if not rows:
        raise InputError(f"{path}: the example pool has no rows ({field}).")
    return rows


@dataclasses.dataclass
class Context:
    """A domain's generator context: `examples(index)` are the pool rows task `index` is shown."""
    domain: str
    kind: str = "paper"
    pool: list = dataclasses.field(default_factory=list)
    n_examples: int = 2
    seed: int = 0

    def examples(self, index: int) -> list[dict]:
        if self.kind != "paper":
            return []
        # a string seed: Python's str hashing is salted per process, random.Random(str) is not
        rng = random.Random(f"propel-context:{self.domain}:{self.seed}:{index}")
        return rng.sample(self.pool, self.n_examples)


def context_from(section, domain: str, seed: int = 0, field: str = "config.data",
                 default_kind: str = "paper") -> Context:
    """A Context from a config section with `context` (paper | instruction), `examples` (a pool
    path; "" = the shipped pool) and `n_examples`; any may be missing."""
    d = dict(section) if section is not None else {}
    kind = d.get("context", default_kind)
    if kind not in KINDS:
        raise ConfigError(f"{field}.context {kind!r} is not one of {', '.join(KINDS)}.")
    if kind == "instruction":
        return Context(domain, kind, [], 0, int(seed))
    n = d.get("n_examples", 2)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"{field}.n_examples is {n!r}; it must be an integer of at least 1.")
    path = d.get("examples") or shipped_pool(domain)
    pool = load_pool(path, domain, f"{field}.examples")
    if n > len(pool):
        raise ConfigError(f"{field}.n_examples is {n} but the pool {path} has {len(pool)} "
                          f"examples.")
    return Context(domain, kind, pool, n, int(seed))
