"""The default config sections of the training commands, and the SFT recipes, as plain data.

ml_collections only, no jax: a config file (configs/*.py), `--help` and the CPU half read them
without loading a trainer. The library's own names are aliases of these:
`rossjax.train.rl.grpo_config.default_config` (also `rossjax.train.rl.grpo.default_config`),
`rossjax.train.optim.default_config`, `rossjax.sharding.distributed_config` and
`rossjax.train.sft.step.RECIPES`. Checks of a filled-in config live with the code that runs it
(`grpo_config.check_config`, `loop.check_recipe`).
"""

from __future__ import annotations

import ml_collections as mlc

# The three SFT recipes: the same rollouts and optimizer, differing only in rows and mask.
# `rows` and `mask_mode` are how `rossjax curate` must have written the training dir (the
# trainer compares them with its report.json); `trains_on` is the recipe in words.
RECIPES = {
    "ross": dict(rows="accepted", mask_mode="annotated",
                 trains_on="reviewer-accepted/revised, verifier-positive rows; annotated masks"),
    "ross_no_mask": dict(rows="accepted", mask_mode="eligible",
                         trains_on="the same rows; every assistant token"),
    "positive_sft": dict(rows="verifier_positive", mask_mode="eligible",
                         trains_on="every verifier-positive row; every assistant token"),
    # Plain SFT on a TRL / verl conversational dataset with no verdicts or reviews: no verifier
    # runs, every valid row is kept (a stored failed verdict is still withheld).
    "sft": dict(rows="verifier_positive", mask_mode="eligible",
                curate=dict(verify="stored", unverified="keep"),
                trains_on="every valid row, unverified; every assistant token"),
}


def curate_recipe(cfg) -> list[str]:
    """`--config.recipe=NAME` on a curate config: set the recipe's curate fields (rows,
    mask_mode and its extras) in `cfg`. Returns what it set, for the run's note."""
    name = cfg.get("recipe", "")
    if not name:
        return []
    if name not in RECIPES:
        from rossjax.errors import ConfigError

        raise ConfigError(f"config.recipe {name!r} is not one of {', '.join(RECIPES)}.")
    r = RECIPES[name]
    fields = dict(rows=r["rows"], mask_mode=r["mask_mode"], **r.get("curate", {}))
    with cfg.unlocked():
        for k, v in fields.items():
            cfg[k] = v
    return [f"{k}={v}" for k, v in fields.items()]


def recipe_table() -> str:
    """RECIPES as the Markdown table README.md carries and `rossjax train|curate --help` print
    (`--config.recipe=NAME` on curate sets the flags after it)."""
    lines = ["| recipe (`--config.recipe=` on curate and train) | curate fields it sets | rows, mask |",
             "|---|---|---|"]
    for name, r in RECIPES.items():
        flags = " ".join(f"--config.{k}={v}" for k, v in
                         dict(rows=r["rows"], mask_mode=r["mask_mode"], **r.get("curate", {})).items())
        lines.append(f"| `{name}` | `{flags}` | {r['trains_on']} |")
    return "\n".join(lines)


def distributed_config() -> mlc.ConfigDict:
    """The `config.distributed` section (train and grpo configs share it)."""
    return mlc.ConfigDict(dict(
        enabled=False,       # call jax.distributed.initialize (TPU pods detect the rest)
        coordinator="",      # host:port; "" = auto-detect (TPU, SLURM)
        num_processes=-1,
        process_id=-1,
        cpu_collectives="",  # "gloo" for multi-process CPU runs
    ))


def sandbox_config() -> mlc.ConfigDict:
    """The `config.sandbox` section of every command that runs model-written code. `require`:
    "" runs in the strongest mode the machine offers (a hook-only run warns), "landlock" or
    "namespaces" refuses to start unless the kernel enforces that wall (verify/sandbox.py)."""
    return mlc.ConfigDict(dict(require=""))


