"""Pallas splash attention (TPU): causal, packed segments and sliding windows as kernel masks.

The kernel sees one example's heads at a time ([heads, s, hd]); GQA runs the MQA variant once
per kv head (its G query heads share one key/value head) under vmap, and the batch under vmap.
Packed rows go in as splash SegmentIds (a query sees keys of its own segment only); the causal
rule is by slot and a window w keeps keys at slots q - w + 1 .. q. That equals the pure-JAX
rule (window measured in RoPE positions) whenever positions advance by one per slot inside a
segment, which is what packed training rows hold (positions restart at 0 per document).

Rows are padded to a multiple of the block (128-lane tiles); padded queries and keys get their
own segment id, so they never mix with real tokens and every row sees at least itself. Compiled
for a target other than TPU (the platform of the devices traced for, see
activations.target_device) the kernel runs in Pallas interpret mode (slow: tests only).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as sk,
    splash_attention_mask as sm,
)

from rossjax.models.kernels import activations

_PAD_SEG = np.iinfo(np.int32).min   # a segment id no real token carries


def _block(s: int) -> int:
    """Largest of 512/256/128 not above s rounded up to 128 lanes."""
    s128 = -(-s // 128) * 128
    return next(b for b in (512, 256, 128) if b <= s128)


@functools.lru_cache(maxsize=64)
def _kernel(s_pad: int, group: int, window: int, block: int, interpret: bool):
    shape = (s_pad, s_pad)
    one = sm.CausalMask(shape) if window == 0 else sm.LocalMask(shape, (window - 1, 0), 0)
    sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                          block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                          block_q_dq=block, block_kv_dq=block)
    # The kernel holds its mask tables as arrays: build them as constants, never as tracers of
    # whichever trace first asked (the cache outlives it).
    with jax.ensure_compile_time_eval():
        return sk.make_splash_mqa(sm.MultiHeadMask([one] * group), head_shards=1, q_seq_shards=1,
                                  block_sizes=sizes, interpret=interpret)


def attend(q, k, v, seg, *, window: int, interpret: bool | None = None):
    """q [b, s, K, G, hd], k/v [b, s, K, hd] (self-attention), seg [b, s] int32
    -> [b, s, K, G, hd] in q.dtype. `window` is static (0 = none)."""
    if interpret is None:
        interpret = activations.target_platform() != "tpu"
    b, s, nkv, g, hd = q.shape
    block = _block(s)
    s_pad = -(-s // block) * block
    pad = lambda x, value=0: jnp.pad(x, [(0, 0), (0, s_pad - s)] + [(0, 0)] * (x.ndim - 2),
                                     constant_values=value)
    # Splash leaves the 1/sqrt(hd) scale to the caller.
    qh = jnp.transpose(pad(q * jnp.asarray(hd ** -0.5, q.dtype)), (0, 2, 3, 1, 4))  # [b,K,G,s,hd]
    kh = jnp.transpose(pad(k.astype(q.dtype)), (0, 2, 1, 3))                         # [b,K,s,hd]
    vh = jnp.transpose(pad(v.astype(q.dtype)), (0, 2, 1, 3))
    segp = pad(seg.astype(jnp.int32), _PAD_SEG)
    kernel = _kernel(s_pad, g, int(window), block, bool(interpret))

    def one_example(qe, ke, ve, se):
        ids = sk.SegmentIds(se, se)
        return jax.vmap(lambda qk, kk, vk: kernel(qk, kk, vk, segment_ids=ids))(qe, ke, ve)

    out = jax.vmap(one_example)(qh, kh, vh, segp)                                    # [b,K,G,s,hd]
    return jnp.transpose(out, (0, 3, 1, 2, 4))[:, :s].astype(q.dtype)
