"""The GRPO loss as pure functions of arrays: a policy loss, a KL estimator and a loss
aggregation, each picked by name from its registry (rossjax.train.rl.policy_losses
POLICY_LOSS_REGISTRY, .kl KL_REGISTRY, .aggregation AGGREGATION_REGISTRY; advantages in
rossjax.train.rl.advantages ADVANTAGE_REGISTRY), plus truncated importance sampling between sampler
and trainer log-probabilities. The tuples here (POLICY_LOSSES, KL_ESTIMATORS, AGGREGATIONS,
ADVANTAGES) are the built-in names.

Shapes: completions are rows of a [B, T] array (token t of row b is the t-th *generated* token),
`mask [B, T]` marks real completion tokens (1) against padding (0), and a GRPO group is G
consecutive rows (row i * G + j is sample j of context i, the sampler's layout).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rossjax.errors import ConfigError
from rossjax.train.rl.advantages import ADVANTAGE_REGISTRY, group_advantages  # noqa: F401
from rossjax.train.rl.aggregation import (  # noqa: F401
    AGGREGATION_REGISTRY,
    Aggregation,
    masked as _masked,
    normalizers,
)
from rossjax.train.rl.kl import KL_REGISTRY
from rossjax.train.rl.policy_losses import POLICY_LOSS_REGISTRY

IS_MODES = ("token", "sequence")
IS_HOW = ("truncate", "mask")


# The built-in names (a config may also name a module:function of its own).
ADVANTAGES = ADVANTAGE_REGISTRY.names()
AGGREGATIONS = AGGREGATION_REGISTRY.names()
POLICY_LOSSES = POLICY_LOSS_REGISTRY.names()
KL_ESTIMATORS = KL_REGISTRY.names()


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


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, eps_low: float = 0.2,
              eps_high: float = 0.2, beta: float = 0.0, agg: str = "token_mean", *,
              is_weights=None, max_len: int | None = None, norm=None,
              policy_loss: str = "ppo_clip", kl: str = "k3"):
    """Policy loss (default the clipped surrogate) plus beta x KL to the reference, aggregated.

    Defaults, per token: -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)
    + beta (e^(ref-logp) - (ref-logp) - 1), rho = exp(logp - old_logp). logp/old_logp/ref_logp/
    mask [B, T]; advantages [B] (one per completion) or [B, T]. `ref_logp` may be None when
    beta == 0. `is_weights` [B, T] (from `importance_weights`) multiply the policy term.
    `max_len` is Dr. GRPO's L_max (default T). `norm` = `normalizers(...)` of an enclosing batch:
    this batch is then one micro-batch of it, and loss and metrics are its additive share.
    `policy_loss`, `kl`, `agg`: registered names (policy_losses, kl, aggregation) or
    module:function. Returns (loss, metrics) with pg_loss, kl (token mean of the estimator),
    clip fractions (low/high), ratio mean.
    """
    aggregate = AGGREGATION_REGISTRY.get(agg)
    policy = POLICY_LOSS_REGISTRY.get(policy_loss)
    estimator = KL_REGISTRY.get(kl)
    logp = jnp.asarray(logp, jnp.float32)
    old_logp = jax.lax.stop_gradient(jnp.asarray(old_logp, jnp.float32))
    mask = jnp.asarray(mask, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    if adv.ndim == 1:
        adv = adv[:, None]
    adv = jax.lax.stop_gradient(jnp.broadcast_to(adv, logp.shape))
    denom, cnt = normalizers(mask, agg, max_len) if norm is None else norm

    terms = policy(logp, old_logp, adv, mask, eps_low, eps_high)
    pg = terms.per_token
    if is_weights is not None:
        pg = pg * jax.lax.stop_gradient(jnp.asarray(is_weights, jnp.float32))
    per_tok = pg
    kl_tok = jnp.zeros_like(logp)
    if ref_logp is not None:
        z = lambda x: jnp.where(mask != 0, x, 0.0)  # padding may hold anything (even inf)
        ref = jax.lax.stop_gradient(jnp.asarray(ref_logp, jnp.float32))
        kl_tok = estimator(z(logp), z(ref), z(old_logp))
        if beta:
            per_tok = per_tok + beta * kl_tok
    elif beta:
        raise ValueError("grpo_loss: beta > 0 needs ref_logp.")

    tmean = lambda x: jnp.sum(_masked(x, mask)) / cnt
    metrics = {"pg_loss": aggregate(pg, mask, denom), "kl": tmean(kl_tok),
               "clip_frac_low": tmean(terms.clip_low), "clip_frac_high": tmean(terms.clip_high),
               "ratio_mean": tmean(terms.ratio)}
    return aggregate(per_tok, mask, denom), metrics
