"""GRPO pieces as pure functions of arrays: group advantages, the clipped surrogate with a k3 KL
penalty, and truncated importance sampling between sampler and trainer log-probabilities.

Shapes: completions are rows of a [B, T] array (token t of row b is the t-th *generated* token),
`mask [B, T]` marks real completion tokens (1) against padding (0), and a GRPO group is G
consecutive rows (row i * G + j is sample j of context i, the sampler's layout).

Where this deviates from a paper, and why:
  * advantages default to `r - mean_group(r)` (Dr. GRPO; the upstream run the ROSS paper reuses):
    dividing by the group std up-weights near-unanimous groups, which is a difficulty bias;
  * the GRPO std is the population std over the group's scorable members (ddof 0), so a group
    with one scorable member gets advantage 0 instead of NaN;
  * `seq_mean_token_mean` averages over rows that hold at least one token (an all-padding row
    has no per-token mean; counting it as 0 would shrink the loss of the others).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rossjax.errors import ConfigError

ADVANTAGES = ("mean", "grpo", "rloo")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
IS_MODES = ("token", "sequence")
IS_HOW = ("truncate", "mask")


def group_advantages(rewards, group_size: int, method: str = "mean", eps: float = 1e-6):
    """Group-relative advantages, same shape as `rewards` ([n * G], or [n, G]).

    mean: r - mean_group(r);  grpo: (r - mean) / (std + eps);  rloo: r - mean of the other
    scorable members. NaN rewards (rows that could not be scored) get advantage 0 and do not
    enter their group's statistics.
    """
    if method not in ADVANTAGES:
        raise ConfigError(f"advantages: method {method!r} is not one of {', '.join(ADVANTAGES)}.")
    r = jnp.asarray(rewards, jnp.float32)
    shape = r.shape
    if r.size % group_size:
        raise ValueError(f"advantages: {r.size} rewards do not split into groups of {group_size}.")
    r = r.reshape(-1, group_size)
    ok = ~jnp.isnan(r)
    rz = jnp.where(ok, r, 0.0)
    n = ok.sum(axis=1, keepdims=True).astype(jnp.float32)
    total = rz.sum(axis=1, keepdims=True)
    mean = total / jnp.maximum(n, 1.0)
    if method == "mean":
        adv = rz - mean
    elif method == "grpo":
        var = jnp.where(ok, (rz - mean) ** 2, 0.0).sum(axis=1, keepdims=True) / jnp.maximum(n, 1.0)
        adv = (rz - mean) / (jnp.sqrt(var) + eps)
    else:  # rloo: the baseline excludes the row itself; a lone scorable row has no baseline
        others = (total - rz) / jnp.maximum(n - 1.0, 1.0)
        adv = jnp.where(n > 1, rz - others, 0.0)
    return jnp.where(ok, adv, 0.0).reshape(shape)


def importance_weights(trainer_logp, sampler_logp, mask, *, mode: str = "token",
                       how: str = "truncate", low: float = 0.0, high: float = 2.0):
    """Correction for the sampler/trainer mismatch: w = pi_trainer / pi_sampler (no gradient).

    mode "token": one ratio per token; "sequence": the product over the row's masked tokens,
    broadcast to its tokens. how "truncate": clip w into [low, high] (truncated IS); "mask":
    w = 1 inside [low, high] and 0 outside, dropping those tokens from the surrogate (IcePop).
    Returns (weights [B, T] float32, metrics).
    """
    if mode not in IS_MODES or how not in IS_HOW:
        raise ConfigError(f"importance sampling: mode {mode!r} / how {how!r} must be one of "
                         f"{IS_MODES} / {IS_HOW}.")
    mask = jnp.asarray(mask, jnp.float32)
    d = jax.lax.stop_gradient(jnp.asarray(trainer_logp, jnp.float32)
                              - jnp.asarray(sampler_logp, jnp.float32))
    d = jnp.where(mask != 0, d, 0.0)
    if mode == "sequence":
        d = jnp.broadcast_to(d.sum(axis=1, keepdims=True), d.shape)
    w = jnp.exp(jnp.clip(d, -20.0, 20.0))  # clamp the log-ratio so exp cannot overflow
    outside = (w < low) | (w > high)
    w_out = jnp.clip(w, low, high) if how == "truncate" else jnp.where(outside, 0.0, 1.0)
    w_out = jnp.where(mask != 0, w_out, 0.0)
    cnt = jnp.maximum(mask.sum(), 1.0)
    metrics = {"is_outside_frac": jnp.sum(outside * mask) / cnt,
               "is_weight_mean": jnp.sum(w * mask) / cnt}
    return w_out, metrics


def normalizers(mask, agg: str, max_len=None):
    """(aggregation denominator, masked-token count) of a whole batch.

    The loss of `agg` is sum(terms) / denominator with terms that add over rows, so micro-batches
    that each divide by the *whole* batch's normalizers add up to exactly the whole-batch loss
    (and gradient): token_mean divides by the masked-token count, seq_mean_token_mean by the
    number of rows holding a token (each row contributes its token mean), and
    seq_mean_token_sum_norm by B * L_max.
    """
    mask = jnp.asarray(mask, jnp.float32)
    count = mask.sum()
    if agg == "token_mean":
        denom = jnp.maximum(count, 1.0)
    elif agg == "seq_mean_token_mean":
        denom = jnp.maximum((mask.sum(axis=1) > 0).sum().astype(jnp.float32), 1.0)
    elif agg == "seq_mean_token_sum_norm":
        denom = jnp.asarray(mask.shape[0] * (mask.shape[1] if max_len is None else max_len),
                            jnp.float32)
    else:
        raise ConfigError(f"grpo_loss: agg {agg!r} is not one of {', '.join(AGGREGATIONS)}.")
    return denom, jnp.maximum(count, 1.0)


def _aggregate(x, mask, agg: str, denom):
    tok = jnp.where(mask != 0, x * mask, 0.0)
    if agg == "seq_mean_token_mean":
        row_mean = tok.sum(axis=1) / jnp.maximum(mask.sum(axis=1), 1.0)  # 0 for an empty row
        return row_mean.sum() / denom
    return tok.sum() / denom  # token_mean, seq_mean_token_sum_norm (Dr. GRPO)


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, eps_low: float = 0.2,
              eps_high: float = 0.2, beta: float = 0.0, agg: str = "token_mean", *,
              is_weights=None, max_len: int | None = None, norm=None):
    """Clipped surrogate plus beta x k3 KL to the reference, aggregated over the batch.

    per token: -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) + beta (e^(ref-logp) - (ref-logp) - 1)
    with rho = exp(logp - old_logp). logp/old_logp/ref_logp/mask [B, T]; advantages [B] (one per
    completion) or [B, T]. `ref_logp` may be None when beta == 0. `is_weights` [B, T] (from
    `importance_weights`) multiply the surrogate term. `max_len` is Dr. GRPO's L_max (default T).
    `norm` = `normalizers(...)` of an enclosing batch: this batch is then one micro-batch of it,
    and loss and metrics are its additive share (summing the shares gives the whole-batch values).
    Returns (loss, metrics) with pg_loss, kl, clip fractions (low/high), ratio mean.
    """
    if agg not in AGGREGATIONS:
        raise ConfigError(f"grpo_loss: agg {agg!r} is not one of {', '.join(AGGREGATIONS)}.")
    logp = jnp.asarray(logp, jnp.float32)
    old_logp = jax.lax.stop_gradient(jnp.asarray(old_logp, jnp.float32))
    mask = jnp.asarray(mask, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    if adv.ndim == 1:
        adv = adv[:, None]
    adv = jax.lax.stop_gradient(jnp.broadcast_to(adv, logp.shape))
    denom, cnt = normalizers(mask, agg, max_len) if norm is None else norm

    # Padding positions may hold anything (even inf): neutralize them before exp.
    log_ratio = jnp.where(mask != 0, logp - old_logp, 0.0)
    ratio = jnp.exp(jnp.clip(log_ratio, -20.0, 20.0))
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = -jnp.minimum(ratio * adv, clipped * adv)
    if is_weights is not None:
        pg = pg * jax.lax.stop_gradient(jnp.asarray(is_weights, jnp.float32))
    per_tok = pg
    kl = jnp.zeros_like(logp)
    if ref_logp is not None:
        ref = jax.lax.stop_gradient(jnp.asarray(ref_logp, jnp.float32))
        delta = jnp.where(mask != 0, ref - logp, 0.0)
        kl = jnp.exp(delta) - delta - 1.0
        if beta:
            per_tok = per_tok + beta * kl
    elif beta:
        raise ValueError("grpo_loss: beta > 0 needs ref_logp.")

    loss = _aggregate(per_tok, mask, agg, denom)
    tmean = lambda x: jnp.sum(jnp.where(mask != 0, x * mask, 0.0)) / cnt
    metrics = {
        "pg_loss": _aggregate(pg, mask, agg, denom),
        "kl": tmean(kl),
        # A token is clipped when the clipped branch is the one min() picks and it differs.
        "clip_frac_low": tmean(((ratio < 1.0 - eps_low) & (adv < 0)).astype(jnp.float32)),
        "clip_frac_high": tmean(((ratio > 1.0 + eps_high) & (adv > 0)).astype(jnp.float32)),
        "ratio_mean": tmean(ratio),
    }
    return loss, metrics
