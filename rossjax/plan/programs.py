"""The programs a command compiles, built by the command's own step builders on abstract inputs.

    progs = programs.for_config(cfg, partitioner, prompt_len=512)   # [Program, ...]

`train` (SFT, every recipe, LoRA too): `sft.make_train_step` with the shardings the trainer
uses (`trainable.Trainable`, `optim.make_optimizer`, `Partitioner.rows`), on a
[global_batch, seq_len] batch. `grpo`: `grpo_step.StepFns`, the same object `grpo_setup.Run`
builds: the policy update on one minibatch (and its shared-prompt variant where the run takes it,
one device) and the log-prob pass that scores the old policy and the reference; the rollout
engine's insert / decode (/ extend) programs (plan/engine.py); the probe reward's reference
forward where `reward.functions` holds "probe" (plan/forward.py). `extract`: its jitted
forward + pooling on one batch (plan/forward.py). Nothing here copies a step: a change to a
builder is what the plan compiles.

Arguments are ShapeDtypeStructs carrying the shardings (no weights exist); a model section's
`path` is read for its config.json only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rossjax.errors import ConfigError
from rossjax.models import shardings as model_shardings
from rossjax.train import metrics as metrics_lib, optim, trainable as trainable_lib
from rossjax.train.sft import step as sft


@dataclasses.dataclass
class Program:
    name: str
    jitted: object            # a jax.jit-wrapped function
    args: tuple               # abstract arguments (ShapeDtypeStructs with shardings)
    model_flops: float        # useful FLOPs per call, all devices (6N per token + attention)
    what: str = ""            # one line: rows x tokens, what it runs
    knobs: tuple = ()         # config fields that shrink it (the DOES NOT FIT sentence)
    training: bool = True     # a backward pass (remat recomputes the forward); False: inference
    devices: int = 0          # devices it runs on (0: the mesh's; 1: one device)
    min_bytes: float = 0.0    # HBM traffic per device per call the model implies (a loop that
                              # cost_analysis counts once: the engine's decode steps)


def _sds(shape, dtype, sh):
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sh)


def command_of(cfg) -> str:
    """'grpo' | 'train' | 'extract' from the config's sections."""
    if "grpo" in cfg:
        return "grpo"
    if "recipe" in cfg and "train" in cfg:
        return "train"
    if "layers" in cfg and "batch_tokens" in cfg:
        return "extract"
    raise ConfigError("rossjax plan: the config is neither an SFT config (recipe, train, data), "
                      "a GRPO config (grpo) nor an extract config (layers, batch_tokens); plan "
                      "takes configs/ross_sft.py, configs/retrogen_sft.py, configs/grpo_*.py, "
                      "configs/propel_*.py, configs/extract.py.")


def _base_arg(t):
    """The frozen base a LoRA step takes (abstract), or None."""
    if t.lora_alpha is None:
        return None
    return model_shardings.sharded_abstract_params(t.model_cfg, t.param_shardings)


_SFT_KNOBS = ("model.remat_policy", "train.micro_batches", "mesh.fsdp", "mesh.tensor",
              "train.loss_chunk", "lora.enabled")


def sft_programs(cfg, part) -> list[Program]:
    t = trainable_lib.Trainable(cfg, part)
    rows, seq = int(cfg.train.global_batch), int(cfg.data.seq_len)
    steps = int(cfg.train.num_steps) if int(cfg.train.num_steps) > 0 else 1000
    optimizer, schedule = optim.make_optimizer(cfg.optim, steps)
    shardings = t.state_shardings(optimizer)
    state = t.abstract_state(optimizer, shardings)
    bs = part.rows(2, (rows, seq), name="the training batch (config.train.global_batch)")
    batch = {k: _sds((rows, seq), jnp.int32, bs) for k in sft.BATCH_KEYS}
    # what loop.Trainer.compile_steps builds
    step = sft.make_train_step(t.model_cfg, optimizer, schedule, mesh=part, shardings=shardings,
                               batch_sharding=bs, micro_batches=int(cfg.train.micro_batches),
                               chunk_size=cfg.train.loss_chunk, lora_alpha=t.lora_alpha,
                               base_shardings=t.base_shardings)
    base = _base_arg(t)
    args = (state, batch) + ((base,) if base is not None else ())
    flops = metrics_lib.train_flops_per_token(t.model_cfg, seq) * rows * seq
    return [Program(f"train step ({cfg.recipe})", step, args, flops,
                    f"{rows} x {seq} tokens, {t.model_cfg.num_params() / 1e9:.2f}B params",
                    _SFT_KNOBS)]


