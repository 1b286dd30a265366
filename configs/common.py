"""What the shipped configs share: variant parsing, the `:runlocal` settings, the library's default
sections and paths to the shipped sample data. No jax: loading a config loads no trainer.

A config imports it as `from rossjax.configs import common`: configs/ is linked as
rossjax/configs (the wheel copies it in), so the import works from a checkout and an install.
"""

from __future__ import annotations

import os

from rossjax import defaults

# The library's default sections (rossjax/defaults.py), for configs to start from.
RECIPES = defaults.RECIPES
grpo_config = defaults.grpo_config
optim_config = defaults.optim_config
lora_config = defaults.lora_config
distributed_config = defaults.distributed_config
sandbox_config = defaults.sandbox_config

# The folder that holds configs/ and data/: the checkout, or the installed rossjax package.
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

TINY_PRESET = "tiny_qwen2"  # the random-init model of every `:runlocal`


def data_file(*parts: str) -> str:
    """A file of the shipped sample data (data/...), wherever rossjax is."""
    return os.path.join(ROOT, "data", *parts)


def variants(arg: str | None, allowed, config: str) -> list[str]:
    """The comma-separated variants after `--config=configs/NAME.py:`, each one of `allowed`;
    an unknown one is a ValueError naming the config file and what it accepts."""
    out = [a for a in (arg or "").split(",") if a]
    for v in out:
        if v not in allowed:
            raise ValueError(f"configs/{config}: variant {v!r} is not one of "
                             f"{', '.join(allowed)}.")
    return out


def tiny_model(model) -> None:
    """`:runlocal`'s model section: a random tiny model in float32, no remat."""
    model.preset = TINY_PRESET
    model.dtype = "float32"
    model.remat_policy = "none"


def runlocal_grpo(c, *, steps: int, max_new_tokens: int, save_every: int) -> None:
    """`:runlocal` for a GRPO config: the tiny model with the ASCII tokenizer on one device,
    4 x 4 candidates a step, one reward worker, synchronous checkpoints."""
    c.tokenizer = "ascii"
    tiny_model(c.model)
    c.grpo.steps = steps
    c.grpo.contexts = 4
    c.grpo.group_size = 4
    c.grpo.max_new_tokens = max_new_tokens
    c.grpo.loss_chunk = 64
    c.reward.workers = 1
    c.optim.peak_lr = c.optim.end_lr = 1e-3
    c.checkpoint.save_every = save_every
    c.checkpoint.async_save = False
    c.sample_every = 5
    c.mesh.num_devices = 1
