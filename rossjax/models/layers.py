"""Decoder building blocks (Flax linen): RMSNorm, RoPE, GQA attention, SwiGLU MLP, Block.

The attention kernels themselves (dense / block-wise, masks from ids) live in attention.py, the
fused backends (cuDNN, XLA, Pallas splash) in kernels/.

Every parameter carries logical axis names (see rossjax/sharding.py for the rules that map them
to mesh axes). Numerics follow transformers: RMSNorm and softmax in float32, RoPE with the
rotate-half convention, scores scaled by head_dim**-0.5 after the q.k product.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from rossjax.models import attention as attn_kernels
from rossjax.models.attention import MaskSpec
from rossjax.models.config import ModelConfig


def _kernel_init(cfg: ModelConfig, names):
    return nn.with_logical_partitioning(nn.initializers.normal(cfg.initializer_range), names)


def _zeros(names):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


class RMSNorm(nn.Module):
    cfg: ModelConfig
    axis_name: str = "norm"

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                                 (self.axis_name,)),
                           (x.shape[-1],), jnp.dtype(self.cfg.param_dtype))
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.cfg.rms_eps)
        # transformers casts back to the input dtype before multiplying by the weight.
        dt = jnp.dtype(self.cfg.dtype)
        return y.astype(dt) * scale.astype(dt)


def rope_cos_sin(cfg: ModelConfig, positions):
    """positions [b, s] int -> (cos, sin) [b, s, head_dim] float32 (halves duplicated, as in HF)."""
    inv = jnp.asarray(cfg.inv_freq())
    freqs = positions.astype(jnp.float32)[..., None] * inv
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x, cos, sin):
    """x [b, s, n, hd]; cos/sin [b, s, hd]. Computed in float32, returned in x.dtype."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos[:, :, None, :] + rot * sin[:, :, None, :]
    return out.astype(x.dtype)


def _fused_dense(module: nn.Module, x, names, feats):
    """Apply the DenseGeneral params `names` of `module` (kernels [d, *features], output shapes
    `feats`) to the same x as ONE matmul over their concatenated kernels, then split: one large
    GEMM (and one in each backward direction) runs faster than several narrow ones. Same numerics
    as separate DenseGeneral calls (each output column is the same dot product); the params
    layout stays per-projection (init still builds them with DenseGeneral).

    Params that already hold the concatenation under "+".join(names) (decode_params builds it
    once per generate call) are used as they are: a decode step then reads each weight once.
    """
    dt = jnp.dtype(module.cfg.dtype)
    params = module.variables["params"]
    d = x.shape[-1]
    fused = "+".join(names)
    if fused in params:
        p = nn.unbox(params[fused])
        w, b = p["kernel"], p.get("bias")
    else:
        w, b = fuse_kernels([nn.unbox(params[n]) for n in names], d)
    y = jax.lax.dot_general(x.astype(dt), w.astype(dt), (((x.ndim - 1,), (0,)), ((), ())))
    if b is not None:
        y = y + b.astype(dt)
    outs, start = [], 0
    for f in feats:
        n = math.prod(f)
        outs.append(y[..., start:start + n].reshape(x.shape[:-1] + tuple(f)))
        start += n
    return outs


def fuse_kernels(ps, d):
    """DenseGeneral params [{"kernel": [d, *f], ["bias"]}] -> (kernel [d, sum f], bias or None)."""
    w = jnp.concatenate([p["kernel"].reshape(d, -1) for p in ps], axis=1)
    b = (jnp.concatenate([p["bias"].reshape(-1) for p in ps])
         if all("bias" in p for p in ps) else None)
    return w, b


