"""The ROSS experiment's task family, its noisy policy, programmatic reviewer and graders.

Task: add several pairs of digits, "7+5 8+3 4+6", one trace line per pair, then the results:

    7+5=12
    8+3=11
    4+6=10
    Answer: 12 11 10

The noisy policy (the "historical RL policy") has one systematic flaw: on a pair whose sum
reaches 10 it forgets the carry with probability `forget` and writes the sum minus 10. After a
planted error it recovers with probability `recover` on the next line ("wait, 7+5=12") and goes
on; otherwise the wrong value stays, and with probability `lucky` the answer line still states
the right results (the verifier passes a trace a careful reviewer would reject). A clean
teacher (forget=0) writes the warm-up data. Truth is known by construction: every
planted line is recorded, so the reviewer and the graders need no model.
"""

from __future__ import annotations

import re

import numpy as np

RECOVERY = "wait, "
_STEP = re.compile(r"^(?:wait, )?(\d)\+(\d)=(\d+)$")
_ANSWER = re.compile(r"^Answer: ([\d ]+)$")


def problem(rng: np.random.Generator, n_pairs: int) -> tuple[tuple[int, int], ...]:
    return tuple((int(a), int(b)) for a, b in rng.integers(1, 10, size=(n_pairs, 2)))


def prompt_text(pairs) -> str:
    return " ".join(f"{a}+{b}" for a, b in pairs)


def answer_of(pairs) -> str:
    return " ".join(str(a + b) for a, b in pairs)


def problem_split(n_pairs: int, sizes, seed: int):
    """Disjoint problem sets of the given sizes (held-out problems never appear in training)."""
    rng = np.random.default_rng(seed)
    if sum(sizes) > 81 ** n_pairs // 2:
        raise ValueError(f"{sum(sizes)} problems of {n_pairs} pairs: too few distinct ones.")
    seen: dict = {}
    while len(seen) < sum(sizes):
        seen.setdefault(problem(rng, n_pairs), None)
    probs, out = list(seen), []
    for n in sizes:
        out.append(probs[:n])
        probs = probs[n:]
    return out


def clean_trace(pairs) -> str:
    """The clean teacher's trace (the `direct` route)."""
    return "\n".join([f"{a}+{b}={a + b}" for a, b in pairs] + [f"Answer: {answer_of(pairs)}"])


def noisy_trace(rng: np.random.Generator, pairs, forget: float, recover: float, lucky: float):
    """(text, planted, recovered, answer_ok): the noisy policy's trace for one problem.

    `planted` are 1-based line numbers of forgotten-carry lines; `recovered` says whether each
    was followed by a recovery line.
    """
    lines, planted, recovered, results = [], [], [], []
    for a, b in pairs:
        if a + b >= 10 and rng.random() < forget:
            lines.append(f"{a}+{b}={a + b - 10}")
            planted.append(len(lines))
            ok = rng.random() < recover
            recovered.append(ok)
            if ok:
                lines.append(f"{RECOVERY}{a}+{b}={a + b}")
            results.append(a + b if ok else a + b - 10)
        else:
            lines.append(f"{a}+{b}={a + b}")
            results.append(a + b)
    answer = " ".join(map(str, results))
    if answer != answer_of(pairs) and rng.random() < lucky:
        answer = answer_of(pairs)
    lines.append(f"Answer: {answer}")
    return "\n".join(lines), planted, recovered, answer == answer_of(pairs)


def rollout_record(i: int, p, text: str, planted, recovered, step: int, run: str) -> dict:
    """A rollout in the project's record format, verified by `grade` and reviewed by `review`."""
    messages = [{"role": "user", "content": prompt_text(p)},
                {"role": "assistant", "content": text}]
    passed = grade(p, text)["correct"]
    rec = {"id": f"{run}-{i}", "task": {"id": "pairs-" + prompt_text(p).replace(" ", "_"),
                                        "domain": "math", "prompt": prompt_text(p),
                                        "reference": answer_of(p)},
           "source": {"run": run, "step": int(step)},
           "messages": messages, "reward": 1.0 if passed else 0.0,
           "verifier": {"name": "repro_sum", "passed": passed,
                        "evidence": f"answer {'matches' if passed else 'differs from'} "
                                    f"{answer_of(p)}"}}
    if passed:  # the reviewer only sees verifier-positive rollouts
        rec["annotation"] = review(planted, recovered)
    return rec


def review(planted, recovered) -> dict:
    """The programmatic reviewer: it knows where the planted errors are.

    Clean trace -> accept. Every error recovered -> revise, excluding each wrong line (exclude
    selectors on the assistant message, the format an LLM reviewer writes for line-level
    errors). An unrecovered error (right answer for a wrong reason) -> drop.
    """
    if not planted:
        return {"status": "accept"}
    if not all(recovered):
        return {"status": "drop"}
    return {"status": "revise",
            "exclude": [{"message": 1, "line": ln} for ln in planted]}


def grade(pairs, text: str) -> dict:
    """Verifier and error detectors for one completion.

    correct: the last line is "Answer: <the sums>"; sums_correct: the fraction of the sums the
    answer line gets right (position by position). planted (the error-imitation signal): a line
    writes a forgotten carry (the sum minus 10), the noisy policy's signature error. recovery: a
    "wait, " line (not an error: ROSS keeps recoveries, conditioned on the error before them).
    wrong_step: any step line with wrong arithmetic.
    """
    lines = [ln for ln in text.strip().split("\n") if ln]
    m = _ANSWER.match(lines[-1]) if lines else None
    correct = bool(m) and m.group(1).strip() == answer_of(pairs)
    got = m.group(1).split() if m else []
    sums_correct = sum(g == str(a + b) for g, (a, b) in zip(got, pairs)) / len(pairs)
    planted = wrong = recovery = False
    for ln in lines[:-1] if m else lines:
        s = _STEP.match(ln)
        recovery |= ln.startswith(RECOVERY)
        if not s:
            continue
        a, b, c = int(s.group(1)), int(s.group(2)), int(s.group(3))
        if c != a + b:
            wrong = True
            planted |= a + b >= 10 and c == a + b - 10
    return {"correct": correct, "sums_correct": sums_correct, "planted": planted,
            "recovery": recovery, "wrong_step": wrong}
