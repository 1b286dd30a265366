"""`rossjax grpo --config=configs/grpo_verifier.py --workdir=DIR`: the GRPO loop (`run(cfg, workdir)`).

Per step: take `contexts` tasks, sample `group_size` candidates each (one prefill per prompt),
send the candidates to the reward workers (CPU processes), and while they score, compute the
trainer's log-probs (old policy, and the frozen reference when beta > 0) on the accelerator —
the old-policy pass is skipped when one update takes the whole batch (grpo_step.on_policy:
the update's own forward gives them, ratio 1; TIS/IcePop still compare with the sampler's) —
and, with `async_sampling`, already sample the next step's batch. Then group advantages,
`num_iterations` passes of minibatch updates (clipped surrogate + beta x k3 KL; each minibatch
split into `micro_batches` with exact gradient accumulation), metrics, history records and
checkpoints. Resume restores state, task index and history, and rewinds metrics.jsonl,
samples.jsonl and TensorBoard to the restored step; without `async_sampling` a resumed run is
bit-exact (sampling seeds and minibatch order follow the step). A workdir whose checkpoint already
reaches `grpo.steps` is reported as complete. Before the model loads, the workdir is checked
writable and stale temporary checkpoint folders are removed; before step 1, that a checkpoint
fits on its disk; the full config is saved as config.json/config.py, and metrics.png is drawn at
the end. The workdir may be `gs://...` (etils.epath).

Deviation: with `async_sampling` the next batch is sampled before this step's update, so it is
one update behind the policy it trains (the usual one-step-off-policy pipelining); the sampler
log-probs are kept, and `grpo.is_mode` corrects the gap with truncated IS or IcePop.

Scale: one process per host (`config.distributed`, as for `rossjax train`) over a data x fsdp x
tensor mesh of all devices. Every process takes the same tasks and runs the same host-side work
(rendering, rewards on its own reward workers), so host values agree everywhere; device work
(sampling, log-probs, updates) runs once over the global mesh, and process 0 alone writes the
history, samples and metrics. The probe reward (a second forward over an activation store) is
one-host only.

LoRA (`lora.enabled`): the trainable tree is the adapters; the reference log-probs come from the
same base weights with the adapters off, so no second model copy is held. Full fine-tuning with
beta > 0 keeps a frozen copy of the initial weights as the reference.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import jax
import numpy as np

from rossjax import sharding
from rossjax.errors import ConfigError
from rossjax.monitor import MetricsWriter, Progress, RunFile, read_metrics, step_at_most, write_plot
from rossjax.train import (
    advantages,
    checkpoint as ckpt_lib,
    dynamic_sampling,
    grpo_losses,
    grpo_step,
    history,
    resume,
    rollout,
    workdir as workdir_lib,
)
from rossjax.train.grpo_config import check_config, default_config  # noqa: F401 (configs use it)
from rossjax.train.grpo_setup import STEP_CACHE, Run, StepCache  # noqa: F401 (StepCache: callers)
from rossjax.train.loop import Diverged


def _data_state(src_index, hist_bytes):
    return {"tasks_index": int(src_index), "history_bytes": int(hist_bytes)}


class _Timer:
    """Named wall-clock spans of one step (seconds)."""

    def __init__(self):
        self.s: dict[str, float] = {}

    def span(self, name: str, t0: float) -> float:
        now = time.perf_counter()
        self.s[name] = self.s.get(name, 0.0) + now - t0
        return now


@dataclasses.dataclass
class _Scored:
    """One step's batch after log-probs and rewards: what the updates and the records need."""
    cur: dict
    cpu: list
    total: np.ndarray
    per: dict
    full: dict        # host arrays of the update batch
    ent: np.ndarray
    is_metrics: dict


