"""Where a model's arrays live on a mesh: params, the KV cache, random init straight into it.

The layout comes from the logical axis names of `transformer.logical_axes` mapped by a
`rossjax.sharding.Partitioner` (mesh + rules). Functions take a Partitioner, or a Mesh plus
optional rules. This module depends on rossjax.sharding, never the reverse.
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from rossjax.models import transformer
from rossjax.sharding import as_partitioner


def abstract_params(cfg):
    """ShapeDtypeStructs of `init_params(cfg, ...)` (no memory)."""
    return jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))


def param_shardings(cfg, mesh, rules=None):
    """NamedShardings for `rossjax.models.init_params(cfg, ...)`'s pytree (computed abstractly).
    `mesh` is a Partitioner or a Mesh (then `rules`, default DEFAULT_RULES)."""
    part = as_partitioner(mesh, rules)
    return part.tree(transformer.logical_axes(cfg), abstract_params(cfg))


def sharded_abstract_params(cfg, shardings):
    """ShapeDtypeStructs with shardings (a checkpoint restore target)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        abstract_params(cfg), shardings)


def init_params_sharded(cfg, rng, mesh, rules=None):
    """Random init directly into the mesh layout (no full replica on any one device)."""
    shardings = param_shardings(cfg, mesh, rules)
    return jax.jit(lambda r: transformer.init_params(cfg, r), out_shardings=shardings)(rng)


def cache_shardings(cfg, mesh, batch: int, max_len: int, rules=None):
    """NamedShardings for `rossjax.models.init_cache(cfg, batch, max_len)`'s (stacked) pytree."""
    part = as_partitioner(mesh, rules)
    kv_shape = (cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim)
    kv = part.sharding(P("layers", "batch", "kv_heads", "length", "head_dim"), kv_shape,
                       name="cache/k")
    row = part.sharding(P("batch", "length"), (batch, max_len), name="cache/mask")
    return {"k": kv, "v": kv, "mask": row, "pos": row}
