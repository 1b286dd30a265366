"""The CPU side of a GRPO step (no jax import: it also runs in reward worker processes).

  tasks       `TaskSource(spec)`: a JSONL file of task objects (the `task` of the rollout record,
              optionally with `messages` for the prompt), or a seeded generator: `gen:contains`
              (write a given letter; reward = the letter appears), `gen:arith` (a + b in
              \\boxed{}; math verifier), `gen:induction` (PROPEL: ask the generator model for a
              function-induction task; validity = the induction verifier's `task_valid`);
  prompts     the chat template renders the prompt messages plus an empty assistant turn and is
              cut where the assistant's content starts, so prompt + completion + end marker
              spell exactly what `rossjax curate` renders for the finished record;
  records     every candidate becomes a rollout record (DESIGN.md) with its token ids, sampler
              log-probs, reward, verdict and step;
  CPU rewards `score(kind, record)`: "verifier" (curation verifiers), "contains", "validity".
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import random

import numpy as np

from rossjax.curate.chat import render_chat

CPU_REWARDS = ("verifier", "contains", "validity")
_LETTERS = "abcdefgh"

INDUCTION_PROMPT = (
    "Write a function-induction task. Give a Python function f in a ```python block, then its "
    "test inputs in an ```inputs block, one argument list per line, e.g. [1, 2], 'a'. The task "
    "should be hard but solvable: a solver sees only the inputs and outputs and must rewrite f.")


class TaskSource:
    """An endless, seeded, resumable stream of tasks; `state()` / `set_state()` for checkpoints."""

    def __init__(self, spec: str, seed: int = 0, field: str = "config.data.tasks"):
        self.spec, self.seed, self.index = spec, int(seed), 0
        self._rows = None
        if not spec.startswith("gen:"):
            self._rows = read_tasks(spec, field)
        elif spec not in ("gen:contains", "gen:arith", "gen:induction"):
            raise ValueError(f"{field} {spec!r} is not a task file or one of gen:contains, "
                             f"gen:arith, gen:induction.")

    def _make(self, i: int) -> dict:
        rng = random.Random(self.seed * 1_000_003 + i)
        if self._rows is not None:
            n = len(self._rows)
            epoch, k = divmod(i, n)
            order = list(range(n))
            random.Random(self.seed * 7919 + epoch).shuffle(order)
            return dict(self._rows[order[k]])
        if self.spec == "gen:contains":
            c = rng.choice(_LETTERS)
            return {"id": f"contains-{i}", "domain": "contains", "prompt": f"Write the letter {c}.",
                    "reference": c}
        if self.spec == "gen:arith":
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            return {"id": f"arith-{i}", "domain": "math",
                    "prompt": f"What is {a} + {b}? Put the final answer in \\boxed{{}}.",
                    "reference": str(a + b)}
        return {"id": f"induction-gen-{i}", "domain": "induction_gen", "prompt": INDUCTION_PROMPT}

    def next(self, n: int) -> list[dict]:
        out = [self._make(self.index + k) for k in range(n)]
        self.index += n
        return out

    def state(self) -> dict:
        return {"spec": self.spec, "seed": self.seed, "index": self.index}

    def set_state(self, st: dict):
        self.index = int(st["index"])


def read_tasks(path: str, field: str = "config.data.tasks") -> list[dict]:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: task file not found ({field}).")
    from rossjax.curate.schema import iter_json_lines

    rows = []
    for k, t, reason, *_ in iter_json_lines(path):
        if reason:
            raise ValueError(f"{reason}.")
        if not isinstance(t, dict) or not isinstance(t.get("id"), str):
            raise ValueError(f"{path} row {k}: field 'id' must be a string.")
        if not isinstance(t.get("prompt"), str) and not isinstance(t.get("messages"), list):
            raise ValueError(f"{path} row {k}: field 'prompt' (or 'messages') is missing.")
        rows.append(t)
    if not rows:
        raise ValueError(f"{path}: the task file has no rows.")
    return rows


def prompt_messages(task: dict, system: str = "") -> list[dict]:
    if isinstance(task.get("messages"), list):
        return [dict(m) for m in task["messages"]]
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": task["prompt"]}]


def render_prompt(messages: list[dict], template: str = "chatml", tokenizer=None) -> str:
    """The text up to where the assistant's answer starts (its header included)."""
    r = render_chat(messages + [{"role": "assistant", "content": ""}], template, tokenizer)
    return r.text[:r.part(len(messages), "content").start]


def task_for_record(task: dict) -> dict:
    """The record's `task` object (the prompt messages live in `messages`, not here)."""
    return {k: v for k, v in task.items() if k != "messages"}


def make_record(task: dict, messages: list[dict], content: str, token_ids: list[int],
                logprobs: list[float], *, run: str, step: int, sample: int, finish_reason: str,
                n_prompt_tokens: int) -> dict:
    """A rollout record (reward and verifier are filled in once scored)."""
    return {"id": f"{run}-s{step}-{task['id']}-g{sample}",
            "task": task_for_record(task),
            "source": {"run": run, "step": int(step), "sample": int(sample),
                       "finish_reason": finish_reason, "prompt_tokens": int(n_prompt_tokens)},
            "messages": [*messages, {"role": "assistant", "content": content}],
            "token_ids": [int(t) for t in token_ids],
            "logprobs": [float(x) for x in logprobs]}


# ----------------------------------------------------------------------------- CPU rewards