class Attention(nn.Module):
    cfg: ModelConfig

    def _proj(self, n, names, bias, name):
        cfg = self.cfg
        return nn.DenseGeneral(
            features=(n, cfg.head_dim), axis=-1, use_bias=bias, name=name,
            kernel_init=_kernel_init(cfg, ("embed",) + names), bias_init=_zeros(names),
            dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype))

    @nn.compact
    def __call__(self, x, cos, sin, mask: MaskSpec, kv_cache=None, cache_mask: MaskSpec | None = None,
                 cache_index=None):
        """x [b, s, d]; `mask` describes which of these s tokens each one sees.

        With kv_cache=(k, v) [b, K, T, hd] (one layer's cache, head-major), this call's keys and
        values are first written at slots [cache_index, cache_index + s), then the queries attend
        over the whole cache as `cache_mask` allows (it covers the new slots too, so `mask` is
        not used). Returns (out, updated (k, v)); written in a jitted loop whose carry holds the
        cache, the update happens in place. Without a cache the second output is None.
        """
        cfg = self.cfg
        if self.is_initializing():
            q = self._proj(cfg.n_heads, ("heads", "head_dim"), cfg.qkv_bias, "q")(x)
            k = self._proj(cfg.n_kv_heads, ("kv_heads", "head_dim"), cfg.qkv_bias, "k")(x)
            v = self._proj(cfg.n_kv_heads, ("kv_heads", "head_dim"), cfg.qkv_bias, "v")(x)
        else:
            q, k, v = _fused_dense(self, x, ("q", "k", "v"), ((cfg.n_heads, cfg.head_dim),
                                                             (cfg.n_kv_heads, cfg.head_dim),
                                                             (cfg.n_kv_heads, cfg.head_dim)))
        if cfg.qk_norm:  # Qwen3: RMSNorm over head_dim, before RoPE
            q = RMSNorm(cfg, axis_name="head_dim", name="q_norm")(q)
            k = RMSNorm(cfg, axis_name="head_dim", name="k_norm")(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kw = {"impl": cfg.attention_impl, "block": cfg.attention_block}
        if kv_cache is None:
            windows = tuple(sorted(set(cfg.layer_windows())))
            out, new_cache = attn_kernels.attend(q, k, v, mask, windows=windows, **kw), None
        else:
            put = lambda c, new: jax.lax.dynamic_update_slice(
                c, new.astype(c.dtype).swapaxes(1, 2), (0, 0, cache_index, 0))
            new_cache = (put(kv_cache[0], k), put(kv_cache[1], v))
            # Attend to what later steps will read (values rounded through the cache dtype).
            kc, vc = (c.astype(q.dtype) for c in new_cache)
            out = attn_kernels.attend_cache(q, kc, vc, cache_mask, **kw)
        out = nn.DenseGeneral(
            features=cfg.d_model, axis=(-2, -1), use_bias=cfg.o_bias, name="o",
            kernel_init=_kernel_init(cfg, ("heads", "head_dim", "embed")), bias_init=_zeros(("norm",)),
            dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype))(out)
        return out, new_cache


class MLP(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg

        def dense(features, names, name):
            return nn.DenseGeneral(
                features=features, use_bias=cfg.mlp_bias, name=name,
                kernel_init=_kernel_init(cfg, names),
                bias_init=_zeros((names[-1],) if names[-1] != "embed" else ("norm",)),
                dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype))

        if self.is_initializing():
            gate = dense(cfg.ffn_dim, ("embed", "mlp"), "gate")(x)
            up = dense(cfg.ffn_dim, ("embed", "mlp"), "up")(x)
        else:
            gate, up = _fused_dense(self, x, ("gate", "up"), ((cfg.ffn_dim,), (cfg.ffn_dim,)))
        return dense(cfg.d_model, ("mlp", "embed"), "down")(nn.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(.))."""
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, cos, sin, mask: MaskSpec, kv_cache=None, cache_mask=None, cache_index=None):
        h, new_cache = Attention(self.cfg, name="attn")(RMSNorm(self.cfg, name="attn_norm")(x),
                                                        cos, sin, mask, kv_cache, cache_mask,
                                                        cache_index)
        x = x + h
        x = x + MLP(self.cfg, name="mlp")(RMSNorm(self.cfg, name="mlp_norm")(x))
        return x, new_cache


class Embed(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens):
        cfg = self.cfg
        table = self.param("embedding", _kernel_init(cfg, ("vocab", "embed")),
                           (cfg.vocab_size, cfg.d_model), jnp.dtype(cfg.param_dtype))
        return jnp.take(table, tokens, axis=0).astype(jnp.dtype(cfg.dtype))


class LMHead(nn.Module):
    """The untied LM head kernel [d_model, vocab] (tied models use the embedding transposed)."""
    cfg: ModelConfig

    @nn.compact
    def __call__(self):
        return self.param("kernel", _kernel_init(self.cfg, ("embed", "vocab")),
                          (self.cfg.d_model, self.cfg.vocab_size), jnp.dtype(self.cfg.param_dtype))
