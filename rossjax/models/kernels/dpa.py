"""`jax.nn.dot_product_attention` backends: `xla` (any platform) and `cudnn` (NVIDIA GPUs).

Both take the ids mask of attention.MaskSpec as an explicit boolean [b, 1, s, t] mask, so they
implement exactly the pure-JAX rule (causal by slot, same segment, window by position). `xla`
computes scores in float32 for bf16 inputs; cuDNN's fused kernel turns the mask into an additive
bias and keeps softmax statistics in float32. GQA is native (H query heads over K kv heads).

Packed rows cost a [b, 1, s, t] mask (cuDNN: a bias of that size) because jax 0.10's
`jax.nn.dot_product_attention` has no segment ids and no mask callable: its `query_seq_lengths`
/ `key_value_seq_lengths` describe one sequence per row plus padding, not several documents. Its
cuDNN binding's packed layout (q/kv offsets) is private API (jax._src.cudnn); move to it, or to
public segment ids, when jax exposes them. Long packed rows on GPU: `blockwise` holds no [s, t].
"""

from __future__ import annotations

import jax


def attend(q, k, v, mask, *, implementation: str):
    """q [b, s, H, hd], k/v [b, t, K, hd], mask bool [b, s, t] -> [b, s, H, hd] in q.dtype."""
    out = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype),
                                       mask=mask[:, None], implementation=implementation)
    return out.astype(q.dtype)
