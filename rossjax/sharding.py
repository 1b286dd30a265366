"""Mesh with axes (data, fsdp, tensor) and logical-axis rules -> NamedShardings.

Rules are data: a tuple of (logical_name, mesh_axis) pairs, where mesh_axis is a mesh axis name,
a tuple of names, or None (replicated). Configs override them, e.g.
`config.sharding_rules = (("embed", None), ("mlp", "tensor"), ...)`; logical names not listed
are replicated. A dimension that a mesh axis does not divide evenly falls back to replicated
(e.g. 2 KV heads on tensor=4), and one mesh axis is used at most once per array.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# Logical names used by rossjax.models (params) and by batches/activations.
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
    ("length", None),
)


def normalize_rules(rules=None) -> tuple:
    """Accept None (defaults), a mapping, or pairs (lists from ml-collections too) -> tuple of pairs."""
    if rules is None:
        return DEFAULT_RULES
    items = rules.items() if isinstance(rules, Mapping) else rules
    out = []
    for item in items:
        if len(item) != 2 or not isinstance(item[0], str):
            raise ValueError(f"sharding rules: entry {item!r} is not a (logical_name, mesh_axes) pair.")
        name, axes = item
        if isinstance(axes, list):
            axes = tuple(axes)
        for a in (axes if isinstance(axes, tuple) else (axes,)):
            if a is not None and a not in MESH_AXES:
                raise ValueError(f"sharding rules: entry for {name!r} names mesh axis {a!r}; mesh axes "
                                 f"are {', '.join(MESH_AXES)}.")
        out.append((name, axes))
    return tuple(out)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default all); one size may be -1 (the rest)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError("make_mesh: at most one of data, fsdp, tensor may be -1.")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"make_mesh: {len(devices)} devices are not divisible by {known}.")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(f"make_mesh: data*fsdp*tensor = {math.prod(sizes)} but there are "
                         f"{len(devices)} devices.")
    try:
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_device_mesh(sizes, devices)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.asarray(devices).reshape(sizes)
    return Mesh(grid, MESH_AXES)


def logical_to_mesh_spec(logical: P | tuple, rules=None, shape=None, mesh: Mesh | None = None) -> P:
    """Map a spec of logical names to a spec of mesh axes (see module docstring for the rules)."""
    table = {}
    for name, axes in normalize_rules(rules):
        table.setdefault(name, axes)  # first rule for a name wins, as in flax
    used: set[str] = set()
    out = []
    for dim, name in enumerate(tuple(logical)):
        axes = table.get(name) if name is not None else None
        axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
        kept = []
        for a in axes:
            if a in used or (mesh is not None and a not in mesh.shape):
                continue
            size = mesh.shape[a] if mesh is not None else 1
            have = math.prod(mesh.shape[k] for k in kept) if mesh is not None else 1
            if shape is not None and shape[dim] % (have * size):
                continue  # uneven: replicate this axis rather than fail deep inside XLA
            kept.append(a)
        used.update(kept)
        out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return P(*out)


def _is_spec(x):
    return isinstance(x, P)


def logical_to_sharding(logical_tree, mesh: Mesh, rules=None, shapes=None):
    """Pytree of logical PartitionSpecs (+ optional matching pytree of shapes) -> NamedShardings."""
    if shapes is None:
        return jax.tree.map(lambda s: NamedSharding(mesh, logical_to_mesh_spec(s, rules, None, mesh)),
                            logical_tree, is_leaf=_is_spec)
    return jax.tree.map(
        lambda s, x: NamedSharding(mesh, logical_to_mesh_spec(s, rules, tuple(x.shape), mesh)),
        logical_tree, shapes, is_leaf=_is_spec)


def param_shardings(cfg, mesh: Mesh, rules=None):
    """NamedShardings for `rossjax.models.init_params(cfg, ...)`'s pytree (computed abstractly)."""
    from rossjax.models import transformer

    shapes = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    return logical_to_sharding(transformer.logical_axes(cfg), mesh, rules, shapes)


def init_params_sharded(cfg, rng, mesh: Mesh, rules=None):
    """Random init directly into the mesh layout (no full replica on any one device)."""
    from rossjax.models import transformer

    shardings = param_shardings(cfg, mesh, rules)
    return jax.jit(lambda r: transformer.init_params(cfg, r), out_shardings=shardings)(rng)


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=None, shape=None) -> NamedSharding:
    """Leading (batch) dim over the rule for "batch" (default data x fsdp), the rest replicated."""
    logical = P("batch", *([None] * (ndim - 1)))
    return NamedSharding(mesh, logical_to_mesh_spec(logical, rules, shape, mesh))


def from_host(x, named_sharding: NamedSharding) -> jax.Array:
    """A value every process holds in full (numpy) -> a jax.Array laid out by `named_sharding`.
    Each process fills only its own devices' shards, so it works on one host and across hosts
    (where device_put of a numpy array to devices of other processes cannot)."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, named_sharding, lambda idx: x[idx])


def to_host(x) -> np.ndarray:
    """The full value of a jax.Array as numpy on every process (gathered across hosts when the
    array has shards on other processes' devices)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def shard_batch(batch, mesh: Mesh, rules=None):
    """device_put every array of a batch pytree with its leading dim split over the batch axes."""
    def put(x):
        x = np.asarray(x) if not isinstance(x, jax.Array) else x
        spec = logical_to_mesh_spec(P("batch", *([None] * (x.ndim - 1))), rules, None, mesh)
        n = math.prod(mesh.shape[a] for a in ((spec[0],) if isinstance(spec[0], str) else spec[0] or ()))
        if x.shape[0] % n:
            raise ValueError(f"shard_batch: batch size {x.shape[0]} is not divisible by the {n} "
                             f"devices of the batch axes {spec[0]}.")
        return jax.device_put(x, NamedSharding(mesh, spec))
    return jax.tree.map(put, batch)


def cache_shardings(cfg, mesh: Mesh, batch: int, max_len: int, rules=None):
    """NamedShardings for `rossjax.models.init_cache(cfg, batch, max_len)`'s pytree."""
    kv_shape = (cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim)
    kv = NamedSharding(mesh, logical_to_mesh_spec(
        P("layers", "batch", "kv_heads", "length", "head_dim"), rules, kv_shape, mesh))
    row = NamedSharding(mesh, logical_to_mesh_spec(P("batch", "length"), rules, (batch, max_len), mesh))
    return {"k": kv, "v": kv, "mask": row, "pos": row}
