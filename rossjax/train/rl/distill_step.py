"""The device side of an on-policy distillation step: teacher log-probs and the jitted update.

Rows are GRPO's completion batch (grpo_step.completion_batch: prompt + sampled completion,
`targets` the next token, `mask` 1 on the completion's tokens), so the per-token terms line up
with the sampler's log-probs and with the history record's `logprobs`.

  teacher_logp(name, params, batch)  log pi_teacher(target) [B, S] at the sampling temperature
                                     from the chunked LM head: the teacher's one forward pass
                                     over the rows routed to it.
  update(state, base, teachers, batch)  one optimizer update over the step's rows, split into
                                     `micro_batches` with exact gradient accumulation (every
                                     micro-batch divides by the whole batch's normalizers).

The loss is `config.distill.loss`, a DISTILL_REGISTRY name. A name with a log-prob form
(distill.TOKEN_FORMS: `reverse_kl_sampled`) runs on the student's chunked token log-probs and
the stored teacher log-probs: no [B, S, V] tensor, no teacher in the update. Any other name
(`reverse_kl_full`, a user's module:function) needs both full distributions: the update runs
every teacher over the micro-batch (stop-gradient) and takes each row's own teacher's logits;
with several teachers that is one forward per teacher per row, the price of the exact KL.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from rossjax import models, sharding
from rossjax.train import accumulate
from rossjax.train.rl import distill, grpo_step
from rossjax.train.rl.aggregation import AGGREGATION_REGISTRY, masked, normalizers

KEYS = (*grpo_step.BATCH_KEYS, "teacher_logp", "teacher_idx")
METRICS = ("kl_sampled", "student_logp")


def full_logits(model_cfg, params, batch):
    """[B, S, V] float32 logits of the rows (only the full-vocabulary losses need them)."""
    logits, _ = models.forward(model_cfg, params, batch["tokens"], batch["positions"],
                               batch["segment_ids"])
    return logits.astype(jnp.float32)


def make_loss_fn(student_cfg, teacher_cfgs, *, loss: str, agg: str, temperature: float,
                 chunk: int, lora_alpha):
    """`loss_fn(trainable, base, teachers, norm, mb) -> (loss share, metric shares)`."""
    token_form = distill.TOKEN_FORMS.get(loss)
    fn = None if token_form else distill.DISTILL_REGISTRY.get(loss)

    def loss_fn(trainable, base, teachers, norm, mb):
        params = grpo_step.policy_params(trainable, base, lora_alpha)
        mask = mb["mask"].astype(jnp.float32)
        if token_form is not None:
            lps = grpo_step.token_logprobs(student_cfg, params, mb, chunk, False, temperature)
            per = token_form(lps, mb["teacher_logp"])
        else:
            s_logits = full_logits(student_cfg, params, mb)
            t_logits = jnp.zeros_like(s_logits)
            for k, (tcfg, tparams) in enumerate(zip(teacher_cfgs, teachers)):
                mine = (mb["teacher_idx"] == k)[:, None, None]
                t_logits = jnp.where(mine, jax.lax.stop_gradient(
                    full_logits(tcfg, tparams, mb)), t_logits)
            per = fn(s_logits, t_logits, mb["targets"], temperature)
            lps = jnp.take_along_axis(jax.nn.log_softmax(s_logits / temperature, -1),
                                      mb["targets"][..., None], -1)[..., 0]
        value = AGGREGATION_REGISTRY.get(agg)(per, mask, norm[0])
        lps = jax.lax.stop_gradient(lps)
        cnt = norm[1]
        return value, {"kl_sampled": masked(lps - mb["teacher_logp"], mask).sum() / cnt,
                       "student_logp": masked(lps, mask).sum() / cnt}
    return loss_fn


def make_update(loss_fn, optimizer, schedule, *, agg: str, n_micro: int, partitioner,
                max_new: int):
    """`update(state, base, teachers, batch) -> (state, metrics)`: the GRPO update's shape."""
    def update(state, base, teachers, batch):
        norm = normalizers(batch["mask"], agg, max_new)
        micro = accumulate.split_batch(batch, n_micro, partitioner)
        return accumulate.guarded_update(lambda t, mb: loss_fn(t, base, teachers, norm, mb),
                                         state, micro, METRICS, optimizer, schedule)
    return update


