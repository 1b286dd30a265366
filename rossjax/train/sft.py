"""Masked SFT (the ROSS objective): the jitted train/eval steps; `main` is `rossjax train`.

    L(theta) = - sum_rows sum_t m_t log pi(z_t | z_<t) / sum_rows sum_t m_t

over the *global* batch: each micro-batch contributes the gradient of its NLL *sum* and its
supervised-token count; the step divides once by the total count. Under jit the batch is one
global array sharded over the data axes, so that total already spans devices and hosts. This is
exact gradient accumulation (not the mean of per-micro-batch means).

Train state (a plain dict, what checkpoints hold):
    {"params", "opt_state", "step": int32, "rng": uint32[2], "bad_steps": int32}
Batches: dict of int32 [global_batch, seq] with input_ids, loss_mask, segment_ids, positions
(optionally eligible_mask for the target exclusion rate). The loop lives in loop.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from rossjax import models, sharding
from rossjax.train import losses

BATCH_KEYS = ("input_ids", "loss_mask", "segment_ids", "positions")

# The three recipes of the paper: same rollouts and optimizer, differing only in rows and mask.
# `mask_mode` and `rows` are how the training dir must have been curated (`rossjax curate`).
RECIPES = {
    "ross": dict(mask_mode="annotated", rows="accepted"),
    "ross_no_mask": dict(mask_mode="eligible", rows="accepted"),
    "positive_sft": dict(mask_mode="eligible", rows="verifier_positive"),
}


def batch_nll(model_cfg, params, batch, chunk_size: int):
    """(sum, count, target_mask) of the masked NLL of one [b, s] batch (float32 scalars)."""
    targets, mask = losses.shift_targets(batch["input_ids"], batch["loss_mask"], batch["segment_ids"])
    h = models.hidden_states(model_cfg, params, batch["input_ids"], batch["positions"],
                             batch["segment_ids"])
    if model_cfg.tie_embeddings:  # the [V, d] table as is: no transposed copy, nor of its grad
        w, vocab_major = params["embed"]["embedding"], True
    else:
        w, vocab_major = models.lm_head(model_cfg, params), False
    return losses.chunked_masked_nll(h, w, targets, mask, chunk_size, vocab_major)


def _split_micro(x, n: int, sharding):
    """[B, ...] -> [n, B/n, ...]; micro-batch m takes rows m, m+n, ... so every data shard
    contributes equally to every micro-batch (no cross-device reshuffle)."""
    b = x.shape[0]
    y = x.reshape(b // n, n, *x.shape[1:]).swapaxes(0, 1)
    return y if sharding is None else jax.lax.with_sharding_constraint(y, sharding)


def opt_state_shardings(abstract_opt_state, params_shardings, mesh):
    """Adam moments follow their parameter's sharding; scalars (counts) are replicated."""
    by_path = {jax.tree_util.keystr(p): s
               for p, s in jax.tree_util.tree_flatten_with_path(params_shardings)[0]}
    replicated = NamedSharding(mesh, P())

    def pick(path, leaf):
        key = jax.tree_util.keystr(path)
        for pkey, s in by_path.items():
            if key.endswith(pkey) and len(s.spec) <= len(getattr(leaf, "shape", ())):
                return s
        return replicated

    return jax.tree_util.tree_map_with_path(pick, abstract_opt_state)


def state_shardings(params_shardings, optimizer, abstract_params, mesh):
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    replicated = NamedSharding(mesh, P())
    return {"params": params_shardings,
            "opt_state": opt_state_shardings(abstract_opt, params_shardings, mesh),
            "step": replicated, "rng": replicated, "bad_steps": replicated}


def init_state(params, optimizer, shardings, seed: int = 0):
    """Train state from (already placed) params; the optimizer state is created on the mesh."""
    def make(p):
        return {"params": p, "opt_state": optimizer.init(p), "step": jnp.zeros((), jnp.int32),
                "rng": jax.random.PRNGKey(seed), "bad_steps": jnp.zeros((), jnp.int32)}

    return jax.jit(make, out_shardings=shardings, donate_argnums=0)(params)


def abstract_state(shardings, optimizer, abstract_params):
    """ShapeDtypeStructs with shardings for a checkpoint restore."""
    def make(p):
        return {"params": p, "opt_state": optimizer.init(p), "step": jnp.zeros((), jnp.int32),
                "rng": jax.random.PRNGKey(0), "bad_steps": jnp.zeros((), jnp.int32)}

    shapes = jax.eval_shape(make, abstract_params)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, shardings)


