"""FLOPs of one training step, shared by the CPU and device model benchmarks."""

from __future__ import annotations


def flops_per_step(cfg, batch: int, seq: int) -> float:
    """Forward + backward matmul FLOPs (6 per parameter per token, embedding lookup excluded)
    plus causal-free attention scores and values."""
    matmul_params = cfg.num_params() - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)
    attn = 12 * batch * seq * seq * cfg.n_heads * cfg.head_dim * cfg.n_layers
    return 6.0 * matmul_params * batch * seq + attn
