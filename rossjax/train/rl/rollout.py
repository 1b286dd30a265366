"""The CPU side of a GRPO step (no jax import: it also runs in reward worker processes).

  tasks       `TaskSource(spec)`: a JSONL file of task objects (the `task` of the rollout record,
              optionally with `messages` for the prompt), or a seeded generator: `gen:contains`
              (write a given letter; reward = the letter appears), `gen:arith` (a + b in
              \\boxed{}; math verifier), `gen:induction` (PROPEL: ask the generator model for a
              function-induction task under the AZR protocol, rossjax.verify.induction_task:
              program, 10 inputs, a message; validity = its `check_task`), `gen:math_task`
              (PROPEL Math: ask for a problem only, no answer; `math_validity`). Generator
              contexts (rossjax.verify.generator_context): Math shows two example problems
              drawn per task from a pool (`math` section: context, examples, n_examples);
              gen:induction with `induction.context=paper` shows AZR's seed function, reference
              tasks and the banned imports (default: the one fixed instruction);
  prompts     the chat template renders the prompt messages plus an empty assistant turn and is
              cut where the assistant's content starts, so prompt + completion + end marker
              spell exactly what `rossjax curate` renders for the finished record;
  records     every candidate becomes a rollout record (docs/data.md) with its token ids, sampler
              log-probs, reward, verdict and step;
  metrics     the per-step scalars of a GRPO step.
The CPU rewards (`score(kind, record)`) live in rossjax.verify.rewards and run on its WorkerPool.
"""

from __future__ import annotations

import dataclasses
import os
import random

import numpy as np

from rossjax.errors import ConfigError, InputError
from rossjax.templates import render_prompt  # noqa: F401 (imported from here too)
from rossjax.verify import generator_context, induction_task, math_task

_LETTERS = "abcdefgh"

INDUCTION_PROMPT = induction_task.generator_prompt()  # the default protocol's prompt


class TaskSource:
    """An endless, seeded, resumable stream of tasks; `state()` / `set_state()` for checkpoints."""

    def __init__(self, spec: str, seed: int = 0, field: str = "config.data.tasks",
                 induction=None, math=None):
        self.spec, self.seed, self.index = spec, int(seed), 0
        # gen:induction: the protocol (n_inputs, n_visible, split) rides on each task object, so
        # the validity reward in the worker processes checks the same one.
        self.protocol = induction_task.protocol_from(induction)
        self._context = None  # the generator's in-context examples (gen:math_task, gen:induction)
        if spec == "gen:math_task":
            self._context = generator_context.context_from(math, "math", seed, "config.data.math")
        elif spec == "gen:induction":
            self._context = generator_context.context_from(induction, "induction", seed,
                                                           "config.data.induction", "instruction")
        self._rows = None
        if not spec.startswith("gen:"):
            self._rows = read_tasks(spec, field)
        elif spec not in ("gen:contains", "gen:arith", "gen:induction", "gen:math_task"):
            raise ConfigError(f"{field} {spec!r} is not a task file or one of gen:contains, "
                             f"gen:arith, gen:induction, gen:math_task.")

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
        shown = self._context.examples(i)
        context = {"context": [e["id"] for e in shown]} if shown else {}
        if self.spec == "gen:math_task":
            return {"id": f"math-gen-{i}", "domain": "math_gen",
                    "prompt": math_task.generator_prompt(shown), **context}
        return {"id": f"induction-gen-{i}", "domain": "induction_gen",
                "prompt": induction_task.generator_prompt(self.protocol, shown),
                "protocol": dataclasses.asdict(self.protocol), **context}

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
            raise InputError(f"{reason}.")
        if not isinstance(t, dict) or not isinstance(t.get("id"), str):
            raise InputError(f"{path} row {k}: field 'id' must be a string.")
        if not isinstance(t.get("prompt"), str) and not isinstance(t.get("messages"), list):
            raise InputError(f"{path} row {k}: field 'prompt' (or 'messages') is missing.")
        rows.append(t)
    if not rows:
        raise InputError(f"{path}: the task file has no rows.")
    return rows


def prompt_messages(task: dict, system: str = "") -> list[dict]:
    if isinstance(task.get("messages"), list):
        return [dict(m) for m in task["messages"]]
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": task["prompt"]}]


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
    over the step's minibatch updates; entropy over completion tokens). `ent` None: an
    on-policy update measured entropy (and the IS metrics) itself; they come from `updates`."""
    ok = ~np.isnan(total)
    from_update = {k: float(np.mean([u[k] for u in updates])) for k in
                   ("entropy", "is_outside_frac", "is_weight_mean") if k in updates[0]}
    return {"reward_mean": _nanmean(total),
            "reward_std": float(np.std(total[ok])) if ok.any() else float("nan"),
            "reward_nan_frac": float(np.mean(~ok)),
            **{f"reward_{n}_mean": _nanmean(v) for n, v in per.items()},
            **group_stats(total, g, success),
            "entropy": (from_update["entropy"] if ent is None
                        else float(np.sum(ent * mask) / max(mask.sum(), 1))),
            "completion_len_mean": float(np.mean(lengths)),
            "completion_len_max": float(np.max(lengths)),
            "truncated_frac": float(np.mean([f == "length" for f in finish])),
            **{k: float(np.mean([u[k] for u in updates])) for k in
               ("loss", "pg_loss", "kl", "clip_frac_low", "clip_frac_high", "ratio_mean",
                "grad_norm", "lr", "skipped")},
            **{k: v for k, v in from_update.items() if k != "entropy"},
            **{k: float(v) for k, v in is_metrics.items()}}
