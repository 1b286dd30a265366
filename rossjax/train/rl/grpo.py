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
the end. The workdir may be `gs://...` (etils.epath). That scaffolding, and SIGTERM, SIGHUP or a
first Ctrl-C saving and stopping the run, is the shared run skeleton's (train/skeleton.py).

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
from rossjax.errors import ConfigError, Diverged
from rossjax.monitor import RunFile, read_metrics, step_at_most
from rossjax.train import checkpoint as ckpt_lib, resume, skeleton
from rossjax.train.rl import (
    advantages,
    agentic_grpo,
    dynamic_sampling,
    grpo_losses,
    grpo_step,
    history,
    rollout,
)
from rossjax.train.rl.grpo_config import check_config, default_config  # noqa: F401 (configs use it)
from rossjax.train.rl.grpo_setup import STEP_CACHE, Run, StepCache  # noqa: F401 (StepCache: callers)


def _data_state(src_index, hist_bytes, seq_len=0):
    # seq_len: the run's batch length so far (a resumed run pads as the uninterrupted one)
    return {"tasks_index": int(src_index), "history_bytes": int(hist_bytes),
            "seq_len": int(seq_len)}


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
    sampled: dict          # Run.sample's tasks, records, batch, gen
    cpu_scores: list       # per candidate {kind: (reward, verdict)} from the reward workers
    reward: np.ndarray     # per candidate, the weighted total
    rewards: dict          # kind -> per-candidate reward
    update_rows: dict      # host arrays of the update batch (old/ref log-probs, advantages)
    entropy: np.ndarray    # per token, of the trainer's next-token distribution (None on-policy)
    is_metrics: dict


def reward_words(reward) -> str:
    """The banner's reward clause: the names joined, and where they are computed (0 workers: in
    this process; an environment's reward: during the rollout)."""
    if tuple(reward.functions) == ("env",):
        return "reward env (judged by the environment during each episode)"
    where = (f"on {reward.workers} reward process{'es' if reward.workers != 1 else ''}"
             if reward.workers else "in this process (reward.workers 0)")
    return f"rewards {', '.join(reward.functions)} {where}"


