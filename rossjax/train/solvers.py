"""Solvers for induction tasks under the AZR protocol, and their K trials per task: what
`rossjax eval-generator` (utility rate) and `rossjax label-corpus` (U_S labels) both run.

Kinds: `model` (a checkpoint through the sampler: `path` or `preset`), and three programmatic
ones: `oracle` (answers with the task's own f: always solves), `identity` (returns its first
argument) and `lookup` (a table of the visible pairs: never infers f, so it scores 0 on hidden
inputs — the check that they are hidden). A trial is True/False, or None when the verifier could
not decide (the reference run failed).
"""

from __future__ import annotations

import os

from rossjax.errors import ConfigError
from rossjax.verify import induction_task
from rossjax.verify.induction import verify

KINDS = ("model", "oracle", "identity", "lookup")


def load_model(section, tok, seed, field):
    """(ModelConfig, params) of a config section (path, or preset sized to the tokenizer),
    float32 on one device."""
    from rossjax.models import loading

    m = {"path": section.path, "preset": section.preset, "dtype": "float32"}
    if section.path:
        m["param_dtype"] = "float32"
    else:
        m["vocab_size"] = tok.vocab_size
    return loading.load_model(m, seed=seed, field=field)


def load_tokenizer(spec: str, workdir: str):
    from rossjax.tokenizers import load_tokenizer as load
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    return load(write_ascii_tokenizer(os.path.join(workdir, "tokenizer")) if spec == "ascii" else spec)


def sample_texts(mc, params, tok, prompts_msgs, n, c, seed, template="chatml"):
    """n answers per prompt (chat-rendered) from a model, decoded without the end marker."""
    from rossjax import sample
    from rossjax.train import rollout

    prompts = [tok.encode(rollout.render_prompt(m, template, tok)) for m in prompts_msgs]
    gen = sample.generate(mc, params, prompts, c.max_new_tokens, temperature=c.temperature,
                          stop_ids=(tok.eos_id,), num_samples=n, seed=seed)
    return [tok.decode([t for t in s if t != tok.eos_id]) for s in gen.sequences()]


class Solver:
    """`answers(solver_tasks, k, seed) -> [[k texts] per task]` for one configured solver."""

    def __init__(self, section, tok, c, seed: int = 0, field: str = "config.solver"):
        if section.kind not in KINDS:
            raise ConfigError(f"{field}.kind {section.kind!r} is not one of {', '.join(KINDS)}.")
        self.section, self.tok, self.c, self.seed, self.field = section, tok, c, seed, field
        self._model = None

    def answers(self, tasks: list[dict], k: int, seed: int) -> list[list[str]]:
        """k answers for each task; a model solver samples all of them in one batch."""
        kind = self.section.kind
        if kind == "oracle":
            return [[f"```python\n{t['program']}\n```"] * k for t in tasks]
        if kind == "identity":
            return [["```python\ndef f(*a):\n    return a[0]\n```"] * k for t in tasks]
        if kind == "lookup":
            return [[induction_task.lookup_answer(t)] * k for t in tasks]
        self._model = self._model or load_model(self.section, self.tok, self.seed + 1, self.field)
        texts = sample_texts(*self._model, self.tok,
                             [[{"role": "user", "content": t["prompt"]}] for t in tasks], k, self.c, seed)
        return [texts[i * k:(i + 1) * k] for i in range(len(tasks))]


def judge(task: dict, answer: str) -> bool | None:
    """One trial: the solver's answer scored on the task's hidden inputs only."""
    return verify({"task": task, "messages": [{"role": "user", "content": task["prompt"]},
                                              {"role": "assistant", "content": answer}]}).passed


def trials(solver: Solver, solver_tasks: list[dict | None], k: int, seed: int = 0,
           batch_tasks: int = 64) -> list[list]:
    """K trials per solver task ([] for None: an invalid task is not tried), sampled
    `batch_tasks` tasks at a time."""
    out = [[] for _ in solver_tasks]
    todo = [i for i, t in enumerate(solver_tasks) if t is not None]
    for b in range(0, len(todo), max(1, batch_tasks)):
        chunk = todo[b:b + batch_tasks]
        answers = solver.answers([solver_tasks[i] for i in chunk], k, seed + b)
        for i, ans in zip(chunk, answers):
            out[i] = [judge(solver_tasks[i], a) for a in ans]
    return out
