"""`math` verifier: answer equivalence with the math-verify package.

Gold is `task.reference`, prediction the last `\\boxed{}` of the last assistant message, else its
GSM8K-style `#### 42` line; a reference that is a GSM8K solution (text ending in `#### 42`)
gives its `####` answer as the gold (answers.extract_gsm8k). math-verify
is asymmetric, so the gold goes first. Its timeouts use `signal.alarm`, which only works in a
process's main thread: `verify_many` runs verifiers in worker processes' main threads; called
from another thread this verifier runs without timeouts (and says so in the evidence).
A gold answer that math-verify cannot parse gives `passed=None`: the data is unjudgeable, not
the rollout wrong. Known math-verify false positives/negatives (see its issues #14, #60, #64)
are inherited.
"""

from __future__ import annotations

import threading

from rossjax.verify.answers import extract_boxed, extract_gsm8k, last_assistant_content
from rossjax.verify.verdict import Verdict


def _parsed(items) -> bool:
    # parse() returns [sympy_expr, source_str] on success; only strings means it failed.
    return any(not isinstance(x, str) for x in items)


def verify(record: dict, timeout_s: int = 5) -> Verdict:
    from math_verify import parse, verify as mv_verify

    task = record.get("task") or {}
    ref = task.get("reference")
    if ref is None or str(ref).strip() == "":
        return Verdict(None, "task.reference (the gold answer) is missing")
    main = threading.current_thread() is threading.main_thread()
    t = timeout_s if main else None
    ref = str(ref)
    if "####" in ref:  # a GSM8K worked solution: its final answer line is the gold
        ref = extract_gsm8k(ref) or ref
    gold = parse(f"\\boxed{{{ref}}}", parsing_timeout=t)
    if not _parsed(gold):
        return Verdict(None, f"math-verify cannot parse the gold answer {str(ref)[:80]!r}")
    content = last_assistant_content(record)
    if content is None:
        return Verdict(False, "no assistant message with content")
    boxed = extract_boxed(content)
    if boxed is None:
        boxed = extract_gsm8k(content)
    if boxed is None:
        return Verdict(False, "no \\boxed{} answer (or GSM8K `#### answer` line) in the last "
                              "assistant message")
    pred = parse(f"\\boxed{{{boxed}}}", parsing_timeout=t)
    if not _parsed(pred):
        return Verdict(False, f"cannot parse the answer {boxed[:80]!r}")
    ok = bool(mv_verify(gold, pred, timeout_seconds=t))
    note = "" if main else " (no timeout: not on a main thread)"
    return Verdict(ok, f"{'equivalent' if ok else 'not equivalent'}: gold {str(ref)[:60]!r}, "
                       f"answer {boxed[:60]!r}{note}")