class Loop:
    """The GRPO run: `start()` restores or initializes, `step(i)` runs one step, `close()`."""

    def __init__(self, cfg, workdir: str, cpu_scorer=None, step_cache=STEP_CACHE):
        sharding.initialize_distributed(cfg.distributed)
        if jax.process_count() > 1 and "probe" in cfg.reward.functions:
            raise ConfigError(f"config.reward.functions uses 'probe', which runs on one host, but "
                              f"this job has {jax.process_count()} processes.")
        self.cfg, self.workdir = cfg, workdir
        self.lead = jax.process_index() == 0  # the process that writes files
        ckpt_dir = os.path.join(workdir, "checkpoints")
        workdir_lib.prepare(workdir, "grpo", ckpt_dir, lead=self.lead)
        self.source = rollout.TaskSource(cfg.data.tasks, cfg.data.seed,  # a bad task file fails first
                                         induction=cfg.data.get("induction"))
        self.ckpt = ckpt_lib.Checkpointer(ckpt_dir, save_every=cfg.checkpoint.save_every,
                                          keep=cfg.checkpoint.keep,
                                          async_save=cfg.checkpoint.async_save)
        resume.check(workdir, cfg, "grpo", resuming=self.ckpt.latest_step() is not None,
                     data=resume.tasks_fingerprint(cfg.data.tasks), data_field="data.tasks",
                     lead=self.lead)
        self.pending = None   # the next step's batch, sampled ahead with async_sampling
        self.metrics: dict = {}
        self.R = None
        # A finished workdir: say so (run() returns its last metrics) without loading a model.
        self.complete = workdir_lib.finished_step(self.ckpt, cfg.grpo.steps)
        if self.complete is not None:
            return
        self.R = Run(cfg, workdir, cpu_scorer, step_cache=step_cache,
                     fresh_start=self.ckpt.latest_step() is None)
        workdir_lib.check_free_space(workdir, workdir_lib.tree_bytes(self.R.abstract_state()), cfg.checkpoint.keep, "grpo")

    def start(self):
        """Restore the latest checkpoint (state, task index, history) or start fresh; open files."""
        cfg, R, lead = self.cfg, self.R, self.lead
        if lead:
            workdir_lib.save_config(self.workdir, cfg)
        hist_path = os.path.join(self.workdir, "history.jsonl")
        self.start_step, self.state, ds = self.ckpt.restore_latest(R.abstract_state(), "grpo")  # a damaged step: falls back
        if self.start_step is not None:
            self.source.set_state({"index": ds["tasks_index"]})
            self.hist = history.HistoryWriter(hist_path, resume_bytes=ds["history_bytes"], enabled=lead)
        else:
            self.start_step = 0
            self.state = R.new_state()
            self.hist = history.HistoryWriter(hist_path, enabled=lead)
        if lead:  # model_config.json (+ lora.json: checkpoints then hold adapters only)
            R.trainable.write_run_files(self.workdir)
        log = cfg.get("log") or {}
        self.writer = MetricsWriter(self.workdir, resume_step=self.start_step,
                                    wandb=log.get("wandb", ""), config=cfg.to_dict())
        if lead:
            self.samples_f = RunFile(os.path.join(self.workdir, "samples.jsonl"))
            self.samples_f.rewind_lines(step_at_most(self.start_step))
        else:
            self.samples_f = open(os.devnull, "a")
        self.consumed = self.source.index
        self.announce()
        self.bar = Progress(cfg.grpo.steps, initial=self.start_step, desc="grpo")

    def announce(self):
        cfg, R, g = self.cfg, self.R, self.cfg.grpo
        who = "" if jax.process_count() == 1 else \
            f" (process {jax.process_index()} of {jax.process_count()})"
        print(f"rossjax grpo{who}: {R.model_cfg.model_type} {R.model_cfg.num_params() / 1e6:.1f}M params"
              f"{' + LoRA r=%d' % cfg.lora.rank if cfg.lora.enabled else ''}, {g.steps} steps of "
              f"{g.contexts} x {g.group_size} candidates, {R.updates_per_step} updates/step, rewards "
              f"{tuple(cfg.reward.functions)} on {cfg.reward.workers} workers, from step "
              f"{self.start_step}.", file=sys.stderr)

    def collect(self, step: int, params, timer: _Timer):
        """This step's batch (sampled now, or ahead by the previous step), its rewards submitted
        to the CPU workers, and, with async_sampling, the next step's batch sampled meanwhile."""
        g = self.cfg.grpo
        cur = self.pending if self.pending is not None else \
            self.R.sample(params, self.source.next(g.contexts), step)
        timer.s["sample"] = 0.0 if self.pending is not None else cur["sample_s"]
        self.pending = None
        self.consumed += g.contexts
        get_cpu = self.R.workers.submit(self.R.cpu_kinds, cur["records"])
        if g.async_sampling and step + 1 < g.steps:
            self.pending = self.R.sample(params, self.source.next(g.contexts), step + 1)
            timer.s["sample"] += self.pending["sample_s"]
        return cur, get_cpu

    def score(self, cur, get_cpu, params, timer: _Timer) -> _Scored:
        """Trainer (and reference) log-probs on the accelerator while the CPU rewards finish;
        then rewards, group advantages and importance weights."""
        R, g = self.R, self.cfg.grpo
        t = time.perf_counter()
        b = R.fns.put_rows({k: cur["batch"][k] for k in grpo_step.BATCH_KEYS})
        old_lp = ent = None  # on-policy: the update's own forward gives them (ratio 1)
        if not R.fns.on_policy:
            old_lp, ent = (sharding.to_host(x) for x in R.fns.logp(params, b))
        t = timer.span("logp", t)
        ref_lp = sharding.to_host(R.fns.logp(R.ref, b)[0]) if g.beta > 0 else old_lp
        zeros = np.zeros(cur["batch"]["mask"].shape, np.float32)
        t = timer.span("ref", t)
        cpu = get_cpu()
        t = timer.span("reward_wait", t)
        total, per = R.rewards(cur["records"], cpu)
        timer.span("reward_probe", t)
        if g.overlong_buffer > 0:  # DAPO's soft overlong penalty, added to the reward
            per["overlong"] = advantages.overlong_penalty(
                cur["gen"].lengths, g.max_new_tokens, g.overlong_buffer, g.overlong_penalty)
            total = total + per["overlong"]
        adv = np.asarray(grpo_losses.group_advantages(total, g.group_size, g.advantages))
        if g.overlong_filter:  # DAPO: a truncated completion gets no loss
            done = np.asarray([f != "length" for f in cur["gen"].finish_reason])
            cur["batch"]["mask"] = cur["batch"]["mask"] * done[:, None].astype(np.int32)
        w, is_m = (zeros, {}) if old_lp is None else self._is_weights(
            old_lp, cur["batch"]["sampler_logp"], cur["batch"]["mask"])
        full = {**{k: cur["batch"][k] for k in grpo_step.BATCH_KEYS},
                "old_logp": zeros if old_lp is None else np.asarray(old_lp),
                "ref_logp": zeros if ref_lp is None else np.asarray(ref_lp),
                "is_weights": np.asarray(w), "sampler_logp": cur["batch"]["sampler_logp"],
                "adv": adv}
        return _Scored(cur, cpu, total, per, full, None if ent is None else np.asarray(ent), is_m)

    def _is_weights(self, trainer_lp, sampler_lp, mask):
        g = self.cfg.grpo
        if g.is_mode == "none":
            return np.zeros(mask.shape, np.float32), {}
        return grpo_losses.importance_weights(trainer_lp, sampler_lp, mask, mode=g.is_mode,
                                              how=g.is_how, low=g.is_low, high=g.is_high)

    def refill(self, step: int, sc: _Scored, params, timer: _Timer) -> _Scored:
        """DAPO's dynamic sampling (rossjax/train/dynamic_sampling.py): while fewer than
        `contexts` groups have rewards that differ, sample and score `contexts` more prompts, at
        most `max_refill_rounds` times; the update batch takes the informative groups."""
        R, g = self.R, self.cfg.grpo
        rounds = [sc]
        informative = lambda: sum((~advantages.uniform_groups(x.total, g.group_size)).sum()
                                  for x in rounds)
        while informative() < g.contexts and len(rounds) <= g.max_refill_rounds:
            cur = R.sample(params, self.source.next(g.contexts), step, refill=len(rounds))
            timer.s["sample"] += cur["sample_s"]
            self.consumed += g.contexts
            rounds.append(self.score(cur, R.workers.submit(R.cpu_kinds, cur["records"]),
                                     params, timer))
        out, metrics = dynamic_sampling.assemble(rounds, g.contexts, g.group_size)
        f = out.full
        _, out.is_metrics = self._is_weights(f["old_logp"], out.cur["batch"]["sampler_logp"],
                                             f["mask"])
        out.is_metrics.update(metrics)  # step metrics beside the IS ones
        return out

    def update(self, step: int, full: dict, timer: _Timer) -> list:
        """`num_iterations` passes of minibatch updates; returns their metrics (host values)."""
        R, g = self.R, self.cfg.grpo
        t = time.perf_counter()
        n_rows, ums = len(full["adv"]), []
        rng = np.random.default_rng([self.cfg.train.seed, step])  # the same order after a resume
        for _ in range(g.num_iterations):
            order = rng.permutation(n_rows) if g.shuffle_minibatches else np.arange(n_rows)
            for s0 in range(0, n_rows, R.minibatch):
                idx = order[s0:s0 + R.minibatch]
                self.state, um = R.fns.update(self.state, R.base, R.fns.put_rows(
                    {k: v[idx] for k, v in full.items()}))
                ums.append(um)
        ums = jax.device_get(ums)
        timer.span("update", t)
        if int(ums[-1]["bad_steps"]) >= g.max_bad_steps:
            raise Diverged(f"stopped at step {step + 1}: non-finite GRPO updates.")
        return ums

    def record(self, done: int, sc: _Scored, ums: list, timer: _Timer, t_step: float) -> dict:
        """History records (rewards, verdicts), metrics and samples of a finished step."""
        cfg, g = self.cfg, self.cfg.grpo
        for k, rec in enumerate(sc.cur["records"]):
            rec["reward"] = float(sc.total[k])
            rec["rewards"] = {n: float(v[k]) for n, v in sc.per.items()}
            verdicts = [sc.cpu[k][n][1] for n in ("verifier", "contains", "validity") if n in sc.cpu[k]]
            rec["verifier"] = history.reward_verdict(rec["reward"], verdicts, cfg.reward.functions,
                                                     cfg.reward.success_threshold)
        self.hist.append(sc.cur["records"])
        step_s = time.perf_counter() - t_step
        m = rollout.step_metrics(
            sc.total, sc.per, g.group_size, cfg.reward.success_threshold, ent=sc.ent,
            mask=sc.cur["batch"]["mask"], lengths=sc.cur["gen"].lengths,
            finish=sc.cur["gen"].finish_reason, updates=ums, is_metrics=sc.is_metrics)
        s = timer.s
        m.update(time_sample_s=s["sample"], time_logp_s=s["logp"], time_ref_s=s["ref"],
                 time_reward_wait_s=s["reward_wait"], time_reward_probe_s=s["reward_probe"],
                 time_update_s=s["update"], time_step_s=step_s,
                 accelerator_idle_frac=s["reward_wait"] / max(step_s, 1e-9))
        if done % cfg.log_every == 0 or done == g.steps:
            self.writer.write(done, m)
        if cfg.sample_every > 0 and done % cfg.sample_every == 0:
            history.write_samples(self.samples_f, done, sc.cur["records"][:: max(1, g.group_size // 2)])
        self.bar.update(1, reward=m["reward_mean"], kl=m["kl"], len=m["completion_len_mean"])
        return m

    def step(self, step: int) -> dict:
        t_step = time.perf_counter()
        timer = _Timer()
        params = self.R.policy(self.state)
        cur, get_cpu = self.collect(step, params, timer)
        sc = self.score(cur, get_cpu, params, timer)
        if self.cfg.grpo.dynamic_sampling:
            sc = self.refill(step, sc, params, timer)
        ums = self.update(step, sc.full, timer)
        self.ckpt.check_resumed_step(step, ums[0]["loss"], "grpo")  # a resume's first step: finite?
        self.metrics = self.record(step + 1, sc, ums, timer, t_step)
        return self.metrics

    def fit(self):
        """Steps to the end, to a SIGTERM or to `stop_after`; checkpoints as configured."""
        g = self.cfg.grpo
        with ckpt_lib.PreemptionGuard() as guard:
            for step in range(self.start_step, g.steps):
                self.step(step)
                done = step + 1
                # The data state counts only tasks of finished steps (a pending batch is redone).
                ds = _data_state(self.consumed, self.hist.tell())
                self.ckpt.save(done, self.state, ds)
                if ckpt_lib.any_process(guard.requested) or done == g.stop_after:
                    self.ckpt.save(done, self.state, ds, force=True)
                    why = (guard.signal_name or "SIGTERM") if guard.requested else "stop_after"
                    self.bar.write(f"rossjax grpo: {why} at step {done}; checkpoint saved, exiting.")
                    return
            self.ckpt.save(g.steps, self.state, _data_state(self.consumed, self.hist.tell()),
                           force=True)

    def close(self):
        if self.R is not None:
            self.R.workers.close()
        self.ckpt.close()
        for name in ("bar", "writer", "hist", "samples_f"):
            if hasattr(self, name):
                getattr(self, name).close()
        if hasattr(self, "writer"):
            write_plot(self.workdir, [("reward_mean", ("train",)), ("loss", ("train",)),
                                      ("kl", ("train",))], out="metrics.png",
                       title=f"rossjax grpo {self.cfg.run_name}")


def run(cfg, workdir: str, *, cpu_scorer=None, step_cache=STEP_CACHE) -> dict:
    """`rossjax grpo`. `cpu_scorer(kinds, records) -> [{kind: (reward, verdict)}]` replaces
    `rewards.score_batch` on the reward workers (a picklable module-level function; the
    benchmark's chosen-cost reward). `step_cache` keeps compiled steps for the next run in
    this process with the same settings (a `StepCache`; the default is shared). Returns the
    final state, last metrics, tokenizer spec, history path and the run's model/step holder."""
    with workdir_lib.unlock_at_end(workdir):  # the workdir lock Loop takes, however it ends
        loop = Loop(cfg, workdir, cpu_scorer, step_cache)
        try:
            if loop.complete is not None:  # nothing to run: the last logged metrics
                return {"state": None, "metrics": (read_metrics(workdir) or [{}])[-1],
                        "tokenizer": None, "history": os.path.join(workdir, "history.jsonl"),
                        "run": None, "complete": True, "step": loop.complete}
            loop.start()
            loop.fit()
        finally:
            loop.close()
    return {"state": loop.state, "metrics": loop.metrics, "tokenizer": loop.R.tok_spec,
            "history": os.path.join(workdir, "history.jsonl"), "run": loop.R}