_GRPO_KNOBS = ("model.remat_policy", "grpo.micro_batches", "grpo.minibatches",
               "mesh.fsdp", "mesh.tensor", "grpo.loss_chunk", "lora.enabled")


def grpo_programs(cfg, part, prompt_len: int) -> list[Program]:
    from rossjax.train.rl import agentic_grpo, grpo_step

    g = cfg.grpo
    t = trainable_lib.Trainable(cfg, part)
    rows = int(g.contexts) * int(g.group_size)
    minibatch = int(g.minibatch) if g.minibatch > 0 else rows // max(1, g.get("minibatches", 1))
    if rows % minibatch or minibatch % int(g.micro_batches):
        raise ConfigError(f"config.grpo: minibatch {minibatch} must divide the {rows} rows of a "
                          f"step and be divisible by micro_batches {g.micro_batches}.")
    updates = int(g.num_iterations) * (rows // minibatch)
    optimizer, schedule = optim.make_optimizer(cfg.optim, int(g.steps) * updates)
    st_sh = t.state_shardings(optimizer)
    max_new = agentic_grpo.loss_len(cfg)
    # what grpo_setup.Run._setup_updates builds
    fns = grpo_step.StepFns(t.model_cfg, optimizer, schedule, partitioner=part,
                            param_shardings=t.param_shardings, state_shardings=st_sh,
                            base_shardings=t.base_shardings or {}, lora_alpha=t.lora_alpha,
                            loss_cfg=g, chunk=g.loss_chunk, max_new=max_new)
    seq = grpo_step.batch_length(int(prompt_len) + int(g.max_new_tokens))
    rows_sh = fns.row_sharding
    adv_sh = part.rows(1)

    def batch(n, keys):
        out = {k: _sds((n, seq), jnp.int32, rows_sh) for k in keys if k in grpo_step.BATCH_KEYS}
        out.update({k: _sds((n, seq), jnp.float32, rows_sh) for k in keys
                    if k not in grpo_step.BATCH_KEYS and k != "adv"})
        if "adv" in keys:
            out["adv"] = _sds((n,), jnp.float32, adv_sh)
        return out

    state = t.abstract_state(optimizer, st_sh)
    base = _base_arg(t) or {}
    upd_keys = (*grpo_step.BATCH_KEYS, "old_logp", "ref_logp", "is_weights", "sampler_logp", "adv")
    per_tok = metrics_lib.train_flops_per_token(t.model_cfg, seq)
    shape = f"{minibatch} x {seq} tokens ({g.contexts} x {g.group_size} rollouts, " \
            f"{prompt_len} prompt + {g.max_new_tokens} new)"
    progs = [Program("grpo update", fns._update[False], (state, base, batch(minibatch, upd_keys)),
                     per_tok * minibatch * seq, shape, _GRPO_KNOBS)]
    if fns.group > 1:   # one device: the run takes the shared-prompt path when rows allow
        progs.append(Program("grpo update (shared prompt)", fns._update[True],
                             (state, base, batch(minibatch, upd_keys)), per_tok * minibatch * seq,
                             shape, _GRPO_KNOBS))
    params = model_shardings.sharded_abstract_params(t.model_cfg, t.param_shardings)
    if not fns.on_policy or g.beta > 0:
        progs.append(Program("log-probs (old policy / reference)", fns._logp[False],
                             (params, batch(rows, grpo_step.BATCH_KEYS)),
                             per_tok / 3 * rows * seq, f"{rows} x {seq} tokens, forward only",
                             ("grpo.loss_chunk", "mesh.fsdp", "mesh.tensor"), training=False))
    from rossjax.plan import engine, forward

    progs += engine.grpo_engine_programs(cfg, t.model_cfg, part, prompt_len=prompt_len,
                                         program_cls=Program)
    if "probe" in cfg.reward.functions:
        progs += forward.probe_programs(cfg, t.model_cfg, part, seq_len=seq,
                                        program_cls=Program)
    return progs


def for_config(cfg, part, *, prompt_len: int = 512, seq_len: int = 4096) -> list[Program]:
    command = command_of(cfg)
    if command == "grpo":
        return grpo_programs(cfg, part, prompt_len)
    if command == "extract":
        from rossjax.plan import forward

        return forward.extract_programs(cfg, part, seq_len=seq_len, program_cls=Program)
    return sft_programs(cfg, part)
