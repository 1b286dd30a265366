"""Route families for the routes experiment: several correct strategies for the same problems.

Every family solves the pairs task of tasks.py (one step per pair) with its own step wording,
and the wording carries the cue of a different label of the math step
vocabulary, so the route fingerprints (`rossjax select`) see different label sequences:

    direct   a:7+5=12                        compute
    check    a:7+5=12 / check a:12-5=7       compute, verify
    rewrite  rewrite a:7+5 as 5+7=12         substitute
    case     case a:7+5: 12                  case_split
    guess    guess a:7+5 is 12               hypothesize
    let      let a:x=7+5, x=12               setup

`family_of` recovers the family of any completion by construction (every line must match one
family's pattern) and `correct` checks its values, so coverage needs no model.
"""

from __future__ import annotations

import re

import numpy as np

from rossjax.repro import tasks

FAMILIES = ("direct", "check", "rewrite", "case", "guess", "let")
# The route mix of the pool and of the warm-up teachers: one dominant route, five minor ones.
SHARES = {"direct": 0.6, "check": 0.08, "rewrite": 0.08, "case": 0.08, "guess": 0.08, "let": 0.08}

_L = r"([a-z]):"
_LINE = {
    "direct": re.compile(rf"^{_L}(\d)\+(\d)=(\d+)$"),
    "check": re.compile(rf"^{_L}(\d)\+(\d)=(\d+)$|^check {_L}(\d+)-(\d)=(\d)$"),
    "rewrite": re.compile(rf"^rewrite {_L}(\d)\+(\d) as (\d)\+(\d)=(\d+)$"),
    "case": re.compile(rf"^case {_L}(\d)\+(\d): (\d+)$"),
    "guess": re.compile(rf"^guess {_L}(\d)\+(\d) is (\d+)$"),
    "let": re.compile(rf"^let {_L}x=(\d)\+(\d), x=(\d+)$"),
}


def steps(family: str, k: str, a: int, b: int) -> list[str]:
    s = a + b
    return {"direct": [f"{k}:{a}+{b}={s}"],
            "check": [f"{k}:{a}+{b}={s}", f"check {k}:{s}-{b}={a}"],
            "rewrite": [f"rewrite {k}:{a}+{b} as {b}+{a}={s}"],
            "case": [f"case {k}:{a}+{b}: {s}"],
            "guess": [f"guess {k}:{a}+{b} is {s}"],
            "let": [f"let {k}:x={a}+{b}, x={s}"]}[family]


def trace(family: str, pairs) -> str:
    return "\n".join(ln for k, (a, b) in enumerate(pairs)
                     for ln in steps(family, tasks.LABELS[k], a, b))


def _values(family: str, lines: list[str]):
    """[(label, a, b, value)] a family's lines state, or None when a line is not of the family."""
    out = []
    for ln in lines:
        m = _LINE[family].match(ln)
        if not m:
            return None
        raw = [x for x in m.groups() if x is not None]
        lab, g = raw[0], [int(x) for x in raw[1:]]
        if family == "check" and ln.startswith("check "):
            if not out or (lab, g[0], g[1], g[2]) != (out[-1][0], out[-1][3], out[-1][2],
                                                      out[-1][1]):
                return None  # a check must restate the line before it
            continue
        ok = family != "rewrite" or (g[2], g[3]) == (g[1], g[0])
        out.append((lab, g[0], g[1], g[-1] if ok else -1))
    return out


def family_of(text: str) -> str | None:
    """The family whose pattern every line matches (None: mixed or unrecognized)."""
    lines = [ln for ln in text.strip().split("\n") if ln]
    if not lines:
        return None
    for f in ("direct", "rewrite", "case", "guess", "let", "check"):
        if _values(f, lines) is not None:
            if f == "check" and not any(ln.startswith("check ") for ln in lines):
                continue
            return f
    return None


def correct(pairs, text: str) -> bool:
    """The completion is one family's route and states every pair's right sum, in order."""
    f = family_of(text)
    lines = [ln for ln in text.strip().split("\n") if ln]
    return f is not None and _values(f, lines) == [(tasks.LABELS[k], a, b, a + b)
                                                   for k, (a, b) in enumerate(pairs)]


def pool(problems, per_problem: int, shares: dict, seed: int) -> list[dict]:
    """Verified solutions: `per_problem` per problem, each family drawn with its `shares`."""
    rng = np.random.default_rng(seed)
    names = list(shares)
    p = np.asarray([shares[n] for n in names], np.float64)
    rows = []
    for i, pr in enumerate(problems):
        fams = rng.choice(len(names), size=per_problem, p=p)
        for j, f in enumerate(fams):
            text = trace(names[f], pr)
            rows.append({
                "id": f"route-{i}-{j}",
                "task": {"id": "pairs-" + tasks.prompt_text(pr).replace(" ", "_"), "domain": "math",
                         "prompt": tasks.prompt_text(pr), "reference": tasks.answer_of(pr)},
                "source": {"run": "repro-route-pool", "step": 0, "family": names[f]},
                "messages": [{"role": "user", "content": tasks.prompt_text(pr)},
                             {"role": "assistant", "content": text}],
                "reward": 1.0,
                "verifier": {"name": "repro_pairs", "passed": True, "evidence": "answer matches"}})
    return rows
