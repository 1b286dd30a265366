"""Masked SFT (the ROSS objective): the jitted train/eval steps (`rossjax train` runs loop.run).

    L(theta) = - sum_rows sum_t m_t log pi(z_t | z_<t) / sum_rows sum_t m_t

over the *global* batch: each micro-batch contributes the gradient of its NLL *sum* and its
supervised-token count; the step divides once by the total count. Under jit the batch is one
global array sharded over the data axes, so that total already spans devices and hosts. This is
exact gradient accumulation (not the mean of per-micro-batch means).

Train state: see state.py (shared with GRPO); accumulation and the guarded update: accumulate.py.
Batches: dict of int32 [global_batch, seq] with input_ids, loss_mask, segment_ids, positions
(optionally eligible_mask for the target exclusion rate). The loop lives in loop.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from rossjax import defaults, models, sharding
from rossjax.errors import ConfigError
from rossjax.models import lora
from rossjax.train import accumulate, losses, state as state_lib
from rossjax.train.data import BATCH_KEYS

# The three recipes of the paper (rows and mask a training dir must have been curated with),
# defined as jax-free data so configs and `--help` read them.
RECIPES = defaults.RECIPES


def batch_nll(model_cfg, params, batch, chunk_size: int):
    """(sum, count) of the masked NLL of one [b, s] batch (float32 scalars)."""
    targets, mask = losses.shift_targets(batch["input_ids"], batch["loss_mask"], batch["segment_ids"])
    h = models.hidden_states(model_cfg, params, batch["input_ids"], batch["positions"],
                             batch["segment_ids"])
    w, vocab_major = losses.head_weights(model_cfg, params)
    return losses.chunked_masked_nll(h, w, targets, mask, chunk_size, vocab_major)


def _model_params(params, base, lora_alpha):
    """The params the model runs with: the trained tree, or the frozen base with the trained
    LoRA adapters merged in (W + alpha / rank A @ B, models/lora.py)."""
    return params if lora_alpha is None else lora.merge(base, params, lora_alpha)


def make_train_step(model_cfg, optimizer, schedule, *, mesh, shardings, batch_sharding,
                    micro_batches: int = 1, chunk_size: int = 1024, rules=None,
                    lora_alpha: float | None = None, base_shardings=None):
    """Jitted `step(state, batch) -> (state, metrics)`; state is donated. `mesh` is a
    Partitioner, or a Mesh with `rules`. With `lora_alpha`, state["params"] holds LoRA adapters
    and the step is `step(state, batch, base)`: only the adapters train, the base stays frozen.

    A step whose loss or gradient norm is not finite leaves params and optimizer state as they
    were and increments `bad_steps` (the loop stops after too many in a row). A batch without
    supervised tokens is skipped too, without counting as bad.
    """
    n = int(micro_batches)
    part = sharding.as_partitioner(mesh, rules)

    def step(state, batch, base=None):
        params = state["params"]
        batch = {k: batch[k] for k in BATCH_KEYS + (("eligible_mask",) if "eligible_mask" in batch else ())}
        rows = batch["input_ids"].shape[0]
        if rows % n:
            raise ConfigError(f"train.global_batch ({rows}) is not divisible by train.micro_batches ({n}).")
        micro = accumulate.split_batch(batch, n, part)
        g_sum, (nll_sum, count) = accumulate.accumulate(
            lambda p, mb: batch_nll(model_cfg, _model_params(p, base, lora_alpha), mb, chunk_size),
            params, micro, jnp.zeros((), jnp.float32),
            # an all-padding micro-batch (sequence-count batches leave some) runs no model
            active=lambda mb: jnp.any(mb["segment_ids"] > 0))
        denom = jnp.maximum(count, 1.0)
        loss = nll_sum / denom
        gnorm = optax.tree.norm(g_sum) / denom
        finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        apply = finite & (count > 0)
        # The one division by the global supervised-token count, fused into the update.
        new_params, new_opt = accumulate.apply_if_finite(optimizer, params, state["opt_state"],
                                                         g_sum, apply, denom)
        new_state = state_lib.advance(state, new_params, new_opt, finite)
        tokens = jnp.sum(batch["segment_ids"] > 0)
        # documents in the step: a packed row numbers its own 1..k (segment 0 is padding)
        sequences = jnp.sum(jnp.max(batch["segment_ids"], axis=1))
        metrics = {"loss": loss, "supervised_tokens": count, "tokens": tokens, "sequences": sequences,
                   "grad_norm": gnorm, "lr": schedule(state["step"]),
                   "skipped": 1 - apply.astype(jnp.int32), "bad_steps": new_state["bad_steps"]}
        if "eligible_mask" in batch:
            elig = jnp.sum(batch["eligible_mask"] != 0)
            excluded = jnp.sum((batch["eligible_mask"] != 0) & (batch["loss_mask"] == 0))
            metrics["target_exclusion_rate"] = excluded / jnp.maximum(elig, 1)
        return new_state, metrics

    ins = (shardings, batch_sharding) + ((base_shardings,) if lora_alpha is not None else ())
    return jax.jit(models.transformer.under_mesh(step, part), in_shardings=ins,
                   out_shardings=(shardings, part.replicated()), donate_argnums=0)


def make_eval_step(model_cfg, *, mesh, params_shardings, batch_sharding, chunk_size: int = 1024,
                   lora_alpha: float | None = None, base_shardings=None):
    """Jitted `eval(params, batch) -> (nll_sum, count)`; the caller adds them up over the eval set.
    With `lora_alpha`: `eval(adapters, batch, base)`."""
    def ev(params, batch, base=None):
        return batch_nll(model_cfg, _model_params(params, base, lora_alpha), batch, chunk_size)

    part = sharding.as_partitioner(mesh)
    ins = (params_shardings, batch_sharding) + ((base_shardings,) if lora_alpha is not None else ())
    return jax.jit(models.transformer.under_mesh(ev, part), in_shardings=ins,
                   out_shardings=(part.replicated(), part.replicated()))

