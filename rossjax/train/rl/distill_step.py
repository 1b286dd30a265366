"""The device side of an on-policy distillation step: teacher log-probs and the jitted update.

Rows are GRPO's completion batch (grpo_step.completion_batch: prompt + sampled completion,
`targets` the next token, `mask` 1 on the completion's tokens), so the per-token terms line up
with the sampler's log-probs and with the history record's `logprobs`.

  teacher_logp(name, params, batch)  log pi_teacher(target) [B, S] at the sampling temperature
                                     from the chunked LM head: the teacher's one forward pass
                                     over the rows routed to it (the sampled-token losses).
  update(state, base, teachers, rows)  one optimizer update over the step's rows, split into
                                     `micro_batches` with exact gradient accumulation (every
                                     micro-batch divides by the whole batch's normalizers).

The loss is `config.distill.loss`, a DISTILL_REGISTRY name. A name with a log-prob form
(distill.TOKEN_FORMS: `reverse_kl_sampled`) runs on the student's chunked token log-probs and
the teacher log-probs of the scoring pass above: no [B, S, V] tensor, no teacher in the update.
Any other name (`reverse_kl_full`, a user's module:function) needs both full distributions, so
the update is the teachers' only pass: per micro-batch, before and outside the gradient
(make_teacher_fn, accumulate's `prepare`), each teacher with a row there runs once (a
`lax.cond` skips the others) and each row takes its own teacher's logits; the update also
returns those logits' sampled-token log-probs at the sampling temperature [B, S], which the
history stores. With several teachers the rows go in grouped by teacher (group_order), so a
teacher runs over its own rows plus at most one shared micro-batch at each teacher boundary.
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


def teacher_forward(teacher_cfg, params, mb):
    """One teacher's forward over a micro-batch (a seam of its own: the tests count its runs)."""
    return full_logits(teacher_cfg, params, mb)


def teacher_logits(teacher_cfgs, teachers, mb):
    """[m, S, V] float32, stop-gradient: each row's own teacher's logits (`mb["teacher_idx"]`).
    A teacher runs only on a micro-batch that holds one of its rows (a `lax.cond`), so rows
    grouped by teacher (`group_order`) run each teacher over its own micro-batches."""
    if len(teachers) == 1:
        return jax.lax.stop_gradient(teacher_forward(teacher_cfgs[0], teachers[0], mb))
    shape = jax.eval_shape(lambda p: teacher_forward(teacher_cfgs[0], p, mb), teachers[0])
    out = jnp.zeros(shape.shape, jnp.float32)
    for k, (tcfg, tparams) in enumerate(zip(teacher_cfgs, teachers)):
        mine = mb["teacher_idx"] == k

        def run(acc, tcfg=tcfg, tparams=tparams, mine=mine):
            return jnp.where(mine[:, None, None], teacher_forward(tcfg, tparams, mb), acc)
        out = jax.lax.cond(mine.any(), run, lambda acc: acc, out)
    return jax.lax.stop_gradient(out)


def target_logp(logits, targets, temperature: float):
    """log softmax(logits / T)[target] [B, S] float32."""
    x = logits / temperature
    picked = jnp.take_along_axis(x, targets[..., None], -1)[..., 0]
    return picked - jax.nn.logsumexp(x, axis=-1)


def make_teacher_fn(teacher_cfgs, temperature: float):
    """`prepare(teachers, mb) -> ((teacher logits, teacher log-probs), log-probs * mask)`: the
    full-vocabulary update's one teacher pass per micro-batch, before and outside the gradient;
    the masked log-probs [m, S] are what the history's `teacher_logprobs` come from."""
    def prepare(teachers, mb):
        t_logits = teacher_logits(teacher_cfgs, teachers, mb)
        t_lp = target_logp(t_logits, mb["targets"], temperature)
        return (t_logits, t_lp), t_lp * mb["mask"].astype(jnp.float32)
    return prepare


