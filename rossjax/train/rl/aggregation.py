"""Loss aggregations (a registry, `config.grpo.agg`): how per-token terms become one loss.

An aggregation is `Aggregation(reduce, denominator)`: `denominator(mask, max_len)` of the whole
batch, and `reduce(x, mask, denom)`, a sum over rows divided by it, so micro-batches that each
divide by the whole batch's denominator add up to the whole-batch loss and gradient.

Deviation, and why: `seq_mean_token_mean` averages over rows that hold at least one token (an
all-padding row has no per-token mean; counting it as 0 would shrink the loss of the others).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

from rossjax.train.registry import Registry


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """How per-token terms become one loss (see module doc)."""
    reduce: Callable        # (x [B, T], mask [B, T], denom) -> scalar
    denominator: Callable   # (mask [B, T] of the whole batch, max_len or None) -> scalar

    def __call__(self, x, mask, denom):
        return self.reduce(x, mask, denom)


# the message names grpo_losses, where users have always imported Aggregation from (it still is)
AGGREGATION_REGISTRY = Registry(
    "loss aggregation", "config.grpo.agg",
    check=lambda o: None if isinstance(o, Aggregation) else
    "it must be a rossjax.train.rl.grpo_losses.Aggregation(reduce, denominator).")


def masked(x, mask):
    """x * mask with padding exactly 0: where() keeps inf/NaN at padding from leaking."""
    return jnp.where(mask != 0, x * mask, 0.0)


def _token_sum(x, mask, denom):
    return masked(x, mask).sum() / denom


def _row_means(x, mask, denom):
    return (masked(x, mask).sum(axis=1) / jnp.maximum(mask.sum(axis=1), 1.0)).sum() / denom


AGGREGATION_REGISTRY.register("token_mean", Aggregation(
    _token_sum, lambda mask, max_len: jnp.maximum(mask.sum(), 1.0)))
AGGREGATION_REGISTRY.register("seq_mean_token_mean", Aggregation(
    _row_means, lambda mask, max_len: jnp.maximum((mask.sum(axis=1) > 0).sum()
                                                  .astype(jnp.float32), 1.0)))
# Dr. GRPO: every row divided by the same L_max (max_len; default the batch's T)
AGGREGATION_REGISTRY.register("seq_mean_token_sum_norm", Aggregation(
    _token_sum, lambda mask, max_len: jnp.asarray(
        mask.shape[0] * (mask.shape[1] if max_len is None else max_len), jnp.float32)))


def normalizers(mask, agg: str, max_len=None):
    """(aggregation denominator, masked-token count) of a whole batch: a micro-batch's loss
    divided by these is its additive share of the batch's loss (exact gradient accumulation)."""
    mask = jnp.asarray(mask, jnp.float32)
    return (AGGREGATION_REGISTRY.get(agg).denominator(mask, max_len),
            jnp.maximum(mask.sum(), 1.0))