class DistillFns:
    """Jitted teacher log-probs (one program per teacher) and the update (state donated).
    `teachers`: name -> (ModelConfig, param shardings), in the order of `teacher_idx`."""

    def __init__(self, student_cfg, teachers: dict, optimizer, schedule, *, partitioner,
                 param_shardings, state_shardings, base_shardings, lora_alpha, loss: str,
                 agg: str, temperature: float, chunk: int, micro_batches: int, max_new: int):
        part = self.partitioner = partitioner
        # LoRA: the sampler's weights, base + adapters (grpo_setup.Run.policy calls it)
        self.merge = jax.jit(lambda t, b: grpo_step.policy_params(t, b, lora_alpha),
                             in_shardings=(state_shardings["params"], base_shardings),
                             out_shardings=param_shardings)
        self.names = list(teachers)
        self.row_sharding = rows = part.sharding(P("batch", None))
        self.full = loss not in distill.TOKEN_FORMS
        row_in = {k: rows for k in grpo_step.BATCH_KEYS}
        programs = {}  # one program per teacher architecture (teachers of one shape share it)
        for tcfg, tsh in teachers.values():
            if tcfg not in programs:
                programs[tcfg] = jax.jit(models.transformer.under_mesh(
                    lambda p, b, tcfg=tcfg: grpo_step.token_logprobs(tcfg, p, b, chunk, False,
                                                                     temperature), part),
                    in_shardings=(tsh, row_in), out_shardings=rows)
        self._teacher = {name: programs[tcfg] for name, (tcfg, _) in teachers.items()}
        tcfgs = [tcfg for tcfg, _ in teachers.values()]
        loss_fn = make_loss_fn(student_cfg, tcfgs, loss=loss, agg=agg, temperature=temperature,
                               chunk=chunk, lora_alpha=lora_alpha)
        step = make_update(loss_fn, optimizer, schedule, agg=agg, n_micro=micro_batches,
                           partitioner=part, max_new=max_new)
        bsh = {k: rows for k in KEYS}
        bsh["teacher_idx"] = part.sharding(P("batch"))
        # the sampled-token loss reads no teacher in the update: pass none (nothing to transfer)
        tsh = tuple(sh for _, sh in teachers.values()) if self.full else ()
        self._update = jax.jit(models.transformer.under_mesh(step, part),
                               in_shardings=(state_shardings, base_shardings, tsh, bsh),
                               out_shardings=(state_shardings, part.replicated()),
                               donate_argnums=0)

    def put_rows(self, arrays: dict) -> dict:
        """Host arrays (the same on every process) -> global arrays, rows over the batch axes."""
        vec = self.partitioner.sharding(P("batch"))
        return {k: sharding.from_host(v, vec if np.ndim(v) == 1 else self.row_sharding)
                for k, v in arrays.items()}

    def teacher_logp(self, name: str, params, host_rows: dict, multiple: int = 1) -> np.ndarray:
        """The teacher's log-probs [n, S] of `host_rows` (n rows of BATCH_KEYS), padded to a
        bucket (a power of two rounded up to `multiple`, at most one compile per bucket)."""
        n = len(host_rows["tokens"])
        bucket = grpo_step.round_up(1 << max(0, (n - 1).bit_length()), multiple)
        padded = {k: np.concatenate([v, np.zeros((bucket - n, *v.shape[1:]), v.dtype)])
                  for k, v in host_rows.items()}
        out = self._teacher[name](params, self.put_rows(padded))
        return np.asarray(sharding.to_host(out))[:n]

    def update(self, state, base, teachers: tuple, batch):
        return self._update(state, base, teachers if self.full else (), batch)
