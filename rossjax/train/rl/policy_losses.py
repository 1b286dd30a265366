"""Policy-gradient losses per token (a registry, `config.grpo.policy_loss`): the PPO clipped
surrogate GRPO uses, GSPO's sequence-level ratio and clipping, and CISPO's clipped, stop-gradient
importance weights.

A policy loss is `fn(logp, old_logp, adv, mask, eps_low, eps_high) -> PolicyTerms`, all [B, T]
float32: logp carries the gradient; old_logp and adv (one advantage per completion, broadcast
over its tokens) do not; padding (mask 0) may hold anything (even inf) and must not leak into a
masked-in value. grpo_losses.grpo_loss multiplies the terms by the sampler/trainer importance
weights, adds beta x KL and aggregates; micro-batches split rows, so a term may use its whole row
(GSPO does) but never another row.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rossjax.train.registry import Registry

POLICY_LOSS_REGISTRY = Registry("policy loss", "config.grpo.policy_loss")


class PolicyTerms(NamedTuple):
    per_token: jax.Array   # the loss term of each token (its gradient is the policy gradient)
    ratio: jax.Array       # the importance ratio the term used (metric `ratio_mean`)
    clip_low: jax.Array    # 1 where the lower clip bound changed the gradient (`clip_frac_low`)
    clip_high: jax.Array   # 1 where the upper one did (`clip_frac_high`)


def log_ratio(logp, old_logp, mask):
    """log pi / pi_old per token, 0 at padding (so exp of it is finite there)."""
    return jnp.where(mask != 0, logp - old_logp, 0.0)


def _exp(x):
    return jnp.exp(jnp.clip(x, -20.0, 20.0))  # a clamped log-ratio: exp cannot overflow


def _clipped_surrogate(ratio, adv, eps_low, eps_high) -> PolicyTerms:
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    # A token is clipped when the clipped branch is the one min() picks and it differs.
    return PolicyTerms(-jnp.minimum(ratio * adv, clipped * adv), ratio,
                       ((ratio < 1.0 - eps_low) & (adv < 0)).astype(jnp.float32),
                       ((ratio > 1.0 + eps_high) & (adv > 0)).astype(jnp.float32))


@POLICY_LOSS_REGISTRY.register("ppo_clip")
def ppo_clip(logp, old_logp, adv, mask, eps_low, eps_high):
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) with the token ratio r = pi / pi_old
    (PPO; GRPO; DAPO's clip-higher with eps_high > eps_low)."""
    return _clipped_surrogate(_exp(log_ratio(logp, old_logp, mask)), adv, eps_low, eps_high)


@POLICY_LOSS_REGISTRY.register("gspo")
def gspo(logp, old_logp, adv, mask, eps_low, eps_high):
    """GSPO: the clipped surrogate on the sequence ratio s = exp(mean over the row's tokens of
    log pi / pi_old), one value for the whole row, clipped as a whole (TRL's
    importance_sampling_level="sequence"). Every token of a row carries the row's term, so
    agg="seq_mean_token_mean" is the paper's (1/G) sum over sequences; the paper's clip range is
    small (eps_low 3e-4, eps_high 4e-4), as s is a per-token geometric mean."""
    n = mask.sum(axis=1, keepdims=True)
    seq = log_ratio(logp, old_logp, mask).sum(axis=1, keepdims=True) / jnp.maximum(n, 1.0)
    s = jnp.broadcast_to(_exp(seq), logp.shape)
    return _clipped_surrogate(s, adv, eps_low, eps_high)


@POLICY_LOSS_REGISTRY.register("cispo")
def cispo(logp, old_logp, adv, mask, eps_low, eps_high):
    """CISPO (MiniMax-M1): -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi. The weight is
    clipped, never the token dropped: every token keeps a gradient, -w A d log pi. The paper
    bounds only the top (eps_low = 1 turns the lower bound off; TRL's `epsilon_high` is the
    absolute cap 1 + eps_high). The loss value is w A log pi, not a surrogate's."""
    ratio = _exp(log_ratio(logp, old_logp, mask))
    w = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))
    lp = jnp.where(mask != 0, logp, 0.0)
    return PolicyTerms(-w * adv * lp, ratio, (ratio < 1.0 - eps_low).astype(jnp.float32),
                       (ratio > 1.0 + eps_high).astype(jnp.float32))
