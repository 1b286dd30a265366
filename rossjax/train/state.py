"""The train state both trainers (SFT and GRPO) hold and checkpoint, and where it lives.

    {"params", "opt_state", "step": int32, "rng": uint32[2], "bad_steps": int32}

"params" is the trainable tree (full params, or LoRA adapters in GRPO). Optimizer moments follow
their parameter's sharding; scalars are replicated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P


def _mesh(mesh):
    return getattr(mesh, "mesh", mesh)  # a Partitioner or a Mesh


def _new(params, optimizer, seed: int):
    return {"params": params, "opt_state": optimizer.init(params), "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.PRNGKey(seed), "bad_steps": jnp.zeros((), jnp.int32)}


def opt_state_shardings(abstract_opt_state, params_shardings, mesh):
    """Adam moments follow their parameter's sharding; scalars (counts) are replicated."""
    by_path = {jax.tree_util.keystr(p): s
               for p, s in jax.tree_util.tree_flatten_with_path(params_shardings)[0]}
    replicated = NamedSharding(_mesh(mesh), P())

    def pick(path, leaf):
        key = jax.tree_util.keystr(path)
        for pkey, s in by_path.items():
            if key.endswith(pkey) and len(s.spec) <= len(getattr(leaf, "shape", ())):
                return s
        return replicated

    return jax.tree_util.tree_map_with_path(pick, abstract_opt_state)


def state_shardings(params_shardings, optimizer, abstract_params, mesh):
    """NamedShardings of the whole state; `mesh` is a Mesh or a Partitioner."""
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    replicated = NamedSharding(_mesh(mesh), P())
    return {"params": params_shardings,
            "opt_state": opt_state_shardings(abstract_opt, params_shardings, mesh),
            "step": replicated, "rng": replicated, "bad_steps": replicated}


def init_state(params, optimizer, shardings, seed: int = 0):
    """Train state from (already placed) params; the optimizer state is created on the mesh."""
    return jax.jit(lambda p: _new(p, optimizer, seed), out_shardings=shardings,
                   donate_argnums=0)(params)


def abstract_state(shardings, optimizer, abstract_params):
    """ShapeDtypeStructs with shardings for a checkpoint restore."""
    shapes = jax.eval_shape(lambda p: _new(p, optimizer, 0), abstract_params)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, shardings)


def advance(state, params, opt_state, finite):
    """The state after one step: new params/optimizer state, step + 1, the next RNG, and the
    count of non-finite steps in a row (reset by a finite one)."""
    return {"params": params,
            "opt_state": opt_state,
            "step": state["step"] + 1,
            "rng": jax.random.fold_in(state["rng"], state["step"]),
            "bad_steps": jnp.where(finite, 0, state["bad_steps"] + 1).astype(jnp.int32)}
