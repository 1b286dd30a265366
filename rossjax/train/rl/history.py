"""The rollout history of an RL run: every sampled candidate of every step, as rollout records.

    WORKDIR/history.jsonl      one rollout record (docs/data.md) per line, appended each step

This is exactly what the ROSS relearning stage reads later. The rows are verifier-scored but not
reviewed, so they are relearned as `positive_sft` rows:
    rossjax curate --config=configs/curate.py --config.input=WORKDIR/history.jsonl \
        --config.rows=verifier_positive --config.mask_mode=eligible \
        --config.tokenizer=<the run's tokenizer> --config.output=DIR
accepts it unchanged (stored token ids, verdicts under `verifier`, `source.step`). A record also
carries fields curate ignores: `logprobs` (the sampler's per-token log-probs of the completion),
`rewards` (each reward function's value) and `source.sample/finish_reason/prompt_tokens`.

Every record carries a verdict from its reward, so curate relearns a run with any reward (a
custom `reward.fn`, a probe, a weighted mix): `verifier.passed` is reward >= reward.success_threshold
(null when the reward is NaN), its evidence names the reward functions and the first verifier's
own evidence; when the verifier is the only reward, the verdict keeps that verifier's name
(math, code, ...) so `--config.verify=rerun` can run it again, else its name is `grpo_reward`.

A reward that could not be computed (NaN) is written as null: JSON has no NaN and the record
schema rejects it. Checkpoints store the file's byte size; a resumed run cuts the file back to
it, so steps redone after a crash are not recorded twice.
"""

from __future__ import annotations

import json
import math

from rossjax.monitor import RunFile


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def reward_verdict(reward: float, verdicts: list, functions, threshold: float) -> dict:
    """The record's verdict from its total reward (module doc); `verdicts` are the verdict dicts
    the CPU rewards returned for it (verifier, contains, validity), maybe none."""
    functions = tuple(functions)
    verdicts = [v for v in verdicts if v]
    # the only reward is a verifier's (or an agent env's, "env"): its verdict keeps its name
    name = verdicts[0]["name"] if functions in (("verifier",), ("env",)) and verdicts \
        else "grpo_reward"
    if reward is None or not math.isfinite(reward):
        passed, why = None, "the reward could not be computed (NaN)"
    else:
        passed = bool(reward >= threshold)
        why = (f"reward {reward:.4g} {'>=' if passed else '<'} reward.success_threshold "
               f"{threshold:g} ({' + '.join(functions)})")
    if verdicts:
        why += f"; {verdicts[0]['name']}: {verdicts[0].get('evidence', '')}"
    return {"name": name, "passed": passed, "evidence": why[:300]}


class HistoryWriter:
    """A fresh history (resume_bytes None) or one cut back to a checkpoint's size; the path may be
    remote (gs://, via rossjax.monitor.RunFile)."""

    def __init__(self, path: str, *, resume_bytes: int | None = None, enabled: bool = True):
        self.path = path
        self.enabled = enabled
        self._f = None
        if not enabled:
            return
        self._f = RunFile(path, fresh=resume_bytes is None)
        if resume_bytes is not None:
            self._f.rewind_bytes(resume_bytes)

    def append(self, records):
        if self._f is None:
            return
        for r in records:
            self._f.write(json.dumps(_clean(r), ensure_ascii=False, allow_nan=False) + "\n")
        self._f.flush()

    def tell(self) -> int:
        return self._f.tell() if self._f is not None else 0

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None


def write_samples(f, step: int, records):
    """A few completions with their rewards (WORKDIR/samples.jsonl, every `sample_every` steps)."""
    for rec in records:
        f.write(json.dumps(_clean({"step": step, "task": rec["task"]["id"],
                                   "prompt": rec["messages"][-2]["content"],
                                   "completion": rec["messages"][-1]["content"],
                                   "finish_reason": rec["source"]["finish_reason"],
                                   "reward": rec.get("reward"), "rewards": rec.get("rewards", {})}),
                           ensure_ascii=False) + "\n")
    f.flush()


def read_history(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
