"""The device side of a GRPO step: completion batches, log-probs, the jitted policy update.

Batch layout: row r = prompt + completion of candidate r (prompt i's G samples are rows
i*G .. i*G+G-1, the sampler's order), right-padded to S with segment id 0. `targets[r, p]` is
token p+1 and `mask[r, p] = 1` where token p+1 is a generated token (the stop token included),
so `token_logprobs` at masked positions are exactly the completion's log-probs and the GRPO loss
runs on [B, S] with that mask.

Train state (what checkpoints hold): the SFT trainer's (`sft.init_state`), with "params" the
trainable tree (full params, or LoRA adapters). With LoRA the frozen base is a separate, non-donated
argument and the reference is that base with the adapters off.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from rossjax import models, sharding
from rossjax.models import lora
from rossjax.train import grpo_losses, losses, sft

BATCH_KEYS = ("tokens", "positions", "segment_ids", "targets", "mask")
_METRICS = ("pg_loss", "kl", "clip_frac_low", "clip_frac_high", "ratio_mean")  # grpo_loss's


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def completion_batch(prompts, gen, num_samples: int, seq_len: int) -> dict:
    """numpy [B, S] arrays for the sampled candidates (see module doc) + sampler log-probs."""
    b = len(gen.lengths)
    out = {k: np.zeros((b, seq_len), np.int32) for k in BATCH_KEYS}
    out["sampler_logp"] = np.zeros((b, seq_len), np.float32)
    for r in range(b):
        p = prompts[r // num_samples]
        n = int(gen.lengths[r])
        seq = list(p) + gen.tokens[r, :n].tolist()
        if len(seq) > seq_len:
            raise ValueError(f"grpo: a {len(seq)}-token sequence exceeds the batch length {seq_len}.")
        out["tokens"][r, :len(seq)] = seq
        out["positions"][r, :len(seq)] = np.arange(len(seq))
        out["segment_ids"][r, :len(seq)] = 1
        out["targets"][r, :len(seq) - 1] = seq[1:]
        out["mask"][r, len(p) - 1:len(seq) - 1] = 1
        out["sampler_logp"][r, len(p) - 1:len(seq) - 1] = gen.logprobs[r, :n]
    return out


def policy_params(trainable, base, lora_alpha):
    return trainable if lora_alpha is None else lora.merge(base, trainable, lora_alpha)


def logp_entropy(model_cfg, params, batch, chunk: int):
    """(log p(target) [B, S], entropy of the next-token distribution [B, S]) in float32, one
    block of positions at a time so [B, S, V] logits never exist at once."""
    h = models.hidden_states(model_cfg, params, batch["tokens"], batch["positions"],
                             batch["segment_ids"])
    w = models.lm_head(model_cfg, params)
    b, s, d = h.shape
    c = max(1, min(chunk, s))
    pad = (-s) % c
    hp = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(b, -1, c, d).swapaxes(0, 1)
    tp = jnp.pad(batch["targets"], ((0, 0), (0, pad))).reshape(b, -1, c).swapaxes(0, 1)

    def block(xs):
        hb, tb = xs
        logits = jnp.einsum("bcd,dv->bcv", hb, w.astype(hb.dtype), preferred_element_type=jnp.float32)
        lsm = jax.nn.log_softmax(logits, axis=-1)
        lp = jnp.take_along_axis(lsm, tb[..., None], axis=-1)[..., 0]
        ent = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)
        return lp, ent

    lp, ent = jax.lax.map(block, (hp, tp))
    fix = lambda x: x.swapaxes(0, 1).reshape(b, -1)[:, :s]
    return fix(lp), fix(ent)


class StepFns:
    """Jitted pieces with explicit shardings: merge, log-probs, update (state donated)."""

    def __init__(self, model_cfg, optimizer, schedule, *, mesh, param_shardings, state_shardings,
                 base_shardings, lora_alpha, loss_cfg, chunk: int, max_new: int):
        self.lora_alpha = lora_alpha
        rows = NamedSharding(mesh, P(*self._batch_spec(mesh)))
        repl = NamedSharding(mesh, P())
        bsh = {k: rows for k in (*BATCH_KEYS, "old_logp", "ref_logp", "is_weights")}
        bsh["adv"] = NamedSharding(mesh, P(self._batch_spec(mesh)[0]))
        self.row_sharding = rows
        train_sh = state_shardings["params"]

        self.merge = jax.jit(lambda t, b: policy_params(t, b, lora_alpha),
                             in_shardings=(train_sh, base_shardings), out_shardings=param_shardings)
        lp = functools.partial(logp_entropy, model_cfg, chunk=chunk)
        self.logp = jax.jit(lambda p, batch: lp(p, batch),
                            in_shardings=(param_shardings, {k: rows for k in BATCH_KEYS}),
                            out_shardings=(rows, rows))
        c = loss_cfg

        n_micro = int(c.micro_batches)

        def micro_sharding(x):  # [n, rows / n, ...]: rows stay split over the data axes
            shape = (n_micro, x.shape[0] // n_micro, *x.shape[1:])
            logical = P(None, "batch", *([None] * (x.ndim - 1)))
            return NamedSharding(mesh, sharding.logical_to_mesh_spec(logical, None, shape, mesh))

        def step(state, base, batch):
            # Exact gradient accumulation: every micro-batch divides by the whole minibatch's
            # normalizers, so the summed shares are the minibatch's loss and gradient.
            norm = grpo_losses.normalizers(batch["mask"], c.agg, max_new)
            micro = jax.tree.map(lambda x: sft._split_micro(x, n_micro, micro_sharding(x)), batch)

            def loss_fn(trainable, mb):
                params = policy_params(trainable, base, lora_alpha)
                h = models.hidden_states(model_cfg, params, mb["tokens"], mb["positions"],
                                         mb["segment_ids"])
                logp = losses.chunked_token_logprobs(h, models.lm_head(model_cfg, params),
                                                     mb["targets"], chunk)
                return grpo_losses.grpo_loss(
                    logp, mb["old_logp"], mb["ref_logp"] if c.beta else None, mb["adv"],
                    mb["mask"], c.eps_low, c.eps_high, c.beta, c.agg,
                    is_weights=mb["is_weights"] if c.is_mode != "none" else None,
                    max_len=max_new, norm=norm)

            def accumulate(acc, mb):
                (loss, m), g = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], mb)
                return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), acc,
                                    (g, {"loss": loss, **m})), None

            zeros = (jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state["params"]),
                     {k: jnp.zeros((), jnp.float32) for k in ("loss", *_METRICS)})
            (grads, m), _ = jax.lax.scan(accumulate, zeros, micro)
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state["params"])
            loss = m.pop("loss")
            gnorm = optax.tree.norm(grads)
            finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
            updates, new_opt = optimizer.update(grads, state["opt_state"], state["params"])
            new_params = optax.apply_updates(state["params"], updates)
            keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
            new_state = {"params": keep(new_params, state["params"]),
                         "opt_state": keep(new_opt, state["opt_state"]),
                         "step": state["step"] + 1,
                         "rng": jax.random.fold_in(state["rng"], state["step"]),
                         "bad_steps": jnp.where(finite, 0, state["bad_steps"] + 1).astype(jnp.int32)}
            return new_state, {"loss": loss, "grad_norm": gnorm, "lr": schedule(state["step"]),
                               "skipped": 1 - finite.astype(jnp.int32),
                               "bad_steps": new_state["bad_steps"], **m}

        self.update = jax.jit(step, in_shardings=(state_shardings, base_shardings, bsh),
                              out_shardings=(state_shardings, repl), donate_argnums=0)

    @staticmethod
    def _batch_spec(mesh):
        return sharding.logical_to_mesh_spec(P("batch", None), None, None, mesh)

    def put_rows(self, arrays: dict) -> dict:
        """Host arrays (the same on every process) -> global arrays, rows over the batch axes."""
        adv_sh = NamedSharding(self.row_sharding.mesh, P(self.row_sharding.spec[0]))
        return {k: sharding.from_host(v, adv_sh if np.ndim(v) == 1 else self.row_sharding)
                for k, v in arrays.items()}
