"""From a step's rewards to its advantages: the group-advantage estimators (a registry,
`config.grpo.advantages`), and DAPO's reward-side pieces: the soft overlong penalty and the
groups dynamic sampling drops.

Rewards are [n * G] (or [n, G]) with group i's G samples consecutive; NaN marks a row that could
not be scored: it gets advantage 0 and stays out of its group's statistics.

An estimator is `fn(r, ok, eps) -> adv`, all [n, G]: `r` float32 with NaNs replaced by 0, `ok`
where a reward exists. Rows outside `ok` are zeroed after it returns.

Deviations, and why: the default "mean" is `r - mean_group(r)` (Dr. GRPO; the upstream run the
ROSS paper reuses), as dividing by the group std up-weights near-unanimous groups (a difficulty
bias); the "grpo" std is the population std over the scorable members (ddof 0), so a lone
scorable member gets 0 instead of NaN.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from rossjax.train.registry import Registry

ADVANTAGE_REGISTRY = Registry("advantage estimator", "config.grpo.advantages")


def _count_mean(r, ok):
    n = ok.sum(axis=1, keepdims=True).astype(jnp.float32)
    total = r.sum(axis=1, keepdims=True)
    return n, total, total / jnp.maximum(n, 1.0)


@ADVANTAGE_REGISTRY.register("mean")
def mean_baseline(r, ok, eps):
    """r - mean of the group (Dr. GRPO)."""
    return r - _count_mean(r, ok)[2]


@ADVANTAGE_REGISTRY.register("grpo")
def std_normalized(r, ok, eps):
    """(r - mean) / (std + eps), the population std of the scorable members (GRPO)."""
    n, _, mean = _count_mean(r, ok)
    var = jnp.where(ok, (r - mean) ** 2, 0.0).sum(axis=1, keepdims=True) / jnp.maximum(n, 1.0)
    return (r - mean) / (jnp.sqrt(var) + eps)


@ADVANTAGE_REGISTRY.register("rloo")
def leave_one_out(r, ok, eps):
    """r - mean of the *other* scorable members; a lone scorable row has no baseline (0)."""
    n, total, _ = _count_mean(r, ok)
    others = (total - r) / jnp.maximum(n - 1.0, 1.0)
    return jnp.where(n > 1, r - others, 0.0)


def group_advantages(rewards, group_size: int, method: str = "mean", eps: float = 1e-6):
    """Group-relative advantages of `rewards` ([n * G] or [n, G]; same shape back) with the
    estimator `method` names (a registered name or module:function)."""
    fn = ADVANTAGE_REGISTRY.get(method)
    r = jnp.asarray(rewards, jnp.float32)
    shape = r.shape
    if r.size % group_size:
        raise ValueError(f"advantages: {r.size} rewards do not split into groups of {group_size}.")
    r = r.reshape(-1, group_size)
    ok = ~jnp.isnan(r)
    adv = fn(jnp.where(ok, r, 0.0), ok, eps)
    return jnp.where(ok, adv, 0.0).reshape(shape)


def overlong_penalty(lengths, max_len: int, buffer: int, factor: float = 1.0) -> np.ndarray:
    """DAPO's soft overlong punishment (Eq. 13), one value per completion: 0 up to
    `max_len - buffer` tokens, then falling linearly to -factor at `max_len` (and -factor beyond).
    `lengths` count every generated token, the stop token included."""
    n = np.asarray(lengths, np.float64)
    expected = max_len - buffer
    return np.clip(-(n - expected) / buffer, -1.0, 0.0) * factor


def uniform_groups(rewards, group_size: int) -> np.ndarray:
    """bool [n]: groups whose scorable rewards all agree (or with fewer than two scorable), so
    every advantage in them is 0: the groups DAPO's dynamic sampling drops."""
    r = np.asarray(rewards, np.float64).reshape(-1, group_size)
    out = []
    for row in r:
        v = row[~np.isnan(row)]
        out.append(len(v) < 2 or bool(np.all(v == v[0])))
    return np.asarray(out, bool)
