"""The activation-sharding context: which mesh axes split a step's rows (and kv heads) while it is
traced inside models.transformer.shard_activations. The model keeps its residual stream on these
axes; the fused kernels (splash) read it to run per shard under shard_map. It lives here, below
both, so the kernels read it without importing the model."""

from __future__ import annotations

import contextvars
from typing import NamedTuple

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