def parse_induction_task(text: str) -> dict | None:
    """A generated induction task (program + inputs) from the generator's answer, or None."""
    from rossjax.curate.verifiers.answers import _FENCE

    program, inputs = None, None
    for lang, body in _FENCE.findall(text or ""):
        if lang.lower() in ("python", "py") and program is None:
            program = body
        elif lang.lower() == "inputs" and inputs is None:
            inputs = [ln.strip() for ln in body.splitlines() if ln.strip()]
    if program is None or not inputs:
        return None
    return {"program": program, "inputs": inputs}


def score(kind: str, record: dict) -> tuple[float, dict | None]:
    """(reward, verifier verdict dict or None) for one record; never raises.

    verifier: 1 if the curation verifier passes, 0 if it fails, NaN if it cannot decide;
    contains: 1 if task.reference occurs in the answer; validity: 1 if the answer is a valid
    induction task (parse + `task_valid`), else 0.
    """
    content = record["messages"][-1].get("content") or ""
    if kind == "contains":
        ref = (record.get("task") or {}).get("reference") or ""
        ok = bool(ref) and ref in content
        return float(ok), {"name": "contains", "passed": ok,
                           "evidence": f"{ref!r} {'found' if ok else 'not found'} in the answer"}
    if kind == "verifier":
        from rossjax.curate.verifiers import verify_one
        from rossjax.curate.verifiers.pool import verifier_name

        name = verifier_name(record)
        v = verify_one(record, name)
        r = math.nan if v.passed is None else float(v.passed)
        return r, {"name": name or "?", "passed": v.passed, "evidence": v.evidence[:300]}
    if kind == "validity":
        task = parse_induction_task(content)
        if task is None:
            return 0.0, {"name": "induction_task_valid", "passed": False,
                         "evidence": "no ```python and ```inputs blocks"}
        from rossjax.curate.verifiers.induction import task_valid

        v = task_valid(task)
        return float(bool(v.passed)), {"name": "induction_task_valid", "passed": bool(v.passed),
                                       "evidence": v.evidence[:300]}
    raise ValueError(f"reward kind {kind!r} is not one of {', '.join(CPU_REWARDS)}.")


def score_batch(kinds: tuple, records: list[dict]) -> list[dict]:
    """For a worker: {kind: (reward, verdict)} per record."""
    return [{k: score(k, r) for k in kinds} for r in records]


class RewardWorkers:
    """CPU rewards on `workers` spawned processes (math-verify's signal timeouts need each
    verifier in a main thread); workers=0 scores lazily in this process when asked."""

    def __init__(self, workers: int, scorer=score_batch):
        self.workers, self.scorer = int(workers), scorer
        self._ex = (cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
                    if self.workers > 0 else None)

    def submit(self, kinds: tuple, records: list[dict]):
        if not kinds:
            return lambda: [{} for _ in records]
        if self._ex is None:
            return lambda: self.scorer(kinds, records)
        per = max(1, -(-len(records) // (2 * self.workers)))
        futs = [self._ex.submit(self.scorer, kinds, records[i:i + per])
                for i in range(0, len(records), per)]
        return lambda: [x for f in futs for x in f.result()]

    def close(self):
        if self._ex is not None:
            self._ex.shutdown(cancel_futures=True)


def group_stats(rewards: np.ndarray, g: int, success: float) -> dict:
    r = rewards.reshape(-1, g)
    ok = ~np.isnan(r)
    zero_var, mixed = [], []
    for row, m in zip(r, ok):
        v = row[m]
        zero_var.append(len(v) < 2 or np.all(v == v[0]))
        mixed.append(bool(np.any(v >= success) and np.any(v < success)))
    return {"zero_var_group_frac": float(np.mean(zero_var)), "mixed_outcome_rate": float(np.mean(mixed))}


def _nanmean(v) -> float:
    v = np.asarray(v, np.float64)
    return float(np.mean(v[~np.isnan(v)])) if np.any(~np.isnan(v)) else float("nan")


def step_metrics(total, per: dict, g: int, success: float, *, ent, mask, lengths, finish,
                 updates: list[dict], is_metrics: dict) -> dict:
    """The per-step scalars of a GRPO step (rewards over scorable rows; update metrics averaged
    over the step's minibatch updates; entropy over completion tokens)."""
    ok = ~np.isnan(total)
    return {"reward_mean": _nanmean(total),
            "reward_std": float(np.std(total[ok])) if ok.any() else float("nan"),
            "reward_nan_frac": float(np.mean(~ok)),
            **{f"reward_{n}_mean": _nanmean(v) for n, v in per.items()},
            **group_stats(total, g, success),
            "entropy": float(np.sum(ent * mask) / max(mask.sum(), 1)),
            "completion_len_mean": float(np.mean(lengths)),
            "completion_len_max": float(np.max(lengths)),
            "truncated_frac": float(np.mean([f == "length" for f in finish])),
            **{k: float(np.mean([u[k] for u in updates])) for k in
               ("loss", "pg_loss", "kl", "clip_frac_low", "clip_frac_high", "ratio_mean",
                "grad_norm", "lr", "skipped")},
            **{k: float(v) for k, v in is_metrics.items()}}


def write_ascii_tokenizer(folder: str) -> str:
    """A byte-level tokenizer over the 128 ASCII bytes plus <|endoftext|>, <|im_start|>,
    <|im_end|> (ids 128-130), for tiny models trained from scratch; `rossjax curate` loads it
    with `--config.tokenizer=FOLDER`. Returns the folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from rossjax.curate.tokenizers import _bytes_to_unicode

    table = _bytes_to_unicode()
    vocab = {table[b]: b for b in range(128)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
    return folder
