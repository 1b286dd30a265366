"""`jax.nn.dot_product_attention` backends: `xla` (any platform) and `cudnn` (NVIDIA GPUs).

Both take the ids mask of attention.MaskSpec as an explicit boolean [b, 1, s, t] mask, so they
implement exactly the pure-JAX rule (causal by slot, same segment, window by position). `xla`
computes scores in float32 for bf16 inputs; cuDNN's fused kernel turns the mask into an additive
bias and keeps softmax statistics in float32. GQA is native (H query heads over K kv heads).
"""

from __future__ import annotations

import jax


def attend(q, k, v, mask, *, implementation: str):
    """q [b, s, H, hd], k/v [b, t, K, hd], mask bool [b, s, t] -> [b, s, H, hd] in q.dtype."""
    out = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype),
                                       mask=mask[:, None], implementation=implementation)
    return out.astype(q.dtype)
