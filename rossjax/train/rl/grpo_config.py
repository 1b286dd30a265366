"""The checks that turn a bad GRPO config into one sentence before a model loads, and
`default_config()`: every field a GRPO config has (defined in rossjax/defaults.py, jax-free;
configs/grpo_verifier.py and configs/propel_azr.py start from it)."""

from __future__ import annotations

import os

from rossjax import defaults
from rossjax.errors import ConfigError
from rossjax.probes import reward as reward_lib
from rossjax.train.rl import (
    advantages,
    agentic_grpo,
    aggregation,
    grpo_losses,
    kl as kl_lib,
    policy_losses,
)
from rossjax.verify import rewards

# Every field, as plain data (no jax, so config files read it without loading the trainer).
default_config = defaults.grpo_config


def check_config(cfg):
    """One-sentence ValueErrors for a GRPO config, before any model is loaded."""
    g, r = cfg.grpo, cfg.reward
    for registry in (advantages.ADVANTAGE_REGISTRY, aggregation.AGGREGATION_REGISTRY,
                     policy_losses.POLICY_LOSS_REGISTRY, kl_lib.KL_REGISTRY):
        registry.get(g[registry.field.rpartition(".")[2]])  # a user's module:function imports here
    names = {"is_mode": ("none", *grpo_losses.IS_MODES), "is_how": grpo_losses.IS_HOW}
    for field, allowed in names.items():
        if g[field] not in allowed:
            raise ConfigError(f"config.grpo.{field} {g[field]!r} is not one of {', '.join(allowed)}.")
    _check_dapo(g, agentic_grpo.loss_len(cfg))  # an agentic row's length: the trajectory
    if g.group_size < 2:
        raise ConfigError(f"config.grpo.group_size is {g.group_size}; it must be at least 2 (a lone "
                         f"candidate's group-relative advantage is always 0).")
    for field in ("steps", "contexts", "max_new_tokens", "num_iterations", "micro_batches",
                  "minibatches"):
        if g[field] < 1:
            raise ConfigError(f"config.grpo.{field} is {g[field]}; it must be at least 1.")
    rows = g.contexts * g.group_size
    if g.minibatch <= 0 and rows % g.minibatches:
        raise ConfigError(f"config.grpo.minibatches {g.minibatches} does not divide the {rows} "
                          f"rows of a step (contexts x group_size).")
    if g.is_mode != "none" and not 0 <= g.is_low < 1 < g.is_high:
        raise ConfigError(f"config.grpo.is_low {g.is_low} and is_high {g.is_high} must bracket 1 "
                          f"(0 <= is_low < 1 < is_high).")
    if agentic_grpo.enabled(cfg):  # the reward is the environment's verdict
        agentic_grpo.check_config(cfg)
        return
    rewards.check_custom(r)  # reward.fn: importable; alone, it is the run's reward
    kinds = (*rewards.CPU_REWARDS, "probe", "solver")
    unknown = [f for f in r.functions if f not in kinds]
    if unknown or not r.functions or len(r.functions) != len(r.weights):
        raise ConfigError(f"config.reward.functions {tuple(r.functions)} must name some of "
                         f"{', '.join(kinds)}, with one entry in config.reward.weights each.")
    if "probe" in r.functions:
        p = r.probe
        if p.gate not in reward_lib.GATES:
            raise ConfigError(f"config.reward.probe.gate {p.gate!r} is not one of "
                             f"{', '.join(reward_lib.GATES)}.")
        if p.gate != "probe_only" and p.validity not in rewards.CPU_REWARDS:
            raise ConfigError(f"config.reward.probe.validity {p.validity!r} is not one of "
                             f"{', '.join(rewards.CPU_REWARDS)}.")
        paths = [x for x in [p.path, *p.ensemble.split(","), p.auxiliary] if x and x != "bootstrap"]
        if not (p.path or p.ensemble):
            raise ConfigError("config.reward.probe.path is empty; give the probe selected by "
                             "`rossjax probe-sweep` (its .json manifest beside it).")
        for x in paths:
            if not os.path.exists(x + ".json"):
                raise ConfigError(f"config.reward.probe: {x}.json (the probe's manifest) does not exist.")
    from rossjax.train.propel import (
        rewards as propel_rewards,  # PROPEL's reference model and SIL sections
    )

    propel_rewards.check_config(r)


def _check_dapo(g, max_len: int):
    """Dynamic sampling, the overlong settings and the sampling temperature."""
    if g.temperature < 0:
        raise ConfigError(f"config.grpo.temperature is {g.temperature}; it must be >= 0.")
    if g.dynamic_sampling and g.async_sampling:
        raise ConfigError("config.grpo.dynamic_sampling needs config.grpo.async_sampling=False: "
                          "a refill round needs this step's rewards before the next batch is drawn.")
    if g.max_refill_rounds < 0:
        raise ConfigError(f"config.grpo.max_refill_rounds is {g.max_refill_rounds}; it must be >= 0.")
    if not 0 <= g.overlong_buffer < max_len:
        what = "max_new_tokens" if max_len == g.max_new_tokens else "agent.max_tokens"
        raise ConfigError(f"config.grpo.overlong_buffer {g.overlong_buffer} must be in "
                          f"[0, {what} = {max_len}) (0: no overlong penalty).")
    if g.overlong_penalty < 0:
        raise ConfigError(f"config.grpo.overlong_penalty is {g.overlong_penalty}; it must be >= 0.")
