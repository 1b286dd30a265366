"""The activation-sharding context: which mesh axes split a step's rows (and kv heads) while it is
traced inside models.transformer.shard_activations. The model keeps its residual stream on these
axes; the fused kernels (splash) read it to run per shard under shard_map. It lives here, below
both, so the kernels read it without importing the model.

It also says which platform a program is compiled for (`target_device`): the devices of the
mesh being traced for, never the host's default backend, so a program lowered on a CPU host for
a TPU topology (`rossjax plan`) gets the TPU kernels."""

from __future__ import annotations

import contextlib
import contextvars
from typing import NamedTuple

import jax
from jax.sharding import Mesh


class Activations(NamedTuple):
    """Hashable (jitted model functions take it as a static argument)."""
    mesh: Mesh
    batch: tuple[str, ...]      # mesh axes (size > 1) the rows [b, ...] are split over
    kv_heads: tuple[str, ...]   # mesh axes (size > 1) the "kv_heads" rule names; used where they
                                # divide the model's kv head count


CURRENT: contextvars.ContextVar[Activations | None] = contextvars.ContextVar(
    "rossjax_activation_sharding", default=None)


def current() -> Activations | None:
    return CURRENT.get()


# Set by `target(mesh)` where a program is lowered for devices that the activation context does
# not name (a one-device mesh has no split axes, so `current()` is None there).
TARGET: contextvars.ContextVar = contextvars.ContextVar("rossjax_target_device", default=None)


@contextlib.contextmanager
def target(mesh_or_device):
    """Trace under this to compile for `mesh_or_device` (a Mesh or a Device)."""
    dev = (mesh_or_device.devices.flat[0] if isinstance(mesh_or_device, Mesh)
           else mesh_or_device)
    token = TARGET.set(dev)
    try:
        yield
    finally:
        TARGET.reset(token)


def target_device():
    """The device kind a program being traced runs on: `target(...)`'s, else the activation
    context's mesh, else jax's default device (a program without a mesh runs there)."""
    dev = TARGET.get()
    if dev is not None:
        return dev
    act = current()
    if act is not None:
        return act.mesh.devices.flat[0]
    return jax.devices()[0]


def target_platform() -> str:
    """"tpu" | "gpu" | "cpu" of `target_device()`."""
    return target_device().platform