def make_loss_fn(student_cfg, teacher_cfgs, *, loss: str, agg: str, temperature: float,
                 chunk: int, lora_alpha):
    """`loss_fn(trainable, base, teachers, norm, mb, teacher=None) -> (loss share, metric
    shares)`. The full-vocabulary losses take `teacher` = (logits, log-probs) from
    make_teacher_fn's pass (the update's way); without it they run the teachers themselves."""
    token_form = distill.TOKEN_FORMS.get(loss)
    fn = None if token_form else distill.DISTILL_REGISTRY.get(loss)

    def loss_fn(trainable, base, teachers, norm, mb, teacher=None):
        params = grpo_step.policy_params(trainable, base, lora_alpha)
        mask = mb["mask"].astype(jnp.float32)
        if token_form is not None:
            lps = grpo_step.token_logprobs(student_cfg, params, mb, chunk, False, temperature)
            t_lp = mb["teacher_logp"]
            per = token_form(lps, t_lp)
        else:
            if teacher is None:
                teacher = make_teacher_fn(teacher_cfgs, temperature)(teachers, mb)[0]
            t_logits, t_lp = teacher
            s_logits = full_logits(student_cfg, params, mb)
            per = fn(s_logits, t_logits, mb["targets"], temperature)
            lps = target_logp(s_logits, mb["targets"], temperature)
        value = AGGREGATION_REGISTRY.get(agg)(per, mask, norm[0])
        lps = jax.lax.stop_gradient(lps)
        cnt = norm[1]
        return value, {"kl_sampled": masked(lps - t_lp, mask).sum() / cnt,
                       "student_logp": masked(lps, mask).sum() / cnt}
    return loss_fn


def merge_micro(y):
    """accumulate.split_micro's inverse: [n, B/n, ...] -> [B, ...] in the batch's row order."""
    return y.swapaxes(0, 1).reshape(-1, *y.shape[2:])


def group_order(teacher_idx, n_micro: int) -> np.ndarray:
    """The row order that fills whole micro-batches with one teacher's rows where it can: fed
    row i*n + j (micro-batch j, split_micro's strided split) is the (j*m + i)-th row sorted by
    teacher. At most (teachers - 1) micro-batches then hold two teachers."""
    return accumulate.block_order(np.argsort(np.asarray(teacher_idx), kind="stable"), n_micro)


def make_update(loss_fn, optimizer, schedule, *, agg: str, n_micro: int, partitioner,
                max_new: int, prepare=None):
    """`update(state, base, teachers, batch) -> (state, metrics)`: the GRPO update's shape. With
    `prepare` (make_teacher_fn, the full-vocabulary losses) it returns a third output, the
    teachers' masked sampled-token log-probs [B, S] in the batch's row order."""
    def update(state, base, teachers, batch):
        norm = normalizers(batch["mask"], agg, max_new)
        micro = accumulate.split_batch(batch, n_micro, partitioner)
        if prepare is None:
            return accumulate.guarded_update(lambda t, mb: loss_fn(t, base, teachers, norm, mb),
                                             state, micro, METRICS, optimizer, schedule)
        state, m, t_lp = accumulate.guarded_update(
            lambda t, mb, x: loss_fn(t, base, teachers, norm, mb, x), state, micro, METRICS,
            optimizer, schedule, prepare=lambda mb: prepare(teachers, mb))
        return state, m, merge_micro(t_lp)
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
        self.micro_batches = micro_batches
        step = make_update(loss_fn, optimizer, schedule, agg=agg, n_micro=micro_batches,
                           partitioner=part, max_new=max_new,
                           prepare=make_teacher_fn(tcfgs, temperature) if self.full else None)
        # the full losses score in the update: no stored teacher log-probs go in, theirs come out
        bsh = {k: rows for k in KEYS if not (self.full and k == "teacher_logp")}
        bsh["teacher_idx"] = part.sharding(P("batch"))
        # the sampled-token loss reads no teacher in the update: pass none (nothing to transfer)
        tsh = tuple(sh for _, sh in teachers.values()) if self.full else ()
        outs = (state_shardings, part.replicated(), *((rows,) if self.full else ()))
        self._update = jax.jit(models.transformer.under_mesh(step, part),
                               in_shardings=(state_shardings, base_shardings, tsh, bsh),
                               out_shardings=outs, donate_argnums=0)

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

    def update(self, state, base, teachers: tuple, host_rows: dict):
        """One update on host rows (KEYS; in full mode without `teacher_logp`) -> (state,
        metrics on the host, the teachers' masked log-probs [B, S] from the update's own
        teacher pass in full mode, else None). Full mode with several teachers feeds the rows
        grouped by teacher (group_order) and puts the log-probs back in the rows' order."""
        if not self.full:
            state, m = self._update(state, base, (), self.put_rows(host_rows))
            return state, jax.device_get(m), None
        order = (group_order(host_rows["teacher_idx"], self.micro_batches)
                 if len(self.names) > 1 else None)
        fed = host_rows if order is None else {k: v[order] for k, v in host_rows.items()}
        state, m, t_lp = self._update(state, base, teachers, self.put_rows(fed))
        m, t_lp = jax.device_get(m), np.asarray(sharding.to_host(t_lp))
        if order is not None:
            t_lp = t_lp[np.argsort(order)]
        return state, m, t_lp
