"""Training metrics: TensorBoard + JSONL writer, a tqdm progress bar with ETA, FLOP/MFU estimates.

Shared by SFT and GRPO. Only process 0 writes files; every process may call the methods.
"""

from __future__ import annotations

import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np


def matmul_params(model_cfg) -> int:
    """Parameters that take part in a matmul per token (embedding lookup excluded, LM head included)."""
    embed = model_cfg.vocab_size * model_cfg.d_model
    non_embed = model_cfg.num_params() - embed
    return non_embed + (embed if model_cfg.tie_embeddings else 0)


def train_flops_per_token(model_cfg, seq_len: int) -> float:
    """Forward+backward FLOPs per token: 6 x matmul params + causal attention scores/values.

    Attention: QK^T and AV are 2 x 2 x s x heads x head_dim FLOPs forward per token, halved by
    the causal mask, x3 for the backward -> 6 x layers x heads x head_dim x s. Packed rows attend
    within a document only, so this slightly over-counts for short documents.
    """
    attn = 6.0 * model_cfg.n_layers * model_cfg.n_heads * model_cfg.head_dim * seq_len
    return 6.0 * matmul_params(model_cfg) + attn


def measure_matmul_flops(n: int = 1024, dtype=jnp.float32, repeats: int = 5) -> float:
    """Achieved FLOP/s of one jitted square matmul on the default device (the MFU yardstick on CPU)."""
    a = jnp.ones((n, n), dtype)
    b = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


class MetricsWriter:
    """Scalars to TensorBoard event files and `metrics.jsonl` in the workdir (process 0 only)."""

    def __init__(self, workdir: str | None, *, enabled: bool | None = None):
        self.enabled = (jax.process_index() == 0) if enabled is None else enabled
        self.enabled = self.enabled and workdir is not None
        self._tb = None
        self._jsonl = None
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(logdir=os.path.join(workdir, "tb"))
            self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")

    def write(self, step: int, scalars: dict, prefix: str = "train"):
        if not self.enabled:
            return
        clean = {k: float(np.asarray(v)) for k, v in scalars.items()}
        for k, v in clean.items():
            if math.isfinite(v):
                self._tb.add_scalar(f"{prefix}/{k}", v, step)
        self._jsonl.write(json.dumps({"step": int(step), "split": prefix, **{
            k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}}) + "\n")
        self._jsonl.flush()

    def close(self):
        if self._tb is not None:
            self._tb.close()
            self._jsonl.close()
            self._tb = self._jsonl = None


def read_metrics(workdir: str, split: str = "train") -> list[dict]:
    """The rows of `metrics.jsonl` for one split (used by tests and reports)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r.get("split") == split]


class Throughput:
    """tokens/s, supervised tokens/s and MFU over the steps since the last `rates()` call."""

    def __init__(self, flops_per_token: float, peak_flops: float | None):
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self._t = time.perf_counter()
        self._tokens = 0
        self._sup = 0

    def add(self, tokens: int, supervised: int):
        self._tokens += int(tokens)
        self._sup += int(supervised)

    def rates(self) -> dict:
        now = time.perf_counter()
        dt = max(now - self._t, 1e-9)
        out = {"tokens_per_s": self._tokens / dt, "supervised_tokens_per_s": self._sup / dt}
        if self.peak_flops:
            out["mfu"] = self._tokens * self.flops_per_token / dt / self.peak_flops
        self._t, self._tokens, self._sup = now, 0, 0
        return out


class Progress:
    """A tqdm bar with ETA on process 0; a no-op elsewhere."""

    def __init__(self, total: int, initial: int = 0, desc: str = "train", enabled: bool | None = None):
        enabled = (jax.process_index() == 0) if enabled is None else enabled
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True,
                             mininterval=1.0, smoothing=0.1)

    def update(self, n: int = 1, **postfix):
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v)
                                       for k, v in postfix.items()}, refresh=False)
            self._bar.update(n)

    def write(self, msg: str):
        if self._bar is not None:
            self._bar.write(msg)

    def close(self):
        if self._bar is not None:
            self._bar.close()
