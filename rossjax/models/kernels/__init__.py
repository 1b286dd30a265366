"""Fused attention backends behind ModelConfig.attention_impl (the pure-JAX kernels, dense and
block-wise, live in models/attention.py and remain the fallback and the reference).

    xla     jax.nn.dot_product_attention(implementation="xla"), any platform
    cudnn   jax.nn.dot_product_attention(implementation="cudnn"), NVIDIA GPUs, bf16/fp16
    splash  Pallas splash attention, TPU (interpret mode elsewhere, for tests)

`platform_default` is what `auto` picks for a self-attention row (training, scoring); decode and
prefill over a KV cache always use the pure-JAX kernels. Both read the platform of the devices
the program is traced for (`activations.target_device`), never `jax.default_backend()`: an AOT
compile for a TPU topology on a CPU host gets splash.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rossjax.models.kernels import activations

FUSED = ("xla", "cudnn", "splash")


def _is_nvidia(dev=None) -> bool:
    dev = activations.target_device() if dev is None else dev
    return dev.platform == "gpu" and "rocm" not in str(
        getattr(dev.client, "platform_version", "")).lower()


def target_platform() -> str:
    return activations.target_platform()


def platform_default(dtype) -> str | None:
    """'splash' on TPU, 'cudnn' on NVIDIA GPUs for half-precision compute, else None (pure JAX),
    for the target's devices."""
    backend = target_platform()
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

    def run(q, k, v, seg, window):
        # Splash bakes the window into the kernel's mask: one branch per window a layer can have.
        branches = [lambda q, k, v, seg, w=w: splash.attend(q, k, v, seg, window=w) for w in windows]
        if len(branches) == 1:
            return branches[0](q, k, v, seg)
        index = sum(jnp.where(window == w, i, 0) for i, w in enumerate(windows))
        return jax.lax.switch(index, branches, q, k, v, seg)

    act = activations.current()
    if act is None:
        return run(qg, k, v, mask.q_seg, mask.window)
    return _per_shard(run, act, qg, k, v, mask.q_seg, mask.window)


def _per_shard(run, act, qg, k, v, seg, window):
    """`run` under shard_map: each device attends its own rows (and kv heads), as the residual
    stream is split. A Pallas call is opaque to XLA's sharding propagation, which would otherwise
    gather q/k/v (and the gradients) of every row onto every device."""
    from jax.sharding import PartitionSpec as P

    b, _, nkv = k.shape[:3]
    size = lambda axes: math.prod(act.mesh.shape[a] for a in axes)
    rows = act.batch if act.batch and b % size(act.batch) == 0 else None
    heads = act.kv_heads if act.kv_heads and nkv % size(act.kv_heads) == 0 else None
    if rows is None and heads is None and act.mesh.devices.size == 1:
        return run(qg, k, v, seg, window)
    # Neither divides (e.g. a micro-batch of fewer rows than the batch axes): every device
    # attends all rows; a Pallas call outside shard_map does not compile for a TPU mesh at all.
    q_spec = P(rows, None, heads, None, None)
    f = _shard_map(run, mesh=act.mesh, in_specs=(q_spec, P(rows, None, heads, None),
                                                 P(rows, None, heads, None), P(rows, None), P()),
                   out_specs=q_spec)
    return f(qg, k, v, seg, jnp.asarray(window, jnp.int32))


def _shard_map(fn, *, mesh, in_specs, out_specs):
    """jax.shard_map (jax >= 0.6), else jax.experimental.shard_map; replication checks off (the
    Pallas call has no rule for them)."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    from jax.experimental.shard_map import shard_map

    return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)