def optim_config() -> mlc.ConfigDict:
    """The `config.optim` section: the ROSS relearning recipe (rossjax/train/optim.py says why)."""
    return mlc.ConfigDict(dict(
        name="adamw",
        peak_lr=4e-6,
        end_lr=2e-7,
        warmup_frac=0.05,
        warmup_steps=-1,  # >= 0 overrides warmup_frac
        schedule="cosine",  # cosine | constant | linear
        b1=0.9,
        b2=0.98,
        eps=1e-8,
        weight_decay=0.1,
        decay="matrices",  # matrices | all
        clip_norm=1.0,  # <= 0 disables clipping
    ))


def lora_config() -> mlc.ConfigDict:
    """The `config.lora` section (models/lora.py): off by default."""
    return mlc.ConfigDict(dict(enabled=False, rank=16, alpha=32.0, targets="all"))


def grpo_config() -> mlc.ConfigDict:
    """Every field a GRPO config has (configs/grpo_verifier.py and configs/propel_azr.py start
    here; `rossjax.train.rl.grpo_config.check_config` checks a filled-in one)."""
    c = mlc.ConfigDict()
    c.workdir = ""
    c.resume_changes = ""  # FIELD,...: config fields a resumed run may change (train/resume.py)
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
    c.sandbox = sandbox_config()
    c.grpo = mlc.ConfigDict(dict(
        steps=200, contexts=16, group_size=8, max_new_tokens=512, temperature=1.0, top_p=1.0,
        top_k=0, num_iterations=1, minibatch=0, minibatches=1, micro_batches=1,
        shuffle_minibatches=True,
        advantages="mean",
        eps_low=0.2, eps_high=0.2, beta=0.0, agg="token_mean", is_mode="none", is_how="truncate",
        is_low=0.0, is_high=2.0, loss_chunk=512, async_sampling=False, max_bad_steps=5,
        stop_after=-1))  # stop_after > 0: save and exit after that step (as on SIGTERM)
    # Registries (a built-in name or module:function): policy_loss ppo_clip | gspo | cispo
    # (rossjax/train/rl/policy_losses.py), kl k1 | k2 | k3 | k3_unbiased (train/rl/kl.py); likewise
    # advantages (train/rl/advantages.py) and agg (train/rl/grpo_losses.py) above.
    c.grpo.policy_loss = "ppo_clip"
    c.grpo.kl = "k3"
    # One device, rows in groups: pack each group's completions into rows of max_new_tokens + 1
    # after its prompt (train/rl/packed_prompt.py) where that drops a quarter of the slots or more.
    c.grpo.pack_completions = True
    # DAPO: drop groups whose rewards all agree and refill the batch with newly sampled prompts,
    # at most max_refill_rounds extra rounds a step (still short: uniform groups, masked out).
    c.grpo.dynamic_sampling = False
    c.grpo.max_refill_rounds = 3
    c.grpo.overlong_filter = False   # DAPO: truncated completions get no loss (mask 0)
    c.grpo.overlong_buffer = 0       # DAPO's L_cache; > 0 adds the soft overlong penalty, falling
    c.grpo.overlong_penalty = 1.0    # linearly to -overlong_penalty at max_new_tokens
    c.lora = lora_config()
    c.reward = mlc.ConfigDict(dict(functions=("verifier",), weights=(1.0,), workers=2,
                                   success_threshold=0.5))
    c.reward.fn = ""  # module:function, (prompt, completion, task) -> float (verify/rewards.py)
    c.reward.probe = mlc.ConfigDict(dict(path="", ensemble="", auxiliary="", gate="hard_gate",
                                         invalid_reward=-0.2, validity="validity", render="task"))
    c.optim = optim_config()
    c.optim.peak_lr, c.optim.end_lr, c.optim.warmup_steps, c.optim.weight_decay = 1e-6, 1e-6, 0, 0.0
    c.optim.schedule = "constant"
    c.checkpoint = mlc.ConfigDict(dict(save_every=50, keep=3, async_save=True))
    c.log_every = 1
    c.log = mlc.ConfigDict(dict(wandb=""))  # wandb=PROJECT: also log to Weights & Biases
    c.sample_every = 10
    c.mesh = mlc.ConfigDict(dict(data=1, fsdp=-1, tensor=1, num_devices=0))
    c.sharding_rules = ()
    c.distributed = distributed_config()  # multi-host: one process per host, see rossjax/train/rl/grpo.py
    return c
