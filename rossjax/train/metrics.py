"""Training throughput: FLOPs per token, the measured matmul yardstick, tokens/s and MFU.

Shared by SFT and GRPO. The metrics writer and progress bar are in rossjax.monitor.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp


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
