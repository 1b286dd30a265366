"""Pure loss functions of arrays (no model, no config).

Target convention (used everywhere in rossjax/train):
  * `loss_mask[t] = 1` marks token t of `input_ids` as a supervised prediction *target*.
    Position t-1 predicts it, so `targets[:, t-1] = input_ids[:, t]` and the mask of the
    prediction at t-1 is `loss_mask[t]`. This is the same alignment as Hugging Face
    `labels` (labels[t] = input_ids[t] or -100; the model shifts internally).
  * In packed rows a document's first token is never a target of the previous document's
    last token, and padding (segment id 0) is never a target: `shift_targets` enforces both.

Every loss returns `(sum, count)` rather than a mean, so that callers can add sums and counts
over micro-batches, devices and hosts and divide once by the global supervised-token count
(the ROSS objective, Eq. 4). Logits and losses are computed in float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from rossjax.models.kernels import activations


def shift_targets(input_ids, loss_mask, segment_ids=None):
    """`[b, s]` rows -> (`targets [b, s]` int32, `target_mask [b, s]` float32).

    Position t predicts token t+1; the last position predicts nothing. A prediction is
    supervised iff token t+1 is marked in `loss_mask`, belongs to the same document as token t
    and is not padding.
    """
    input_ids = jnp.asarray(input_ids)
    loss_mask = jnp.asarray(loss_mask)
    targets = jnp.concatenate(
        [input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1).astype(jnp.int32)
    nxt = loss_mask[:, 1:] != 0
    if segment_ids is not None:
        segment_ids = jnp.asarray(segment_ids)
        nxt = nxt & (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] != 0)
    mask = jnp.concatenate([nxt, jnp.zeros_like(nxt[:, :1])], axis=1)
    return targets, mask.astype(jnp.float32)


def token_logprobs(logits, targets):
    """log softmax(logits)[target] in float32; `logits [..., V]`, `targets [...]`."""
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - lse


def masked_nll(logits, targets, mask):
    """Sum and count of the masked negative log-likelihood.

    logits [..., V] (any float dtype; computed in float32), targets [...] int, mask [...]
    (0/1 or weights). Returns (sum of -log p(target) * mask, sum of mask), both float32 scalars.
    """
    mask = jnp.asarray(mask, jnp.float32)
    nll = -token_logprobs(logits, targets)
    # where() rather than a product so an inf/NaN logit at an unsupervised position cannot leak.
    return jnp.sum(jnp.where(mask != 0, nll * mask, 0.0)), jnp.sum(mask)


def _pad_positions(x, multiple):
    pad = (-x.shape[1]) % multiple
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, pad)
    return jnp.pad(x, widths)


def _whole_model_dim(w, vocab_major):
    """The head weights gathered over their model dimension once, before the chunk loop (the
    vocab split stays the compiler's choice), under an activation mesh. Under fsdp the table is
    split over d, and left alone the TPU compiler gathers it inside every chunk: a windowed
    einsum per chunk forward, a re-gather per chunk in the backward (docs/tpu.md). The gradient
    goes back with its sharding left free (a custom VJP): the constraint's own transpose would
    pin the cotangent unsharded and keep the full fp32 table gradient live through the loss."""
    act = activations.current()
    if act is None:
        return w
    U = P.UNCONSTRAINED
    whole = NamedSharding(act.mesh, P(U, None) if vocab_major else P(None, U))
    free = NamedSharding(act.mesh, P(U, U))

    @jax.custom_vjp
    def gather(w):
        return jax.lax.with_sharding_constraint(w, whole)

    def fwd(w):
        return gather(w), None

    def bwd(_, ct):
        return (jax.lax.with_sharding_constraint(ct, free),)

    gather.defvjp(fwd, bwd)
    return gather(w)


def chunked_token_logprobs(hidden, lm_head_w, targets, chunk_size=1024, vocab_major=False,
                           with_entropy=False, temperature=1.0):
    """log p(target) `[b, s]` float32 from hidden states, one block of positions at a time.

    hidden [b, s, d] (final-normed), lm_head_w [d, V] (or [V, d] with `vocab_major`, e.g. a tied
    embedding table: passing it as is avoids a transposed copy of the table and of its gradient),
    targets [b, s]. Only a `[b, chunk, V]` float32 logits block exists at any time, in the
    forward *and* in the backward: each block is a checkpointed scan step, so autodiff recomputes
    its logits instead of storing them. `with_entropy` returns (log p, entropy of the next-token
    distribution), both [b, s]. `temperature` T: of softmax(logits / T), the float32 logits
    divided as the sampler divides them (GRPO's log-probs at its sampling temperature).
    """
    spec = "bcd,vd->bcv" if vocab_major else "bcd,dv->bcv"
    b, s, d = hidden.shape
    chunk = max(1, min(int(chunk_size), s))
    h = _pad_positions(hidden, chunk)
    t = _pad_positions(targets.astype(jnp.int32), chunk)
    n = h.shape[1] // chunk
    # [n, b, chunk, ...]: scan runs over position blocks.
    hs = h.reshape(b, n, chunk, d).swapaxes(0, 1)
    ts = t.reshape(b, n, chunk).swapaxes(0, 1)

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def block(w, hb, tb):
        logits = jnp.einsum(spec, hb, w.astype(hb.dtype), preferred_element_type=jnp.float32)
        if temperature != 1.0:
            logits = logits / temperature
        if not with_entropy:
            return token_logprobs(logits, tb)
        lsm = jax.nn.log_softmax(logits, axis=-1)
        lp = jnp.take_along_axis(lsm, tb[..., None], axis=-1)[..., 0]
        return lp, -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)

    def body(carry, xs):
        hb, tb = xs
        return carry, block(lm_head_w, hb, tb)

    lm_head_w = _whole_model_dim(lm_head_w, vocab_major)
    _, out = jax.lax.scan(body, None, (hs, ts))
    return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(b, n * chunk)[:, :s], out)


def chunked_masked_nll(hidden, lm_head_w, targets, mask, chunk_size=1024, vocab_major=False):
    """`masked_nll` of `hidden @ lm_head_w` without materializing `[b, s, V]` logits."""
    mask = jnp.asarray(mask, jnp.float32)
    nll = -chunked_token_logprobs(hidden, lm_head_w, targets, chunk_size, vocab_major)
    return jnp.sum(jnp.where(mask != 0, nll * mask, 0.0)), jnp.sum(mask)


def head_weights(model_cfg, params):
    """(LM-head weights, vocab_major) of a params tree: a tied model's [V, d] embedding table as
    it is (no transposed copy, nor of its gradient), else the [d, V] head."""
    if model_cfg.tie_embeddings and "lm_head" not in params:
        return params["embed"]["embedding"], True
    return params["lm_head"]["kernel"], False


from rossjax.train.rl.grpo_losses import group_advantages, grpo_loss, importance_weights  # noqa: E402,F401
