"""The device side of a GRPO step: completion batches, log-probs, the jitted policy update.

Batch layout: row r = prompt + completion of candidate r (prompt i's G samples are rows
i*G .. i*G+G-1, the sampler's order), right-padded to S with segment id 0. `targets[r, p]` is
token p+1 and `mask[r, p] = 1` where token p+1 is a generated token (the stop token included),
so `token_logprobs` at masked positions are exactly the completion's log-probs and the GRPO loss
runs on [B, S] with that mask.

Train state (what checkpoints hold): the SFT trainer's (`state.init_state`), with "params" the
trainable tree (full params, or LoRA adapters). With LoRA the frozen base is a separate, non-donated
argument and the reference is that base with the adapters off.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from rossjax import models, sharding
from rossjax.models import lora
from rossjax.train import accumulate, losses
from rossjax.train.rl import grpo_losses, packed_prompt

BATCH_KEYS = ("tokens", "positions", "segment_ids", "targets", "mask")
_METRICS = ("pg_loss", "kl", "clip_frac_low", "clip_frac_high", "ratio_mean")  # grpo_loss's
# What an on-policy update measures itself (the separate log-prob pass it replaces gave them):
# entropy, and with grpo.is_mode the sampler-mismatch metrics.
ON_POLICY_METRICS = ("entropy",)
IS_METRICS = ("is_outside_frac", "is_weight_mean")


def on_policy(g) -> bool:
    """One update per step on the whole batch (one minibatch, one iteration): the old policy is
    the policy being updated, so its log-probs are the update's own (ratio 1 by construction,
    the gradient of the ratio that of log p) and the separate old-policy forward is skipped.
    DAPO's dynamic sampling keeps the separate pass (its refill rounds score as they come)."""
    rows = int(g.contexts) * int(g.group_size)
    mb = int(g.get("minibatch", 0)) or rows // max(1, int(g.get("minibatches", 1)))
    return int(g.num_iterations) == 1 and mb == rows and not g.get("dynamic_sampling", False)


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def batch_length(n: int, floor: int = 0) -> int:
    """The batch length S for rows of up to `n` tokens: `n` rounded up to a 16th of its power of
    two (multiples of 16 up to 256, of 128 in (1024, 2048]: at most 1/8 padding past 256), and never
    below `floor` (the longest S of the run so far). Per-step prompt lengths vary (PROPEL Math
    draws its examples per prompt); rounding to 16 alone gave a new S, so a new update and
    log-prob program (~10 s to compile each on CPU), nearly every step."""
    n = max(int(n), 1)
    return max(int(floor), round_up(n, max(16, (1 << (n - 1).bit_length()) // 16)))


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


def sampling_temperature(temperature: float) -> float:
    """The T of the distribution the sampler draws from, softmax(logits / T): greedy (T = 0)
    reports log-probs at T = 1, as rossjax.sample does."""
    return float(temperature) if temperature > 0 else 1.0


def token_logprobs(model_cfg, params, batch, chunk: int, with_entropy: bool = False,
                   temperature: float = 1.0):
    """log p(target) [B, S] float32 under softmax(logits / temperature) (with `with_entropy`,
    also that distribution's entropy [B, S]), from the chunked LM head
    (`losses.chunked_token_logprobs`): [B, S, V] logits never exist."""
    h = models.hidden_states(model_cfg, params, batch["tokens"], batch["positions"],
                             batch["segment_ids"])
    w, vocab_major = losses.head_weights(model_cfg, params)
    return losses.chunked_token_logprobs(h, w, batch["targets"], chunk, vocab_major, with_entropy,
                                         temperature)


def shared_prompt_ok(batch, group: int, max_new: int) -> bool:
    """Whether host arrays hold the sampler's group layout that shared_prompt_logprobs needs:
    rows i*G .. i*G+G-1 with the same tokens and positions before their first trained position
    p0 (the same p0 in a group), one segment each, and each row's tokens from p0 on at most
    max_new + 1 long (rows with nothing trained only need to be one segment)."""
    tok, pos, seg, mask = (np.asarray(batch[k]) for k in ("tokens", "positions", "segment_ids",
                                                           "mask"))
    b, s = tok.shape
    pp = s - max_new - 1
    if group < 2 or b % group or pp < 1:
        return False
    col = np.arange(s)
    end = (seg > 0).sum(1)
    if not np.array_equal(seg, (col[None] < end[:, None]).astype(seg.dtype)):
        return False
    has = (mask > 0).any(1)
    first = np.where(has, np.argmax(mask > 0, axis=1), 0)
    for i in range(0, b, group):
        rows = range(i, i + group)
        p0 = int(first[rows][has[rows]].max()) if has[rows].any() else 0
        if p0 > pp:
            return False
        for r in rows:
            if has[r] and (first[r] != p0 or end[r] - p0 > max_new + 1):
                return False
            if not (np.array_equal(tok[r, :p0], tok[i, :p0])
                    and np.array_equal(pos[r, :p0], pos[i, :p0])):
                return False
    return True


def shared_prompt_logprobs(model_cfg, params, batch, chunk: int, with_entropy: bool,
                           temperature: float, group: int, max_new: int):
    """token_logprobs with each group's prompt run once, for a batch that passes
    shared_prompt_ok: the prefix [0, p0) of each group's first row is prefilled into a KV cache
    once and repeated G times, and each row's block [p0, p0 + max_new + 1) runs over it
    (models.transformer.hidden_states_cached). Every block token sees that prefix and its own
    earlier tokens, as in the row: the same log-probs (f32 rounding apart) from ~1/G of the
    prompt's forward and backward; the prefix's gradient is the sum over its G uses."""
    s = batch["tokens"].shape[1]
    c, pp = max_new + 1, s - max_new - 1      # pp >= p0 when s >= prompt + max_new
    tok, pos, seg, tgt, mask = (jnp.asarray(batch[k]) for k in BATCH_KEYS)
    col = jnp.arange(s, dtype=jnp.int32)
    take = lambda x, idx: jnp.take_along_axis(x, jnp.clip(idx, 0, s - 1), axis=1)
    cache, per_layer, p0g = packed_prompt.prompt_cache(model_cfg, params, tok, pos, mask, group,
                                                       pp, s)
    p0 = jnp.repeat(p0g, group)
    end = jnp.sum(seg > 0, axis=1, dtype=jnp.int32)
    rep = lambda x, ax: jnp.repeat(x, group, axis=ax)
    kv = (lambda x: tuple(rep(a, 0) for a in x)) if per_layer else (lambda x: rep(x, 1))
    cache = {"k": kv(cache["k"]), "v": kv(cache["v"]), "mask": rep(cache["mask"], 0),
             "pos": rep(cache["pos"], 0)}
    bsrc = p0[:, None] + jnp.arange(c, dtype=jnp.int32)[None]
    bvalid = bsrc < end[:, None]
    h, _ = models.transformer.hidden_states_cached(
        model_cfg, params, jnp.where(bvalid, take(tok, bsrc), 0),
        jnp.where(bvalid, take(pos, bsrc), 0), cache, pp, bvalid)
    w, vocab_major = losses.head_weights(model_cfg, params)
    out = losses.chunked_token_logprobs(h, w, jnp.where(bvalid, take(tgt, bsrc), 0), chunk,
                                        vocab_major, with_entropy, temperature)
    k = col[None] - p0[:, None]              # row position -> block position
    back = lambda x: jnp.where((k >= 0) & (k < c),
                               jnp.take_along_axis(x, jnp.clip(k, 0, c - 1), axis=1), 0.0)
    return jax.tree.map(back, out)


def logp_entropy(model_cfg, params, batch, chunk: int, temperature: float = 1.0):
    """(log p(target) [B, S], entropy of the next-token distribution [B, S]) in float32."""
    return token_logprobs(model_cfg, params, batch, chunk, with_entropy=True,
                          temperature=temperature)


def make_logprobs(model_cfg, *, chunk: int, temperature: float, group: int, max_new: int):
    """`logprobs(params, batch, with_entropy, shared)`: token_logprobs at `temperature`; with
    `shared` True the shared-prompt path (shared_prompt_logprobs over groups of `group` rows),
    "packed" its packed form (packed_prompt.logprobs, the batch carrying packed_prompt.plan's)."""
    def logprobs(params, b, with_entropy, shared):
        if shared == "packed":
            return packed_prompt.logprobs(model_cfg, params, b, chunk, with_entropy, temperature,
                                          group, max_new)
        if shared:
            return shared_prompt_logprobs(model_cfg, params, b, chunk, with_entropy, temperature,
                                          group, max_new)
        return token_logprobs(model_cfg, params, b, chunk, with_entropy, temperature)
    return logprobs


def metric_names(c) -> tuple:
    """What an update of loss config `c` reports beside loss, grad norm, lr and the guards."""
    live = on_policy(c)
    return _METRICS + (ON_POLICY_METRICS if live else ()) + (
        IS_METRICS if live and c.is_mode != "none" else ())


def make_loss_fn(logprobs, c, *, lora_alpha, max_new: int):
    """`loss_fn(trainable, base, norm, micro_batch, shared) -> (loss, metrics)`: the policy loss
    (grpo_losses.grpo_loss) of one micro-batch as its share of the minibatch's (`norm`). Off
    policy the batch carries old log-probs and IS weights; on policy (`on_policy(c)`) they come
    from this forward, with the entropy and the sampler-mismatch metrics."""
    live = on_policy(c)

    def loss_fn(trainable, base, norm, mb, shared):
        params = policy_params(trainable, base, lora_alpha)
        if not live:
            logp = logprobs(params, mb, False, shared)
            old, is_w, extra = mb["old_logp"], mb["is_weights"], {}
        else:
            # On-policy: old log-probs are this forward's (grpo_loss stops their gradient);
            # entropy and the sampler-mismatch weights come from it too.
            logp, ent = logprobs(params, mb, True, shared)
            old, mask, cnt = logp, mb["mask"].astype(jnp.float32), norm[1]
            extra = {"entropy": jnp.sum(jax.lax.stop_gradient(ent) * mask) / cnt}
            is_w = None
            if c.is_mode != "none":
                is_w, is_m = grpo_losses.importance_weights(
                    logp, mb["sampler_logp"], mask, mode=c.is_mode, how=c.is_how,
                    low=c.is_low, high=c.is_high)
                # micro-batch means -> additive shares of the batch's token means
                share = jnp.maximum(mask.sum(), 1.0) / cnt
                extra.update({k: v * share for k, v in is_m.items()})
        loss, m = grpo_losses.grpo_loss(
            logp, old, mb["ref_logp"] if c.beta else None, mb["adv"],
            mb["mask"], c.eps_low, c.eps_high, c.beta, c.agg,
            is_weights=is_w if c.is_mode != "none" else None,
            max_len=max_new, norm=norm, policy_loss=c.get("policy_loss", "ppo_clip"),
            kl=c.get("kl", "k3"))
        return loss, {**m, **extra}
    return loss_fn


def make_update(loss_fn, optimizer, schedule, c, *, partitioner, max_new: int):
    """`update(state, base, batch, shared) -> (state, metrics)`: the SFT step's shape over the
    minibatch `batch` (accumulate.split_batch / accumulate / apply_if_finite, state.advance)."""
    names, n_micro = metric_names(c), int(c.micro_batches)

    def update(state, base, batch, shared):
        # Exact gradient accumulation: every micro-batch divides by the whole minibatch's
        # normalizers, so the summed shares are the minibatch's loss and gradient.
        norm = grpo_losses.normalizers(batch["mask"], c.agg, max_new)
        micro = accumulate.split_batch(batch, n_micro, partitioner)
        return accumulate.guarded_update(lambda t, mb: loss_fn(t, base, norm, mb, shared),
                                         state, micro, names, optimizer, schedule)
    return update


class StepFns:
    """Jitted pieces with explicit shardings: merge, log-probs, update (state donated), each
    built by the functions above. `partitioner` (rossjax.sharding.Partitioner) places rows over
    the batch axes; `_logp` / `_update` hold the row-wise (False), shared-prompt (True) and
    packed shared-prompt ("packed", packed_prompt.py) programs, which `logp` / `update` choose
    between per batch."""

    def __init__(self, model_cfg, optimizer, schedule, *, partitioner, param_shardings,
                 state_shardings, base_shardings, lora_alpha, loss_cfg, chunk: int, max_new: int):
        part, c = partitioner, loss_cfg
        self.lora_alpha, self.partitioner, self.max_new = lora_alpha, part, max_new
        self.row_sharding = rows = part.sharding(P("batch", None))
        bsh = {k: rows for k in (*BATCH_KEYS, "old_logp", "ref_logp", "is_weights",
                                 "sampler_logp")}
        bsh["adv"] = part.sharding(P("batch"))
        pks = {k: part.sharding(P("batch")) if k == "pk_group" else rows
               for k in packed_prompt.PACK_KEYS}
        self.merge = jax.jit(lambda t, b: policy_params(t, b, lora_alpha),
                             in_shardings=(state_shardings["params"], base_shardings),
                             out_shardings=param_shardings)
        # One device: a batch in the sampler's group layout runs each prompt once
        # (shared_prompt_logprobs; the host checks the layout and orders the rows so that every
        # micro-batch holds whole groups, see `_order` / `_update_order`). On a mesh rows keep
        # the row-wise layout.
        self.group = int(c.group_size) if part.mesh.devices.size == 1 else 1
        self.n_micro = int(c.micro_batches)
        self.pack = bool(c.get("pack_completions", True))
        self._pack_rows = {"logp": 0, "update": 0}    # the most packed rows so far (rows_bucket)
        # Trainer, old-policy and reference log-probs all at the sampling temperature: the
        # sampler's log-probs are of softmax(logits / T), so the ratios compare like with like.
        logprobs = make_logprobs(model_cfg, chunk=chunk, group=self.group, max_new=max_new,
                                 temperature=sampling_temperature(c.get("temperature", 1.0)))
        modes = (False, True, "packed")
        extra = lambda sh: pks if sh == "packed" else {}
        self._logp = {sh: jax.jit(models.transformer.under_mesh(
            lambda p, b, sh=sh: logprobs(p, b, True, sh), part),
            in_shardings=(param_shardings, {**{k: rows for k in BATCH_KEYS}, **extra(sh)}),
            out_shardings=(rows, rows)) for sh in modes}
        self.on_policy = on_policy(c)
        step = make_update(make_loss_fn(logprobs, c, lora_alpha=lora_alpha, max_new=max_new),
                           optimizer, schedule, c, partitioner=part, max_new=max_new)
        self._update = {sh: jax.jit(models.transformer.under_mesh(
            lambda st, base, b, sh=sh: step(st, base, b, sh), part),
            in_shardings=(state_shardings, base_shardings, {**bsh, **extra(sh)}),
            out_shardings=(state_shardings, part.replicated()), donate_argnums=0)
            for sh in modes}

    def _order(self, batch):
        """(take the shared-prompt path, row order or None, the int arrays on the host): one
        device. A minibatch whose rows were shuffled (grpo.shuffle_minibatches) is
        regrouped, rows of one prompt side by side (a stable sort): the one-micro-batch update
        is a sum over rows, so their order does not change it."""
        if self.group < 2:
            return False, None, None
        host = {k: np.asarray(jax.device_get(batch[k])) for k in BATCH_KEYS}
        if shared_prompt_ok(host, self.group, self.max_new):
            return True, None, host
        tok, pos, m = host["tokens"], host["positions"], host["mask"] > 0
        first, has = np.argmax(m, axis=1), m.any(1)
        pre = lambda r, n: tok[r, :n].tobytes() + pos[r, :n].tobytes()
        lens = sorted({int(first[r]) for r in np.flatnonzero(has)}, reverse=True)
        prompts = {pre(r, first[r]) for r in np.flatnonzero(has)}

        def key(r):
            # A row with nothing to train (DAPO's overlong filter) joins the longest trained
            # prompt it starts with, so a shuffled group stays whole.
            if has[r]:
                return True, pre(r, first[r])
            return next(((True, pre(r, n)) for n in lens if pre(r, n) in prompts), (False, b""))
        order = np.asarray(sorted(range(len(tok)), key=key), np.int32)
        host = {k: v[order] for k, v in host.items()}
        if shared_prompt_ok(host, self.group, self.max_new):
            return True, order, host
        return False, None, None

    def _update_order(self, batch):
        """`_order` for the update, whose micro-batches split_micro takes strided (micro-batch m:
        rows m, m + n, ...): the grouped rows are spread so that each micro-batch gets B/n
        consecutive ones, whole groups when the group size divides B/n (else row-wise). The update
        is a sum over rows, so their order does not change it."""
        shared, order, host = self._order(batch)
        n = self.n_micro
        if not shared or n == 1:
            return shared, order, host
        b = batch["tokens"].shape[0]
        if b % (n * self.group):
            return False, None, None
        spread = accumulate.block_order(np.arange(b), n)
        order = spread if order is None else order[spread]
        return True, order.astype(np.int32), {k: v[spread] for k, v in host.items()}

    def _packed(self, batch, host, which: str, n_micro: int):
        """(mode, batch): with grpo.pack_completions, a shared-prompt batch that packing shrinks
        enough gains packed_prompt.plan's arrays and runs "packed"."""
        pk = (packed_prompt.plan(host, self.group, self.max_new, n_micro, self._pack_rows[which])
              if self.pack else None)
        if pk is None:
            return True, batch
        self._pack_rows[which] = len(pk["pk_group"]) // n_micro
        return "packed", {**batch, **self.put_rows(pk)}

    def logp(self, params, batch):
        """(log p(target), entropy) [B, S] of put_rows' batch, rows in its order."""
        shared, order, host = self._order(batch)
        b = {k: batch[k] for k in BATCH_KEYS}
        if order is not None:
            b = {k: jax.device_put(v[order], v.sharding) for k, v in b.items()}
        if shared:
            shared, b = self._packed(b, host, "logp", 1)
        out = self._logp[shared](params, b)
        if order is None:
            return out
        inv = np.argsort(order)
        return tuple(x[inv] for x in out)

    def update_inputs(self, batch):
        """(the update program's key in `_update`, the batch as that program takes it: rows in
        its order, with the packed arrays where it packs)."""
        shared, order, host = self._update_order(batch)
        if order is not None:
            batch = {k: jax.device_put(v[order], v.sharding) for k, v in batch.items()}
        if shared:
            shared, batch = self._packed(batch, host, "update", self.n_micro)
        return shared, batch

    def update(self, state, base, batch):
        """One jitted policy update (state donated); returns (new state, metrics)."""
        shared, batch = self.update_inputs(batch)
        return self._update[shared](state, base, batch)

    def put_rows(self, arrays: dict) -> dict:
        """Host arrays (the same on every process) -> global arrays, rows over the batch axes."""
        adv_sh = self.partitioner.sharding(P("batch"))
        return {k: sharding.from_host(v, adv_sh if np.ndim(v) == 1 else self.row_sharding)
                for k, v in arrays.items()}