class GRPOTrainer(skeleton.Skeleton):
    """The GRPO run on the shared skeleton (train/skeleton.py): its tasks, model and rewards
    (grpo_setup.Run), history and samples files, and the step (`train_step`)."""

    command, desc = "grpo", "grpo"
    plot = (("reward_mean", ("train",)), ("loss", ("train",)), ("kl", ("train",)))

    def __init__(self, cfg, workdir: str, cpu_scorer=None, step_cache=STEP_CACHE):
        self.cpu_scorer, self.step_cache = cpu_scorer, step_cache
        self.pending = None   # the next step's batch, sampled ahead with async_sampling
        self.run = None
        super().__init__(cfg, workdir)

    def check_job(self, cfg):
        if jax.process_count() > 1 and "probe" in cfg.reward.functions:
            raise ConfigError(f"config.reward.functions uses 'probe', which runs on one host, but "
                              f"this job has {jax.process_count()} processes.")

    def prepare(self):
        cfg = self.cfg
        self.source = rollout.TaskSource(cfg.data.tasks, cfg.data.seed,  # a bad task file fails first
                                         induction=cfg.data.get("induction"),
                                         math=cfg.data.get("math"))

    def total_steps(self) -> int:
        return self.cfg.grpo.steps

    def data_fingerprint(self):
        return resume.tasks_fingerprint(self.cfg.data.tasks), "data.tasks"

    def build(self):
        self.run = Run(self.cfg, self.workdir, self.cpu_scorer, step_cache=self.step_cache,
                       fresh_start=self.ckpt.latest_step() is None)

    def abstract_state(self):
        return self.run.abstract_state()

    def init_state(self):
        return self.run.new_state()

    def restored(self, data_state):
        """The task index and history.jsonl of the restored step (or fresh ones)."""
        hist_path = os.path.join(self.workdir, "history.jsonl")
        if data_state is not None:
            self.source.set_state({"index": data_state["tasks_index"]})
            self.run.seq_len = int(data_state.get("seq_len", 0))
            self.hist = history.HistoryWriter(hist_path, resume_bytes=data_state["history_bytes"],
                                              enabled=self.lead)
        else:
            self.hist = history.HistoryWriter(hist_path, enabled=self.lead)

    def run_files(self):  # model_config.json (+ lora.json: checkpoints then hold adapters only)
        self.run.trainable.write_run_files(self.workdir)

    def opened(self):
        if self.lead:
            self.samples_f = RunFile(os.path.join(self.workdir, "samples.jsonl"))
            self.samples_f.rewind_lines(step_at_most(self.start_step))
        else:
            self.samples_f = open(os.devnull, "a")
        self.consumed = self.source.index

    def announce(self):
        cfg, run, g = self.cfg, self.run, self.cfg.grpo
        who = "" if jax.process_count() == 1 else \
            f" (process {jax.process_index()} of {jax.process_count()})"
        print(f"rossjax grpo{who}: {run.model_cfg.model_type} {run.model_cfg.num_params() / 1e6:.1f}M params"
              f"{' + LoRA r=%d' % cfg.lora.rank if cfg.lora.enabled else ''}, {g.steps} steps of "
              f"{g.contexts} x {g.group_size} candidates, {run.updates_per_step} updates/step, "
              f"{reward_words(cfg.reward)}, from step {self.start_step}.", file=sys.stderr)
        if run.probe_names:  # which probe pays the reward, before any step runs
            print(f"rossjax grpo{who}: probe reward from {'; '.join(run.probe_names)}",
                  file=sys.stderr)

    def collect(self, step: int, params, timer: _Timer):
        """This step's batch (sampled now, or ahead by the previous step), its rewards submitted
        to the CPU workers, and, with async_sampling, the next step's batch sampled meanwhile."""
        g = self.cfg.grpo
        sampled = self.pending if self.pending is not None else \
            self.run.sample(params, self.source.next(g.contexts), step)
        timer.s["sample"] = 0.0 if self.pending is not None else sampled["sample_s"]
        self.pending = None
        self.consumed += g.contexts
        with ckpt_lib.ctrl_c_blocked():  # workers it starts are deaf to a terminal's Ctrl-C
            get_cpu = self.run.workers.submit(self.run.cpu_kinds, sampled["records"])
        if g.async_sampling and step + 1 < g.steps:
            self.pending = self.run.sample(params, self.source.next(g.contexts), step + 1)
            timer.s["sample"] += self.pending["sample_s"]
        return sampled, get_cpu

    def score(self, sampled, get_cpu, params, timer: _Timer) -> _Scored:
        """Trainer (and reference) log-probs on the accelerator while the CPU rewards finish;
        then rewards, group advantages and importance weights."""
        run, g = self.run, self.cfg.grpo
        t = time.perf_counter()
        b = run.fns.put_rows({k: sampled["batch"][k] for k in grpo_step.BATCH_KEYS})
        old_lp = entropy = None  # on-policy: the update's own forward gives them (ratio 1)
        if not run.fns.on_policy:
            old_lp, entropy = (sharding.to_host(x) for x in run.fns.logp(params, b))
        t = timer.span("logp", t)
        ref_lp = sharding.to_host(run.fns.logp(run.ref, b)[0]) if g.beta > 0 else old_lp
        zeros = np.zeros(sampled["batch"]["mask"].shape, np.float32)
        t = timer.span("ref", t)
        cpu_scores = get_cpu()
        t = timer.span("reward_wait", t)
        reward, rewards = run.rewards(sampled["records"], cpu_scores)
        timer.span("reward_probe", t)
        if g.overlong_buffer > 0:  # DAPO's soft overlong penalty, added to the reward
            rewards["overlong"] = advantages.overlong_penalty(
                *agentic_grpo.overlong_basis(self.cfg, sampled), g.overlong_buffer,
                g.overlong_penalty)
            reward = reward + rewards["overlong"]
        adv = np.asarray(grpo_losses.group_advantages(reward, g.group_size, g.advantages))
        if g.overlong_filter:  # DAPO: a truncated completion gets no loss
            done = np.asarray([f != "length" for f in sampled["gen"].finish_reason])
            sampled["batch"]["mask"] = sampled["batch"]["mask"] * done[:, None].astype(np.int32)
        w, is_m = (zeros, {}) if old_lp is None else self._is_weights(
            old_lp, sampled["batch"]["sampler_logp"], sampled["batch"]["mask"])
        update_rows = {**{k: sampled["batch"][k] for k in grpo_step.BATCH_KEYS},
                "old_logp": zeros if old_lp is None else np.asarray(old_lp),
                "ref_logp": zeros if ref_lp is None else np.asarray(ref_lp),
                "is_weights": np.asarray(w), "sampler_logp": sampled["batch"]["sampler_logp"],
                "adv": adv}
        return _Scored(sampled, cpu_scores, reward, rewards, update_rows,
                       None if entropy is None else np.asarray(entropy), is_m)

    def _is_weights(self, trainer_lp, sampler_lp, mask):
        g = self.cfg.grpo
        if g.is_mode == "none":
            return np.zeros(mask.shape, np.float32), {}
        return grpo_losses.importance_weights(trainer_lp, sampler_lp, mask, mode=g.is_mode,
                                              how=g.is_how, low=g.is_low, high=g.is_high)

    def refill(self, step: int, scored: _Scored, params, timer: _Timer) -> _Scored:
        """DAPO's dynamic sampling (rossjax/train/rl/dynamic_sampling.py): while fewer than
        `contexts` groups have rewards that differ, sample and score `contexts` more prompts, at
        most `max_refill_rounds` times; the update batch takes the informative groups."""
        run, g = self.run, self.cfg.grpo
        rounds = [scored]
        informative = lambda: sum((~advantages.uniform_groups(x.reward, g.group_size)).sum()
                                  for x in rounds)
        while informative() < g.contexts and len(rounds) <= g.max_refill_rounds:
            sampled = run.sample(params, self.source.next(g.contexts), step, refill=len(rounds))
            timer.s["sample"] += sampled["sample_s"]
            self.consumed += g.contexts
            with ckpt_lib.ctrl_c_blocked():
                get_cpu = run.workers.submit(run.cpu_kinds, sampled["records"])
            rounds.append(self.score(sampled, get_cpu, params, timer))
        out, metrics = dynamic_sampling.assemble(rounds, g.contexts, g.group_size)
        f = out.update_rows
        _, out.is_metrics = self._is_weights(f["old_logp"], out.sampled["batch"]["sampler_logp"],
                                             f["mask"])
        out.is_metrics.update(metrics)  # step metrics beside the IS ones
        return out

    def update(self, step: int, update_rows: dict, timer: _Timer) -> list:
        """`num_iterations` passes of minibatch updates; returns their metrics (host values)."""
        run, g = self.run, self.cfg.grpo
        t = time.perf_counter()
        n_rows, updates = len(update_rows["adv"]), []
        rng = np.random.default_rng([self.cfg.train.seed, step])  # the same order after a resume
        for _ in range(g.num_iterations):
            order = rng.permutation(n_rows) if g.shuffle_minibatches else np.arange(n_rows)
            for s0 in range(0, n_rows, run.minibatch):
                idx = order[s0:s0 + run.minibatch]
                self.state, m = run.fns.update(self.state, run.base, run.fns.put_rows(
                    {k: v[idx] for k, v in update_rows.items()}))
                updates.append(m)
        updates = jax.device_get(updates)
        timer.span("update", t)
        if int(updates[-1]["bad_steps"]) >= g.max_bad_steps:
            raise Diverged(f"stopped at step {step + 1}: non-finite GRPO updates.")
        return updates

    def record(self, scored: _Scored, updates: list, timer: _Timer, t_step: float) -> dict:
        """History records (rewards, verdicts) and the metrics of a finished step."""
        cfg, g = self.cfg, self.cfg.grpo
        for k, rec in enumerate(scored.sampled["records"]):
            rec["reward"] = float(scored.reward[k])
            rec["rewards"] = {n: float(v[k]) for n, v in scored.rewards.items()}
            scores = scored.cpu_scores[k]
            verdicts = [scores[n][1] for n in ("verifier", "contains", "validity", "env")
                        if n in scores]
            rec["verifier"] = history.reward_verdict(rec["reward"], verdicts, cfg.reward.functions,
                                                     cfg.reward.success_threshold)
        self.hist.append(scored.sampled["records"])
        step_s = time.perf_counter() - t_step
        m = rollout.step_metrics(
            scored.reward, scored.rewards, g.group_size, cfg.reward.success_threshold,
            ent=scored.entropy,
            mask=scored.sampled["batch"]["mask"], lengths=scored.sampled["gen"].lengths,
            finish=scored.sampled["gen"].finish_reason, updates=updates,
            is_metrics=scored.is_metrics)
        s = timer.s
        m.update(time_sample_s=s["sample"], time_logp_s=s["logp"], time_ref_s=s["ref"],
                 time_reward_wait_s=s["reward_wait"], time_reward_probe_s=s["reward_probe"],
                 time_update_s=s["update"], time_step_s=step_s,
                 accelerator_idle_frac=s["reward_wait"] / max(step_s, 1e-9))
        m.update(self.run.cost_metrics())  # solver trials (SIL) and peak memory
        return m

    def train_step(self, step: int) -> dict:
        t_step = time.perf_counter()
        timer = _Timer()
        params = self.run.policy(self.state)
        sampled, get_cpu = self.collect(step, params, timer)
        scored = self.score(sampled, get_cpu, params, timer)
        if self.cfg.grpo.dynamic_sampling:
            scored = self.refill(step, scored, params, timer)
        updates = self.update(step, scored.update_rows, timer)
        self.ckpt.check_resumed_step(step, updates[0]["loss"], "grpo")  # a resume's first step: finite?
        self.records = scored.sampled["records"]
        return self.record(scored, updates, timer, t_step)

    def data_state(self):
        # The data state counts only tasks of finished steps (a pending batch is redone).
        return _data_state(self.consumed, self.hist.tell(), self.run.seq_len)

    def log_every(self) -> int:
        return self.cfg.log_every

    def progress(self, m: dict) -> dict:
        return {"reward": m["reward_mean"], "kl": m["kl"], "len": m["completion_len_mean"]}

    def step_hooks(self):
        half = max(1, self.cfg.grpo.group_size // 2)
        return [skeleton.Hook(lambda i: history.write_samples(self.samples_f, i.done,
                                                              self.records[::half]),
                              every=self.cfg.sample_every)]

    def stop_reason(self, done: int) -> str:
        return "stop_after" if done == self.cfg.grpo.stop_after else ""

    def release(self):
        if self.run is not None:
            self.run.workers.close()

    def close_files(self):
        for name in ("hist", "samples_f"):
            if hasattr(self, name):
                getattr(self, name).close()

    def plot_title(self) -> str:
        return f"rossjax grpo {self.cfg.run_name}"

    def complete_result(self) -> dict:  # nothing to run: the last logged metrics
        return {"state": None, "metrics": (read_metrics(self.workdir) or [{}])[-1],
                "tokenizer": None, "history": os.path.join(self.workdir, "history.jsonl"),
                "run": None, "complete": True, "step": self.complete}

    def result(self) -> dict:
        return {"state": self.state, "metrics": self.metrics, "tokenizer": self.run.tok_spec,
                "history": os.path.join(self.workdir, "history.jsonl"), "run": self.run,
                **self.stop_info()}


def run(cfg, workdir: str, *, cpu_scorer=None, step_cache=STEP_CACHE) -> dict:
    """`rossjax grpo`. `cpu_scorer(kinds, records) -> [{kind: (reward, verdict)}]` replaces
    `rewards.score_batch` on the reward workers (a picklable module-level function; the
    benchmark's chosen-cost reward). `step_cache` keeps compiled steps for the next run in
    this process with the same settings (a `StepCache`; the default is shared). Returns the
    final state, last metrics, tokenizer spec, history path and the run's model/step holder."""
    return GRPOTrainer.execute(cfg, workdir, cpu_scorer, step_cache)
