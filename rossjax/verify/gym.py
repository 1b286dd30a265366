"""`gym:<dataset>` verifiers: reasoning-gym's own `score_answer` for that dataset.

The entry scored against is `task.entry` (the reasoning-gym item: question, answer, metadata) or,
without it, {question: task.prompt, answer: task.reference, metadata: task.metadata}. The answer
is the last `<answer>...</answer>` of the last assistant message (reasoning-gym's format), else its
last `\\boxed{}`. Passed means a full score (>= 1.0); partial credit is reported in the evidence.
"""

from __future__ import annotations

from rossjax.errors import InputError
from rossjax.verify.answers import extract_boxed, extract_tag, last_assistant_content
from rossjax.verify.verdict import Verdict, Verifier


def make_verifier(dataset: str) -> Verifier:
    import reasoning_gym

    try:
        score = reasoning_gym.get_score_answer_fn(dataset)
    except ValueError:
        raise InputError(f"verifier 'gym:{dataset}': reasoning-gym has no dataset {dataset!r}") from None

    def verify(record: dict) -> Verdict:
        task = record.get("task") or {}
        entry = task.get("entry") or {"question": task.get("prompt", ""),
                                      "answer": task.get("reference"),
                                      "metadata": task.get("metadata") or {}}
        content = last_assistant_content(record)
        answer = None if content is None else (extract_tag(content) or extract_boxed(content))
        if answer is None:
            return Verdict(False, "no <answer> tag or \\boxed{} in the last assistant message")
        try:
            s = float(score(answer, entry))
        except Exception as e:  # a dataset scorer choking on the entry is not the rollout's fault
            return Verdict(None, f"gym:{dataset} score_answer raised {type(e).__name__}: {e}"[:300])
        return Verdict(s >= 1.0, f"gym:{dataset} score {s:g} for answer {answer[:60]!r}")

    verify.__name__ = f"gym_{dataset}"
    return verify
