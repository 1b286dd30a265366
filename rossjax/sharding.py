"""Mesh with axes (data, fsdp, tensor), logical-axis rules, and the Partitioner that holds both.

Rules are data: a tuple of (logical_name, mesh_axis) pairs, where mesh_axis is a mesh axis name,
a tuple of names, or None (replicated). Configs override them, e.g.
`config.sharding_rules = (("embed", None), ("mlp", "tensor"), ...)`; logical names not listed
are replicated, and one mesh axis is used at most once per array.

Divisibility: a dimension that a rule's mesh axis does not divide is a ConfigError naming the
tensor, the dimension and the axis. A rule whose axis ends in "?" (`("kv_heads", "tensor?")`,
e.g. 2 KV heads on tensor=4) is optional: that axis is dropped for that tensor with a warning.
Nothing is replicated silently.

    part = Partitioner(make_mesh(data=2, fsdp=2, tensor=2), rules)   # or partitioner_from_config(cfg)
    part.sharding(P("batch", None), shape=(8, 128), name="input_ids")

Param and KV-cache shardings of a model live in rossjax.models.shardings (this module knows no
model); the multi-host set-up is `distributed_config()` + `initialize_distributed(cfg.distributed)`.
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import time
import warnings
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rossjax import defaults
from rossjax.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")
OPTIONAL = "?"  # suffix of a mesh axis in a rule: drop it (with a warning) where it does not divide

# Logical names used by rossjax.models (params) and by batches/activations. GQA models often have
# fewer KV heads than tensor devices and vocabularies rarely divide evenly: those two are optional.
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor?"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor?"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
    ("length", None),
)


def _axis_name(a):
    return a[:-len(OPTIONAL)] if isinstance(a, str) and a.endswith(OPTIONAL) else a


def normalize_rules(rules=None) -> tuple:
    """Accept None (defaults), a mapping, or pairs (lists from ml-collections too) -> tuple of pairs."""
    if rules is None:
        return DEFAULT_RULES
    items = rules.items() if isinstance(rules, Mapping) else rules
    out = []
    for item in items:
        if len(item) != 2 or not isinstance(item[0], str):
            raise ConfigError(f"config.sharding_rules: entry {item!r} is not a (logical_name, "
                              f"mesh_axes) pair.")
        name, axes = item
        if isinstance(axes, list):
            axes = tuple(axes)
        for a in (axes if isinstance(axes, tuple) else (axes,)):
            if a is not None and _axis_name(a) not in MESH_AXES:
                raise ConfigError(f"config.sharding_rules: entry for {name!r} names mesh axis {a!r}; "
                                  f"mesh axes are {', '.join(MESH_AXES)} (optional: 'tensor?').")
        out.append((name, axes))
    return tuple(out)


def _sizes(data, fsdp, tensor, n: int) -> list[int]:
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ConfigError("make_mesh: at most one of data, fsdp, tensor may be -1.")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if n % known:
            raise ConfigError(f"make_mesh: {n} devices are not divisible by {known}.")
        sizes[sizes.index(-1)] = n // known
    if math.prod(sizes) != n:
        raise ConfigError(f"make_mesh: data*fsdp*tensor = {math.prod(sizes)} but there are "
                          f"{n} devices.")
    return sizes


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None, *,
              num_slices: int = 1) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default all); one size may be -1 (the rest).
    With `num_slices` > 1 (a multi-slice job, slices joined by DCN), the data axis spans the
    slices (data-parallel replicas talk over DCN only for the gradient reduction) and fsdp and
    tensor stay inside each slice's ICI; data must be a multiple of num_slices."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = _sizes(data, fsdp, tensor, len(devices))
    from jax.experimental import mesh_utils

    if num_slices > 1:
        if sizes[0] % num_slices:
            raise ConfigError(f"config.mesh.data ({sizes[0]}) must be a multiple of the "
                              f"{num_slices} slices: the data axis spans the slices (DCN).")
        ici = [sizes[0] // num_slices, sizes[1], sizes[2]]
        grid = mesh_utils.create_hybrid_device_mesh(ici, [num_slices, 1, 1], devices)
        return Mesh(grid, MESH_AXES)
    try:
        grid = mesh_utils.create_device_mesh(sizes, devices)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.asarray(devices).reshape(sizes)
    return Mesh(grid, MESH_AXES)


def mesh_from_config(m, devices=None, *, num_slices: int = 1) -> Mesh:
    """The mesh of a config's `mesh` section (data, fsdp, tensor; optional num_devices) over
    `devices` (default jax.devices(); `rossjax plan` passes a TPU topology's). Without a -1 it
    takes the first data*fsdp*tensor devices, so `data=1, fsdp=1, tensor=1` is one device."""
    sizes = (int(m.data), int(m.fsdp), int(m.tensor))
    devices = list(jax.devices() if devices is None else devices)
    n = int(m.get("num_devices", 0) or 0) if hasattr(m, "get") else 0
    if n > 0:
        devices = devices[:n]
    if -1 not in sizes:
        if math.prod(sizes) > len(devices):
            raise ConfigError(f"config.mesh asks for {math.prod(sizes)} devices (data x fsdp x "
                              f"tensor = {' x '.join(map(str, sizes))}) but there are {len(devices)}.")
        devices = devices[:math.prod(sizes)]
    return make_mesh(*sizes, devices=devices, num_slices=num_slices)


def logical_to_mesh_spec(logical: P | tuple, rules=None, shape=None, mesh: Mesh | None = None, *,
                         name: str = "array", optional: bool = False) -> P:
    """Map a spec of logical names to a spec of mesh axes (see the module docstring).

    With `shape` and `mesh`, an axis that does not divide its dimension raises ConfigError naming
    `name`, unless its rule is optional (or `optional` is set): then it is dropped with a warning."""
    table = {}
    for lname, axes in normalize_rules(rules):
        table.setdefault(lname, axes)  # first rule for a name wins, as in flax
    used: set[str] = set()
    out = []
    for dim, lname in enumerate(tuple(logical)):
        axes = table.get(lname) if lname is not None else None
        axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
        kept = []
        for raw in axes:
            a = _axis_name(raw)
            if a in used or (mesh is not None and a not in mesh.shape):
                continue
            size = mesh.shape[a] if mesh is not None else 1
            have = math.prod(mesh.shape[k] for k in kept) if mesh is not None else 1
            if shape is not None and shape[dim] % (have * size):
                msg = (f"sharding: {name} dim {dim} ({lname!r}, size {shape[dim]}) is not divisible "
                       f"by mesh axis {a!r} (x{have * size} with the axes before it)")
                if not (optional or raw != a):
                    raise ConfigError(f"{msg}; change config.mesh, or mark the rule optional "
                                      f"(({lname!r}, {a + OPTIONAL!r})) in config.sharding_rules.")
                warnings.warn(f"{msg}; that axis is replicated for it.", stacklevel=2)
                continue
            kept.append(a)
        used.update(kept)
        out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return P(*out)


def _is_spec(x):
    return isinstance(x, P)


def logical_to_sharding(logical_tree, mesh: Mesh, rules=None, shapes=None):
    """Pytree of logical PartitionSpecs (+ optional matching pytree of shapes) -> NamedShardings.
    Errors name the tensor by its path in the tree."""
    if shapes is None:
        return jax.tree.map(lambda s: NamedSharding(mesh, logical_to_mesh_spec(s, rules, None, mesh)),
                            logical_tree, is_leaf=_is_spec)
    return jax.tree_util.tree_map_with_path(
        lambda path, s, x: NamedSharding(mesh, logical_to_mesh_spec(
            s, rules, tuple(x.shape), mesh, name=_path_name(path))),
        logical_tree, shapes, is_leaf=_is_spec)


def _path_name(path) -> str:
    return "params/" + "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


@dataclasses.dataclass(frozen=True)
class Partitioner:
    """A mesh and the logical rules that place arrays on it (hashable: compiled programs key on it)."""
    mesh: Mesh
    rules: tuple = DEFAULT_RULES

    def __post_init__(self):
        object.__setattr__(self, "rules", normalize_rules(self.rules))

    def spec(self, logical, shape=None, *, name: str = "array", optional: bool = False) -> P:
        return logical_to_mesh_spec(logical, self.rules, shape, self.mesh, name=name, optional=optional)

    def sharding(self, logical, shape=None, *, name: str = "array",
                 optional: bool = False) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(logical, shape, name=name, optional=optional))

    def tree(self, logical_tree, shapes=None):
        """NamedShardings for a pytree of logical specs (see logical_to_sharding)."""
        return logical_to_sharding(logical_tree, self.mesh, self.rules, shapes)

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def rows(self, ndim: int = 2, shape=None, *, name: str = "batch",
             optional: bool = False) -> NamedSharding:
        """Leading (batch) dim over the rule for "batch" (default data x fsdp), the rest replicated."""
        return self.sharding(P("batch", *([None] * (ndim - 1))), shape, name=name, optional=optional)

    def batch_size_multiple(self) -> int:
        """How many shards the batch axes make: row counts must be a multiple of it."""
        axes = self.spec(P("batch"))[0]
        axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
        return math.prod(self.mesh.shape[a] for a in axes)


def as_partitioner(mesh_or_partitioner, rules=None) -> Partitioner | None:
    """A Partitioner from a Partitioner, a Mesh (+ rules), or None (one device: None)."""
    if mesh_or_partitioner is None or isinstance(mesh_or_partitioner, Partitioner):
        return mesh_or_partitioner
    return Partitioner(mesh_or_partitioner, normalize_rules(rules))


def partitioner_from_config(cfg, devices=None, *, num_slices: int = 1) -> Partitioner:
    """`cfg.mesh` and `cfg.sharding_rules` (() = DEFAULT_RULES) -> Partitioner, over `devices`
    (default jax.devices())."""
    return Partitioner(mesh_from_config(cfg.mesh, devices, num_slices=num_slices),
                       normalize_rules(cfg.get("sharding_rules") or None))


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=None, shape=None) -> NamedSharding:
    """Leading (batch) dim over the rule for "batch" (default data x fsdp), the rest replicated;
    a batch axis that does not divide `shape[0]` is dropped with a warning (a trainer's batch
    uses `Partitioner.rows`, where that is an error)."""
    return as_partitioner(mesh, rules).rows(ndim, shape, optional=True)


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
    part = as_partitioner(mesh, rules)

    def put(x):
        x = np.asarray(x) if not isinstance(x, jax.Array) else x
        n = part.batch_size_multiple()
        if x.shape[0] % n:
            raise ValueError(f"shard_batch: batch size {x.shape[0]} is not divisible by the {n} "
                             f"devices of the batch axes {part.spec(P('batch'))[0]}.")
        return jax.device_put(x, part.rows(x.ndim))
    return jax.tree.map(put, batch)


# ----------------------------------------------------------------------------- multi-host

# The `config.distributed` section (train and grpo configs share it; jax-free data).
distributed_config = defaults.distributed_config


def initialize_distributed(dcfg) -> None:
    """jax.distributed.initialize from a `distributed_config()` section (no-op unless enabled)."""
    if not dcfg.enabled:
        return
    if dcfg.cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", dcfg.cpu_collectives)
    kw = {}
    if dcfg.coordinator:
        kw["coordinator_address"] = dcfg.coordinator
    if dcfg.num_processes > 0:
        kw["num_processes"] = int(dcfg.num_processes)
    if dcfg.process_id >= 0:
        kw["process_id"] = int(dcfg.process_id)
    jax.distributed.initialize(**kw)
    atexit.register(_shutdown_distributed)  # runs before jax's own exit hook (atexit is LIFO)


# How long the coordinator keeps its service up after its own client has left.
_SERVICE_GRACE_S = 2.0


def _shutdown_distributed() -> None:
    """Leave the job in order at exit: every client leaves first (the client's shutdown is a
    barrier over all processes), and process 0 destroys the coordination service a moment
    later. jax's own exit hook destroys the service right after the barrier, while the other
    processes' last calls can still be in flight; gRPC then aborted process 0 with SIGABRT
    (`Check failed: queue.Pop() == nullptr` in ~RealRequestMatcher) after a finished run."""
    from jax._src import distributed as jd  # the service handle jax.distributed does not expose

    state = jd.global_state
    service, state.service = state.service, None
    jax.distributed.shutdown()  # preemption manager and client; no-op if already shut down
    if service is not None:
        time.sleep(_SERVICE_GRACE_S)
        service.shutdown()
