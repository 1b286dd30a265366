"""What a GRPO run holds (grpo.py runs the loop): tokenizer, partitioner, the trainable set-up
(trainable.py: full params or LoRA adapters, the frozen base and reference), optimizer and state
shardings, the compiled step functions (`StepCache`), and the reward machinery (CPU workers, probe
reward). Also how a batch is sampled and scored.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from rossjax import sample, sharding
from rossjax.errors import ConfigError
from rossjax.probes import reward as reward_lib
from rossjax.tokenizers import load_tokenizer
from rossjax.tokenizers.ascii import write_ascii_tokenizer
from rossjax.train import optim, trainable as trainable_lib
from rossjax.train.rl import agentic_grpo, grpo_step, rollout
from rossjax.train.rl.grpo_config import check_config
from rossjax.verify import rewards
from rossjax.verify.pool import WorkerPool


def _setup_tokenizer(cfg, workdir):
    if cfg.tokenizer == "ascii":
        # Process 0 writes the run's copy; other processes build theirs privately (no write race).
        folder = (os.path.join(workdir, "tokenizer") if jax.process_index() == 0
                  else tempfile.mkdtemp(prefix="rossjax-tokenizer-"))
        path = write_ascii_tokenizer(folder)
        return load_tokenizer(path), path
    return load_tokenizer(cfg.tokenizer), cfg.tokenizer


class StepCache:
    """The compiled step functions of the last run built, reused by the next run in this process
    with the same settings (a resumed run, tests): jit caches per function object, and each
    `grpo_step.StepFns` is new ones. It holds one entry, so compiled programs of another model
    are not kept alive."""

    def __init__(self):
        self.key, self.fns = None, None

    def get(self, key, build):
        """The cached functions when `key` matches the last one, else `build()` (replacing it)."""
        if self.key != key:
            self.key, self.fns = None, None   # let the old programs go before compiling
            self.fns, self.key = build(), key
        return self.fns

    def clear(self):
        self.key, self.fns = None, None


STEP_CACHE = StepCache()  # what grpo.run uses unless it is given its own


class Run:
    """Holds the model, step functions and reward machinery of one run. `fresh_start=False`
    (the loop will restore a checkpoint) does not keep the loaded weights for `new_state`."""

    solver_reward = None  # PROPEL's solver-in-the-loop reward (train/propel/rewards.py)
    seq_len = 0           # the longest completion-batch length S so far (grpo_step.batch_length)

    def __init__(self, cfg, workdir, cpu_scorer=None, *, step_cache: StepCache = STEP_CACHE,
                 fresh_start: bool = True):
        check_config(cfg)
        self.cfg, self.workdir = cfg, workdir
        self.tok, self.tok_spec = _setup_tokenizer(cfg, workdir)
        if self.tok.eos_id is None:
            raise ConfigError(f"config.tokenizer {cfg.tokenizer!r} has no end-of-turn token (eos).")
        if cfg.tokenizer == "ascii" and not cfg.model.path and cfg.model.vocab_size <= 0:
            cfg.model.vocab_size = self.tok.vocab_size
        self.part = sharding.partitioner_from_config(cfg)
        self.mesh = self.part.mesh
        self._setup_model(fresh_start)
        self._setup_updates(step_cache)
        self._setup_rewards(cpu_scorer)

    def _setup_model(self, fresh_start: bool):
        """The trainable set-up, the frozen base (LoRA) and the reference: the base with the
        adapters off, or with full fine-tuning a copy of the initial weights."""
        cfg, g = self.cfg, self.cfg.grpo
        self.trainable = t = trainable_lib.Trainable(cfg, self.part)
        self.model_cfg, self.base_source, self.lora_alpha = t.model_cfg, t.source, t.lora_alpha
        if self.tok.vocab_size > self.model_cfg.vocab_size:
            raise ConfigError(f"config.tokenizer has {self.tok.vocab_size} tokens but the model "
                              f"only {self.model_cfg.vocab_size}.")
        self._initial_weights = None  # full fine-tuning: what new_state() starts from
        if t.lora is not None:
            self.base = self.ref = t.load_weights()  # the reference is the base, adapters off
            return
        self.base, self.ref = {}, None
        from rossjax.train.propel import rewards as propel_rewards

        # a probe with a reference of its own (cold transfer) does not read the policy's copy
        needs_ref = g.beta > 0 or (self._uses_probe() and not propel_rewards.own_reference(cfg))
        if not (fresh_start or needs_ref):
            return  # a resumed run's weights come from its checkpoint
        weights = t.load_weights()
        if needs_ref:  # a frozen copy: the trained params are donated and updated in place
            self.ref = jax.jit(lambda p: jax.tree.map(jnp.copy, p),
                               out_shardings=t.param_shardings)(weights)
        if fresh_start:
            self._initial_weights = weights

    def new_state(self):
        """A fresh run's train state: new LoRA adapters, or the loaded weights, which the state
        takes over (so a full fine-tuning Run gives one)."""
        weights, self._initial_weights = self._initial_weights, None
        if self.trainable.lora is None and weights is None:
            raise RuntimeError("Run.new_state: this Run's loaded weights were given to a state "
                               "already, or it was built with fresh_start=False.")
        return self.trainable.init_state(self.optimizer, self.state_shardings, weights)

    def _setup_updates(self, step_cache: StepCache):
        """Minibatch plan, optimizer, state shardings and the (cached) compiled step functions."""
        cfg, g = self.cfg, self.cfg.grpo
        rows = g.contexts * g.group_size
        # minibatch 0: the step's rows split into `minibatches` equal updates per pass
        self.minibatch = g.minibatch if g.minibatch > 0 else rows // max(1, g.get("minibatches", 1))
        if rows % self.minibatch:
            raise ConfigError(f"config.grpo.minibatch {self.minibatch} does not divide the "
                              f"{rows} rows of a step (contexts x group_size).")
        if self.minibatch % g.micro_batches:
            raise ConfigError(f"config.grpo.micro_batches {g.micro_batches} does not divide the "
                              f"minibatch of {self.minibatch} rows.")
        self.updates_per_step = g.num_iterations * (rows // self.minibatch)
        self.optimizer, schedule = optim.make_optimizer(cfg.optim, g.steps * self.updates_per_step)
        t = self.trainable
        self.state_shardings = t.state_shardings(self.optimizer)
        # The settings the compiled steps depend on (stop_after only ends the loop).
        g_key = json.dumps({k: v for k, v in g.to_dict().items() if k != "stop_after"},
                           sort_keys=True, default=str)
        loss_len = agentic_grpo.loss_len(cfg)  # an agentic row's loss region: the trajectory
        key = (self.model_cfg, cfg.optim.to_json(), g_key, cfg.lora.to_json(), self.lora_alpha,
               g.steps, self.part, loss_len)
        self.fns = step_cache.get(key, lambda: grpo_step.StepFns(
            self.model_cfg, self.optimizer, schedule, partitioner=self.part,
            param_shardings=t.param_shardings, state_shardings=self.state_shardings,
            base_shardings=t.base_shardings or {}, lora_alpha=self.lora_alpha, loss_cfg=g,
            chunk=g.loss_chunk, max_new=loss_len))

    def abstract_state(self):
        """The train state's ShapeDtypeStructs with shardings: a checkpoint restore target."""
        return self.trainable.abstract_state(self.optimizer, self.state_shardings)

    def _setup_rewards(self, cpu_scorer):
        """CPU reward kinds on the worker pool, and the probe reward (a second forward)."""
        cfg = self.cfg
        self.probe_reward, self.probe_names = None, []
        if agentic_grpo.enabled(cfg):  # the env's verdicts, judged during the rollout
            self.cpu_kinds = (agentic_grpo.ENV_REWARD,)
            self.workers = WorkerPool(0, agentic_grpo.env_scores)
            if tuple(cfg.reward.functions) == (agentic_grpo.ENV_REWARD,):
                return  # else PROPEL's probe or SIL reward, the verdict as validity (SWE)
        else:
            self.cpu_kinds = tuple(f for f in cfg.reward.functions if f in rewards.CPU_REWARDS)
            if self._uses_probe() and cfg.reward.probe.gate != "probe_only":
                self.cpu_kinds = tuple(dict.fromkeys(self.cpu_kinds + (cfg.reward.probe.validity,)))
            if "solver" in cfg.reward.functions:  # SIL: W decides which candidates are tried
                self.cpu_kinds = tuple(dict.fromkeys(self.cpu_kinds + (cfg.reward.solver.validity,)))
            self.workers = WorkerPool(cfg.reward.workers, cpu_scorer or functools.partial(
                rewards.score_batch, custom=cfg.reward.get("fn", "")))
        self.probe_reward, self.probe_names = None, []
        from rossjax.train.propel import (
            rewards as propel_rewards,  # the probe (own reference or base) and SIL
        )

        if self._uses_probe():
            self.probe_reward, self.probe_names = propel_rewards.probe_reward(self)
        self.solver_reward = propel_rewards.solver_reward(self)

    def _uses_probe(self):
        return "probe" in self.cfg.reward.functions

    def policy(self, state):
        if self.lora_alpha is None:
            return state["params"]  # used before the update donates it
        return self.fns.merge(state["params"], self.base)

    def sample(self, params, tasks, step, refill: int = 0):  # refill: DAPO's extra rounds
        if agentic_grpo.enabled(self.cfg):  # multi-turn episodes on the engine
            return agentic_grpo.sample(self, params, tasks, step, refill)
        g, tok = self.cfg.grpo, self.tok
        msgs = [rollout.prompt_messages(t, self.cfg.system) for t in tasks]
        prompts = [tok.encode(rollout.render_prompt(m, self.cfg.template, tok)) for m in msgs]
        t0 = time.perf_counter()
        gen = sample.generate(self.model_cfg, params, prompts, g.max_new_tokens,
                              temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
                              stop_ids=(tok.eos_id,), num_samples=g.group_size,
                              seed=self.cfg.train.seed * 100_003 + step + refill * 1_000_003,
                              partitioner=self.part)
        records = []
        for r in range(len(gen.lengths)):
            i, j, n = r // g.group_size, r % g.group_size, int(gen.lengths[r])
            comp = gen.tokens[r, :n].tolist()
            stopped = gen.finish_reason[r] == "stop"
            content = tok.decode(comp[:-1] if stopped else comp)
            # A truncated answer still ends its turn in the record, so curate renders it exactly.
            ids = prompts[i] + comp + ([] if stopped else [tok.eos_id])
            records.append(rollout.make_record(
                tasks[i], msgs[i], content, ids, gen.logprobs[r, :n].tolist(),
                run=self.cfg.run_name, step=step, sample=j, finish_reason=gen.finish_reason[r],
                n_prompt_tokens=len(prompts[i])))
        # One S for the run (the high-water mark, kept in checkpoints: grpo.py's data state),
        # so the update and log-prob programs compile once, not once per prompt-length mix.
        self.seq_len = grpo_step.batch_length(max(map(len, prompts)) + g.max_new_tokens,
                                              self.seq_len)
        batch = grpo_step.completion_batch(prompts, gen, g.group_size, self.seq_len)
        return {"tasks": tasks, "records": records, "batch": batch, "gen": gen,
                "sample_s": time.perf_counter() - t0}

    def rewards(self, records, cpu) -> tuple[np.ndarray, dict]:
        c = self.cfg.reward
        per = {}
        for kind in self.cpu_kinds:
            per[kind] = np.asarray([x[kind][0] for x in cpu], np.float64)
        if self.probe_reward is not None:
            valid = per.get(c.probe.validity)
            pr = self.probe_reward(records, valid)
            per["probe_score"] = pr["probe"]
            per["probe"] = reward_lib.gate(c.probe.gate, pr["probe_reward"], valid,
                                           c.probe.invalid_reward)
            if agentic_grpo.enabled(self.cfg):  # an undecided verdict (sandbox failed): NaN
                per["probe"] = np.where(np.isnan(valid), np.nan, per["probe"])
        if self.solver_reward is not None:
            per.update(self.solver_reward(records, per.get(c.solver.validity)))
        used = {f: per[f] for f in c.functions}
        total = reward_lib.combine(used, dict(zip(c.functions, c.weights)))
        return total, per

    def cost_metrics(self) -> dict:
        """Solver trials and tasks tried since the last call (SIL) and peak memory: what the
        step's metrics report of a reward's cost."""
        from rossjax.train.propel import rewards as propel_rewards

        out = propel_rewards.memory_metrics()
        if self.solver_reward is not None:
            out.update(self.solver_reward.counts())
        return out
