"""Optimizer and learning-rate schedule from a config (shared by SFT and GRPO).

Default = the ROSS relearning recipe: AdamW with betas (0.9, 0.98), peak LR 4e-6 after a linear
warmup over 5% of the steps, cosine decay to 2e-7, weight decay 0.1, optional global-norm
clipping. The paper does not say which parameters are decayed; we decay matrices only (norm
scales and biases are left alone, the usual practice), `decay="all"` decays everything.
"""

from __future__ import annotations

import jax
import optax

from rossjax import defaults
from rossjax.errors import ConfigError

# The `config.optim` section (jax-free data: config files read it without importing optax).
default_config = defaults.optim_config


def make_schedule(cfg, total_steps: int) -> optax.Schedule:
    total_steps = max(int(total_steps), 1)
    warmup = int(cfg.warmup_steps) if cfg.warmup_steps >= 0 else int(round(cfg.warmup_frac * total_steps))
    warmup = min(warmup, total_steps)
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=cfg.peak_lr, warmup_steps=warmup,
            decay_steps=total_steps, end_value=cfg.end_lr)
    if cfg.schedule == "constant":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, cfg.peak_lr, max(warmup, 1)), optax.constant_schedule(cfg.peak_lr)],
            [warmup]) if warmup > 0 else optax.constant_schedule(cfg.peak_lr)
    if cfg.schedule == "linear":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, cfg.peak_lr, max(warmup, 1)),
             optax.linear_schedule(cfg.peak_lr, cfg.end_lr, max(total_steps - warmup, 1))],
            [warmup])
    raise ConfigError(f"optim.schedule {cfg.schedule!r} is not one of cosine, constant, linear.")


def _decay_mask(params):
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def make_optimizer(cfg, total_steps: int):
    """(optax.GradientTransformation, schedule) for `cfg` (see `default_config`)."""
    if cfg.name != "adamw":
        raise ConfigError(f"optim.name {cfg.name!r} is not supported (only 'adamw').")
    if cfg.decay not in ("matrices", "all"):
        raise ConfigError(f"optim.decay {cfg.decay!r} is not one of matrices, all.")
    schedule = make_schedule(cfg, total_steps)
    parts = []
    if cfg.clip_norm and cfg.clip_norm > 0:
        parts.append(optax.clip_by_global_norm(cfg.clip_norm))
    parts.append(optax.adamw(
        learning_rate=schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
        mask=_decay_mask if cfg.decay == "matrices" else None))
    return optax.chain(*parts), schedule
