"""Route families for the routes experiment: several correct strategies for the same problems.

Every family solves the pairs task of tasks.py (one step per pair, then "Answer: ...") with its
own step wording, and the wording carries the cue of a different label of the math step
vocabulary, so the route fingerprints (`rossjax select`) see different label sequences:

    direct   7+5=12                          compute
    check    7+5=12 / check 12-5=7           compute, verify
    rewrite  rewrite 7+5 as 5+7=12           substitute
    case     case 7+5: 12                    case_split
    guess    guess 7+5 is 12                 hypothesize
    let      let x=7+5, x=12                 setup

`family_of` recovers the family of any completion by construction (every step line must match
one family's pattern), so coverage needs no model.
"""

from __future__ import annotations

import re

import numpy as np

from rossjax.repro import tasks

FAMILIES = ("direct", "check", "rewrite", "case", "guess", "let")

_LINE = {
    "direct": re.compile(r"^(\d)\+(\d)=(\d+)$"),
    "check": re.compile(r"^(\d)\+(\d)=(\d+)$|^check (\d+)-(\d)=(\d)$"),
    "rewrite": re.compile(r"^rewrite (\d)\+(\d) as (\d)\+(\d)=(\d+)$"),
    "case": re.compile(r"^case (\d)\+(\d): (\d+)$"),
    "guess": re.compile(r"^guess (\d)\+(\d) is (\d+)$"),
    "let": re.compile(r"^let x=(\d)\+(\d), x=(\d+)$"),
}


def steps(family: str, a: int, b: int) -> list[str]:
    s = a + b
    return {"direct": [f"{a}+{b}={s}"],
            "check": [f"{a}+{b}={s}", f"check {s}-{b}={a}"],
            "rewrite": [f"rewrite {a}+{b} as {b}+{a}={s}"],
            "case": [f"case {a}+{b}: {s}"],
            "guess": [f"guess {a}+{b} is {s}"],
            "let": [f"let x={a}+{b}, x={s}"]}[family]


def trace(family: str, pairs) -> str:
    lines = [ln for a, b in pairs for ln in steps(family, a, b)]
    return "\n".join(lines + [f"Answer: {tasks.answer_of(pairs)}"])


def family_of(text: str) -> str | None:
    """The family whose pattern every step line matches (None: mixed or unrecognized)."""
    lines = [ln for ln in text.strip().split("\n") if ln]
    body = lines[:-1] if lines and lines[-1].startswith("Answer:") else lines
    if not body:
        return None
    for f in ("direct", "rewrite", "case", "guess", "let", "check"):
        if all(_LINE[f].match(ln) for ln in body):
            if f == "check" and not any(ln.startswith("check ") for ln in body):
                continue
            return f
    return None


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
