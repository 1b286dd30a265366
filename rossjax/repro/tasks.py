"""The ROSS experiment's task family, its noisy policy, programmatic reviewer and graders.

Task: add labelled pairs of digits, "a:7+5 b:8+3", one trace line per pair:

    a:7+5=12
    b:8+3=11

(The labels let a line find its pair by content: without them a small model reads pair k at a
fixed offset, which every inserted recovery line breaks.)

The verifier checks outcomes only: each pair's last written value (a line restating the same
pair replaces the one before it) must be its sum.

The noisy policy (the "historical RL policy") has one systematic flaw: on a pair whose sum
reaches 10 it forgets the carry with probability `forget` and writes the sum minus 10. After a
planted error it recovers with probability `recover` on the next line ("wait, a:7+5=12");
otherwise, with probability `lucky`, it silently writes the pair again with the right sum (the
verifier passes a trace that contradicts itself, which a careful reviewer drops), else the wrong
value stands and the verifier fails the rollout. A clean teacher (forget=0) writes the warm-up
data. Truth is known by construction: every planted line is recorded, so the reviewer and the
graders need no model.
"""

from __future__ import annotations

import re

import numpy as np

RECOVERY = "wait, "
_STEP = re.compile(r"^(?:wait, )?([a-z]):(\d)\+(\d)=(\d+)$")
LABELS = "abcdefgh"


def problem(rng: np.random.Generator, n_pairs: int) -> tuple[tuple[int, int], ...]:
    return tuple((int(a), int(b)) for a, b in rng.integers(1, 10, size=(n_pairs, 2)))


def prompt_text(pairs) -> str:
    return " ".join(f"{LABELS[k]}:{a}+{b}" for k, (a, b) in enumerate(pairs))


def answer_of(pairs) -> str:
    return " ".join(str(a + b) for a, b in pairs)


def problem_split(n_pairs: int, sizes, seed: int):
    """Disjoint problem sets of the given sizes (held-out problems never appear in training)."""
    rng = np.random.default_rng(seed)
    if sum(sizes) > 81 ** n_pairs * 3 // 4:
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
    return "\n".join(f"{LABELS[k]}:{a}+{b}={a + b}" for k, (a, b) in enumerate(pairs))


def noisy_trace(rng: np.random.Generator, pairs, forget: float, recover: float, lucky: float):
    """(text, planted, recovered, passed): the noisy policy's trace for one problem.

    `planted` are 1-based line numbers of forgotten-carry lines; `recovered` says whether each
    was followed by a recovery line.
    """
    lines, planted, recovered = [], [], []
    for k, (a, b) in enumerate(pairs):
        lab = LABELS[k]
        if a + b >= 10 and rng.random() < forget:
            lines.append(f"{lab}:{a}+{b}={a + b - 10}")
            planted.append(len(lines))
            ok = rng.random() < recover
            recovered.append(ok)
            if ok:
                lines.append(f"{RECOVERY}{lab}:{a}+{b}={a + b}")
            elif rng.random() < lucky:
                lines.append(f"{lab}:{a}+{b}={a + b}")
        else:
            lines.append(f"{lab}:{a}+{b}={a + b}")
    text = "\n".join(lines)
    return text, planted, recovered, grade(pairs, text)["correct"]


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
        rec["annotation"] = review(text, planted, recovered)
    return rec


def review(text: str, planted, recovered) -> dict:
    """The programmatic reviewer: it knows where the planted errors are.

    Clean trace -> accept. Every error recovered -> revise, with keep anchors (the format single-
    turn rollouts get from `rossjax review`) around the runs of good lines, so each wrong line and
    the line break that ends it are left out: that break is the token that closes the wrong
    value, and supervising it teaches the error. An error never acknowledged (a silent rewrite
    the verifier passed) -> drop.
    """
    if not planted:
        return {"status": "accept"}
    if not all(recovered):
        return {"status": "drop"}
    lines, keep, run = text.split("\n"), [], []
    for ln, line in enumerate(lines, 1):
        if ln not in planted:
            run.append(line)
        if run and (ln in planted or ln == len(lines)):
            # A run before a wrong line keeps its own closing line break.
            keep.append({"message": 1, "start": run[0],
                         "end": run[-1] + ("\n" if ln in planted else "")})
            run = []
    return {"status": "revise", "keep": keep}


def grade(pairs, text: str) -> dict:
    """Verifier and error detectors for one completion.

    correct (the verifier): the trace works the pairs in order and each pair's last written
    value is its sum (a line restating the pair's label replaces the one before it; nothing
    else may follow). planted (the error-imitation signal): a line writes a forgotten carry (the sum
    minus 10), the noisy policy's signature error. recovery: a "wait, " line (not an error:
    ROSS keeps recoveries, conditioned on the error before them). wrong_step: any line with
    wrong arithmetic. pairs_correct: the fraction of pairs whose last value is right.
    """
    planted = wrong = recovery = junk = False
    worked: list = []
    for ln in (ln for ln in text.strip().split("\n") if ln):
        s = _STEP.match(ln)
        recovery |= ln.startswith(RECOVERY)
        if not s:
            junk = True
            continue
        lab, a, b, c = s.group(1), int(s.group(2)), int(s.group(3)), int(s.group(4))
        if worked and worked[-1][0] == lab:
            worked[-1] = (lab, a, b, c)
        else:
            worked.append((lab, a, b, c))
        if c != a + b:
            wrong = True
            planted |= a + b >= 10 and c == a + b - 10
    want = [(LABELS[k], a, b, a + b) for k, (a, b) in enumerate(pairs)]
    right = sum(w == x for w, x in zip(worked, want))
    return {"correct": worked == want and not junk, "pairs_correct": right / len(pairs),
            "planted": planted, "recovery": recovery, "wrong_step": wrong}
