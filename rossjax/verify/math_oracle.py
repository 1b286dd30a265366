"""The strict two-oracle reference policy of PROPEL's Math domain: a generated problem gets a
reference answer only when every attempt of every oracle (two solver models, two attempts each)
gives a final answer and all of them agree under math-verify; the agreed answer becomes the
reference. Otherwise the problem is invalid, with a reason:

  oracle failure       an attempt gave no answer (its request failed), was cut off at max_tokens
                       (its last \\boxed{} may be an intermediate), no \\boxed{} final answer
                       (nor a GSM8K `#### answer` line), an empty one, or one math-verify cannot
                       parse; or math-verify did not decide a pair within its timeout (undecided
                       is not "different", and the first such pair ends the check);
  oracle disagreement  two attempts' answers are not equivalent.

Agreement is checked for every pair, both ways (math-verify is asymmetric: `verify(gold, pred)`),
so "all agree" never rests on a non-transitive chain. The reference is the first oracle's first
answer as written. The oracles' answers come from rossjax.train.propel.solvers.oracle_labels (models,
endpoints or programmatic solvers); this module only judges them. No jax here.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading

from rossjax.verify.answers import Truncated, extract_boxed, extract_gsm8k
from rossjax.verify.math_verifier import _parsed

ATTEMPTS = 2                   # per oracle (the paper's two attempts)
STATUSES = ("agreed", "disagreement", "failure")


@dataclasses.dataclass(frozen=True)
class OracleLabel:
    reference: str | None      # the agreed answer (None unless status == "agreed")
    status: str                # agreed | disagreement | failure
    reason: str                # one sentence
    answers: tuple             # ((final answer or None per attempt) per oracle)

    def as_dict(self) -> dict:
        return {"status": self.status, "reference": self.reference, "reason": self.reason,
                "answers": [list(a) for a in self.answers]}


def final_answer(text: str | None) -> str | None:
    """The final answer of a solver's text: its last \\boxed{}, else its `#### answer` line (none
    for a text cut off at max_tokens)."""
    if text is None or isinstance(text, Truncated):
        return None
    ans = extract_boxed(text)
    if ans is None:
        ans = extract_gsm8k(text)
    return ans.strip() if ans is not None else None


def _equal(verify, gold, pred, t) -> bool | None:
    """math-verify's verdict, None when it timed out (its default answer then is False)."""
    from math_verify.errors import TimeoutException

    try:
        return bool(verify(gold, pred, timeout_seconds=t, raise_on_error=True))
    except TimeoutException:
        return None
    except Exception:  # noqa: BLE001 - an error on one pair of parses: the others still count
        return bool(verify(gold, pred, timeout_seconds=t))


def agree(texts, names=("a", "b"), timeout_s: int = 5) -> OracleLabel:
    """The reference policy over `texts[o][j]`, attempt j of oracle o (None: no answer came;
    answers.Truncated: cut off at max_tokens)."""
    from math_verify import parse, verify

    texts = [list(t) for t in texts]
    if len(texts) < 2 or any(len(t) < 1 for t in texts):
        raise ValueError(f"agree needs at least two oracles with an attempt each, got "
                         f"{[len(t) for t in texts]}")
    names = list(names) + [str(i) for i in range(len(names), len(texts))]
    # math-verify's timeouts use signal.alarm, which only works on a process's main thread
    t = timeout_s if threading.current_thread() is threading.main_thread() else None
    answers = [[final_answer(x) for x in row] for row in texts]
    failures, parsed = [], []
    for o, row in enumerate(texts):
        for j, text in enumerate(row):
            who = f"oracle {names[o]} attempt {j + 1}"
            ans = answers[o][j]
            if text is None:
                failures.append(f"{who} gave no answer (its request failed)")
            elif isinstance(text, Truncated):
                failures.append(f"{who}'s answer was cut off at max_tokens")
            elif ans is None:
                failures.append(f"{who} gave no \\boxed{{}} final answer")
            elif not ans:
                failures.append(f"{who} gave an empty \\boxed{{}}")
            else:
                p = parse(f"\\boxed{{{ans}}}", parsing_timeout=t)
                if not _parsed(p):
                    failures.append(f"{who}'s answer {ans[:60]!r} cannot be parsed by math-verify")
                parsed.append((who, ans, p))
    frozen = tuple(tuple(a) for a in answers)
    if failures:
        return OracleLabel(None, "failure", "oracle failure: " + "; ".join(failures), frozen)
    for (w1, a1, p1), (w2, a2, p2) in itertools.combinations(parsed, 2):
        same = _equal(verify, p1, p2, t) and _equal(verify, p2, p1, t)
        if same is None:
            return OracleLabel(None, "failure", f"oracle failure: math-verify did not decide "
                               f"within {t} s whether {w1}'s {a1[:60]!r} equals {w2}'s "
                               f"{a2[:60]!r}", frozen)
        if not same:
            return OracleLabel(None, "disagreement", f"oracle disagreement: {w1} says "
                               f"{a1[:60]!r}, {w2} says {a2[:60]!r}", frozen)
    n = sum(len(r) for r in texts)
    return OracleLabel(parsed[0][1], "agreed", f"all {n} oracle answers agree on "
                       f"{parsed[0][1][:60]!r}", frozen)
