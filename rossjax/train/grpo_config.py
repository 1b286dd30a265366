"""Every field a GRPO config has (configs/grpo_verifier.py and configs/propel_azr.py start from
`default_config()`), and the checks that turn a bad one into one sentence before a model loads."""

from __future__ import annotations

import os

from rossjax.errors import ConfigError
from rossjax.probes import reward as reward_lib
from rossjax.train import grpo_losses
from rossjax.verify import rewards


def default_config():
    """Every field a GRPO config has (configs/grpo_verifier.py and configs/propel_azr.py start here)."""
    import ml_collections as mlc

    from rossjax.sharding import distributed_config
    from rossjax.train import optim as optim_lib

    c = mlc.ConfigDict()
    c.workdir = ""
    c.run_name = "grpo"
    c.tokenizer = "qwen"       # load_tokenizer spec, or "ascii" (written to WORKDIR/tokenizer)
    c.template = "chatml"
    c.system = ""              # optional system message before each task prompt
    c.model = mlc.ConfigDict(dict(path="", preset="", dtype="bfloat16", param_dtype="float32",
                                  remat_policy="none", attention_impl="auto", vocab_size=-1))
    c.train = mlc.ConfigDict(dict(seed=0))
    c.data = mlc.ConfigDict(dict(tasks="gen:arith", seed=0))
    # gen:induction (PROPEL/AZR): inputs per task, how many the solver sees, which ones
    c.data.induction = mlc.ConfigDict(dict(n_inputs=10, n_visible=5, split="first"))
    c.grpo = mlc.ConfigDict(dict(
        steps=200, contexts=16, group_size=8, max_new_tokens=512, temperature=1.0, top_p=1.0,
        top_k=0, num_iterations=1, minibatch=0, minibatches=1, micro_batches=1,
        shuffle_minibatches=True,
        advantages="mean",
        eps_low=0.2, eps_high=0.2, beta=0.0, agg="token_mean", is_mode="none", is_how="truncate",
        is_low=0.0, is_high=2.0, loss_chunk=512, async_sampling=False, max_bad_steps=5,
        stop_after=-1))  # stop_after > 0: save and exit after that step (as on SIGTERM)
    c.lora = mlc.ConfigDict(dict(enabled=False, rank=16, alpha=32.0, targets="all"))
    c.reward = mlc.ConfigDict(dict(functions=("verifier",), weights=(1.0,), workers=2,
                                   success_threshold=0.5))
    c.reward.fn = ""  # module:function, (prompt, completion, task) -> float (verify/rewards.py)
    c.reward.probe = mlc.ConfigDict(dict(path="", ensemble="", auxiliary="", gate="hard_gate",
                                         invalid_reward=-0.2, validity="validity", render="task"))
    c.optim = optim_lib.default_config()
    c.optim.peak_lr, c.optim.end_lr, c.optim.warmup_steps, c.optim.weight_decay = 1e-6, 1e-6, 0, 0.0
    c.optim.schedule = "constant"
    c.checkpoint = mlc.ConfigDict(dict(save_every=50, keep=3, async_save=True))
    c.log_every = 1
    c.log = mlc.ConfigDict(dict(wandb=""))  # wandb=PROJECT: also log to Weights & Biases
    c.sample_every = 10
    c.mesh = mlc.ConfigDict(dict(data=1, fsdp=-1, tensor=1, num_devices=0))
    c.sharding_rules = ()
    c.distributed = distributed_config()  # multi-host: one process per host, see rossjax/train/grpo.py
    return c


def check_config(cfg):
    """One-sentence ValueErrors for a GRPO config, before any model is loaded."""
    g, r = cfg.grpo, cfg.reward
    names = {"advantages": grpo_losses.ADVANTAGES, "agg": grpo_losses.AGGREGATIONS,
             "is_mode": ("none", *grpo_losses.IS_MODES), "is_how": grpo_losses.IS_HOW}
    for field, allowed in names.items():
        if g[field] not in allowed:
            raise ConfigError(f"config.grpo.{field} {g[field]!r} is not one of {', '.join(allowed)}.")
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
    rewards.check_custom(r)  # reward.fn: importable; alone, it is the run's reward
    kinds = (*rewards.CPU_REWARDS, "probe")
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