def make_train_step(model_cfg, optimizer, schedule, *, mesh, shardings, batch_sharding,
                    micro_batches: int = 1, chunk_size: int = 1024, rules=None):
    """Jitted `step(state, batch) -> (state, metrics)`; state is donated.

    A step whose loss or gradient norm is not finite leaves params and optimizer state as they
    were and increments `bad_steps` (the loop stops after too many in a row). A batch without
    supervised tokens is skipped too, without counting as bad.
    """
    n = int(micro_batches)

    def micro_sharding(x):
        shape = (n, x.shape[0] // n, *x.shape[1:])
        logical = P(None, "batch", *([None] * (x.ndim - 1)))
        return NamedSharding(mesh, sharding.logical_to_mesh_spec(logical, rules, shape, mesh))

    def step(state, batch):
        params = state["params"]
        batch = {k: batch[k] for k in BATCH_KEYS + (("eligible_mask",) if "eligible_mask" in batch else ())}
        rows = batch["input_ids"].shape[0]
        if rows % n:
            raise ValueError(f"train.global_batch ({rows}) is not divisible by train.micro_batches ({n}).")
        micro = jax.tree.map(lambda x: _split_micro(x, n, micro_sharding(x)), batch)

        def grad_sum(p, mb):
            s, c = batch_nll(model_cfg, p, mb, chunk_size)
            return s, c

        def accumulate(carry, mb):
            g_acc, s_acc, c_acc = carry
            (s, c), g = jax.value_and_grad(grad_sum, has_aux=True)(params, mb)
            g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
            return (g_acc, s_acc + s, c_acc + c), None

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        carry0 = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
        (g_sum, nll_sum, count), _ = jax.lax.scan(accumulate, carry0, micro)
        denom = jnp.maximum(count, 1.0)
        loss = nll_sum / denom
        gnorm = optax.tree.norm(g_sum) / denom
        finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        apply = finite & (count > 0)

        def update(g_sum, opt_state, params):
            # The one division by the global supervised-token count, fused into the update.
            grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), g_sum, params)
            updates, new_opt = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), new_opt

        # A cond, not a select between old and new states: a skipped step never holds both.
        new_params, new_opt = jax.lax.cond(apply, update, lambda g, o, p: (p, o),
                                           g_sum, state["opt_state"], params)
        new_state = {
            "params": new_params,
            "opt_state": new_opt,
            "step": state["step"] + 1,
            "rng": jax.random.fold_in(state["rng"], state["step"]),
            "bad_steps": jnp.where(finite, 0, state["bad_steps"] + 1).astype(jnp.int32),
        }
        tokens = jnp.sum(batch["segment_ids"] > 0)
        metrics = {"loss": loss, "supervised_tokens": count, "tokens": tokens,
                   "grad_norm": gnorm, "lr": schedule(state["step"]),
                   "skipped": 1 - apply.astype(jnp.int32), "bad_steps": new_state["bad_steps"]}
        if "eligible_mask" in batch:
            elig = jnp.sum(batch["eligible_mask"] != 0)
            excluded = jnp.sum((batch["eligible_mask"] != 0) & (batch["loss_mask"] == 0))
            metrics["target_exclusion_rate"] = excluded / jnp.maximum(elig, 1)
        return new_state, metrics

    replicated = NamedSharding(mesh, P())
    return jax.jit(step, in_shardings=(shardings, batch_sharding),
                   out_shardings=(shardings, replicated), donate_argnums=0)


def make_eval_step(model_cfg, *, mesh, params_shardings, batch_sharding, chunk_size: int = 1024):
    """Jitted `eval(params, batch) -> (nll_sum, count)`; the caller adds them up over the eval set."""
    def ev(params, batch):
        return batch_nll(model_cfg, params, batch, chunk_size)

    replicated = NamedSharding(mesh, P())
    return jax.jit(ev, in_shardings=(params_shardings, batch_sharding),
                   out_shardings=(replicated, replicated))


def main(argv) -> int:
    """`rossjax train --config=configs/ross_sft.py --config.model.path=... --workdir=...`."""
    from rossjax.train import loop

    return loop.main(argv)
