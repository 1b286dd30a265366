"""Fused attention backends behind ModelConfig.attention_impl (the pure-JAX kernels, dense and
block-wise, live in models/attention.py and remain the fallback and the reference).

    xla     jax.nn.dot_product_attention(implementation="xla"), any platform
    cudnn   jax.nn.dot_product_attention(implementation="cudnn"), NVIDIA GPUs, bf16/fp16
    splash  Pallas splash attention, TPU (interpret mode elsewhere, for tests)

`platform_default` is what `auto` picks for a self-attention row (training, scoring); decode and
prefill over a KV cache always use the pure-JAX kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

FUSED = ("xla", "cudnn", "splash")


def _is_nvidia() -> bool:
    dev = jax.devices()[0]
    return dev.platform == "gpu" and "rocm" not in str(
        getattr(dev.client, "platform_version", "")).lower()


def platform_default(dtype) -> str | None:
    """'splash' on TPU, 'cudnn' on NVIDIA GPUs for half-precision compute, else None (pure JAX)."""
    backend = jax.default_backend()
    if backend == "tpu":
        return "splash"
    if backend == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and _is_nvidia():
        return "cudnn"
    return None


def attend(kind: str, qg, k, v, mask, windows: tuple[int, ...], visible=None):
    """Self-attention with a fused backend. qg [b, s, K, G, hd], k/v [b, s, K, hd], `mask` an
    attention.MaskSpec whose `window` (maybe traced: the layer scan carries it) is one of the
    static `windows`; `visible` its boolean [b, s, t] array (what xla/cudnn read; the caller
    builds it so this package never imports attention) -> [b, s, K, G, hd]."""
    b, s, nkv, g, hd = qg.shape
    if kind in ("xla", "cudnn"):
        from rossjax.models.kernels import dpa

        out = dpa.attend(qg.reshape(b, s, nkv * g, hd), k, v, visible, implementation=kind)
        return out.reshape(qg.shape)
    if kind != "splash":
        raise ValueError(f"attention backend {kind!r} is not one of {', '.join(FUSED)}.")
    from rossjax.models.kernels import splash

    # Splash bakes the window into the kernel's mask: one branch per window a layer can have.
    branches = [lambda q, k, v, seg, w=w: splash.attend(q, k, v, seg, window=w) for w in windows]
    if len(branches) == 1:
        return branches[0](qg, k, v, mask.q_seg)
    index = sum(jnp.where(mask.window == w, i, 0) for i, w in enumerate(windows))
    return jax.lax.switch(index, branches, qg, k, v, mask.q_seg)
