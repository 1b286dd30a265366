"""Gradient accumulation and the guarded update, shared by the SFT and GRPO steps.

A step splits its global batch into micro-batches (`split_batch`), sums per-micro-batch gradients
of *sums* in float32 (`accumulate`), and applies one optimizer update in which the summed gradient
is divided once by the global normalizer (`apply_if_finite`). A step with a non-finite loss or
gradient norm (or nothing to learn from) leaves params and optimizer state as they were: a
`lax.cond`, so a skipped step never holds old and new states at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from rossjax.train import state as state_lib


def split_micro(x, n: int, sharding=None):
    """[B, ...] -> [n, B/n, ...]; micro-batch m takes rows m, m+n, ... so every data shard
    contributes equally to every micro-batch (no cross-device reshuffle)."""
    b = x.shape[0]
    y = x.reshape(b // n, n, *x.shape[1:]).swapaxes(0, 1)
    return y if sharding is None else jax.lax.with_sharding_constraint(y, sharding)


def block_order(order, n: int) -> np.ndarray:
    """`order` (row indices, length B) rearranged so that split_micro hands micro-batch j its
    j-th block of B/n consecutive entries: fed row i*n + j is order[j*B/n + i]."""
    return np.asarray(order).reshape(n, -1).T.reshape(-1)


def split_batch(batch, n: int, partitioner=None):
    """Every [B, ...] array of `batch` -> [n, B/n, ...], rows kept over the batch axes (where
    B/n does not divide over them that layout is dropped with a warning)."""
    rows = next(iter(jax.tree.leaves(batch))).shape[0]
    if rows % n:
        raise ValueError(f"a batch of {rows} rows is not divisible into {n} micro-batches.")

    def one(path, x):
        sh = None
        if partitioner is not None:
            shape = (n, x.shape[0] // n, *x.shape[1:])
            sh = partitioner.sharding(P(None, "batch", *([None] * (x.ndim - 1))), shape,
                                      name=f"micro-batch {jax.tree_util.keystr(path)}",
                                      optional=True)
        return split_micro(x, n, sh)

    return jax.tree_util.tree_map_with_path(one, batch)


def accumulate(loss_fn, params, micro, aux_zeros, active=None, prepare=None):
    """Sum over micro-batches of `loss_fn(params, mb) -> (value, aux)`: returns (float32 sum of
    d value / d params, (sum of values, sum of aux)). `aux_zeros`: float32 zeros shaped like aux.
    `active(mb) -> bool`: a micro-batch for which it is False adds zeros without running the
    model (a `lax.cond`: the all-padding micro-batches of a sequence-count SFT batch).
    `prepare(mb) -> (inputs, ys)`: run once per micro-batch before and outside the gradient (a
    frozen model's forward); the loss is then `loss_fn(params, mb, inputs)` and the result gains
    a third element, every micro-batch's `ys` stacked [n, ...] (zeros where not active)."""
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    carry0 = (zeros, (jnp.zeros((), jnp.float32), aux_zeros))

    def grads(mb):
        inputs, ys = ((), ()) if prepare is None else prepare(mb)
        fn = loss_fn if prepare is None else (lambda p, m: loss_fn(p, m, inputs))
        (value, aux), g = jax.value_and_grad(fn, has_aux=True)(params, mb)
        return jax.tree.map(lambda x: x.astype(jnp.float32), (g, (value, aux))), ys

    def skip(mb):
        if prepare is None:
            return carry0, ()
        ys = jax.eval_shape(lambda m: prepare(m)[1], mb)
        return carry0, jax.tree.map(lambda y: jnp.zeros(y.shape, y.dtype), ys)

    def body(carry, mb):
        out, ys = grads(mb) if active is None else jax.lax.cond(active(mb), grads, skip, mb)
        return jax.tree.map(lambda a, b: a + b, carry, out), ys

    (g_sum, sums), ys = jax.lax.scan(body, carry0, micro)
    return (g_sum, sums) if prepare is None else (g_sum, sums, ys)


def apply_if_finite(optimizer, params, opt_state, g_sum, apply, denom=None):
    """(params, opt_state) after one update with gradient `g_sum / denom` (cast to each param's
    dtype) when `apply`, else unchanged. The one division is fused into the update."""
    def update(g_sum, opt_state, params):
        scaled = g_sum if denom is None else jax.tree.map(lambda g: g / denom, g_sum)
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), scaled, params)
        updates, new_opt = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_opt

    return jax.lax.cond(apply, update, lambda g, o, p: (p, o), g_sum, opt_state, params)


def guarded_update(loss_fn, state, micro, metric_names, optimizer, schedule, prepare=None):
    """One update from micro-batches whose `loss_fn(params, mb) -> (loss share, metrics)` already
    divides by the whole batch's normalizers (the summed shares are the batch's loss and
    gradient): accumulate, apply when loss and gradient norm are finite, advance the state.
    Returns (new state, metrics); shared by the GRPO and distillation updates. With `prepare`
    (see `accumulate`) the loss is `loss_fn(params, mb, inputs)` and the stacked ys come third."""
    g_sum, (loss, m), *ys = accumulate(loss_fn, state["params"], micro,
                                       {k: jnp.zeros((), jnp.float32) for k in metric_names},
                                       prepare=prepare)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), g_sum, state["params"])
    gnorm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
    new_params, new_opt = apply_if_finite(optimizer, state["params"], state["opt_state"], grads,
                                          finite)
    new_state = state_lib.advance(state, new_params, new_opt, finite)
    metrics = {"loss": loss, "grad_norm": gnorm, "lr": schedule(state["step"]),
               "skipped": 1 - finite.astype(jnp.int32), "bad_steps": new_state["bad_steps"], **m}
    return (new_state, metrics) if prepare is None else (new_state, metrics, ys[0])
