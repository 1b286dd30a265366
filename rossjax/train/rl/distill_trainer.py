"""`rossjax distill --config=configs/distill_onpolicy.py --workdir=DIR`: on-policy distillation
(`run(cfg, workdir)`), the multi-teacher (MOPD) upstream of the ROSS paper.

Per step: take `grpo.contexts` tasks, let the student sample `grpo.group_size` completions each
on GRPO's rollout engine (grpo_setup.Run.sample: the same prompts, records and completion
batch), route each row to its teacher by a task field (`distill.routes` on
`distill.route_field`, else `distill.default`), let every teacher score its rows in one forward
pass at the sampling temperature, and take one update on the per-token reverse KL to the
teacher (`distill.loss`, a DISTILL_REGISTRY name: the sampled-token estimator or the full
vocabulary; rossjax/train/rl/distill.py), split into `grpo.micro_batches` with exact gradient
accumulation, LoRA or full fine-tuning as `lora.enabled` says. The sampled-token loss scores in
a pass of its own before the update; a full-vocabulary loss scores inside the update (its one
teacher pass, distill_step.py), which hands back the log-probs the history stores. The run's rewards are still
computed on the reward workers, but only measured (metrics and the history's verdicts).

Design: a command of its own, `DistillTrainer`, a subclass of GRPOTrainer, not an objective
inside `rossjax grpo`. It reuses everything GRPO has that distillation needs unchanged:
sampling, task source, history and samples files, checkpoints, resume, multi-host, signals and
the reward workers (train/skeleton.py, grpo.py, grpo_setup.py); it replaces only what differs,
the scoring (teacher log-probs instead of advantages) and the update (distill_step.py). Put
inside `grpo`, every GRPO setting that means nothing here (advantages, clipping, IS, beta,
dynamic sampling, minibatch passes) would need a refusal in GRPO's checks and branches in its
step; as its own command those settings are refused once (distill_setup.check_config) and
GRPO's code is untouched.

History: every record also carries `teacher` (its teacher's name), `teacher_logprobs` (the
teacher's log-prob of each sampled completion token at the sampling temperature, aligned with
`logprobs` and with the completion's tokens in `token_ids`) and `distill` (loss name,
temperature, the row's summed sampled-token KL), so `rossjax curate` relearns MOPD rollouts as
it relearns GRPO's.
"""

from __future__ import annotations

import copy
import sys
import time

import numpy as np

from rossjax.errors import Diverged
from rossjax.train.rl import distill, distill_setup, grpo, grpo_step, history
from rossjax.train.rl.grpo import _Scored, _Timer


class DistillTrainer(grpo.GRPOTrainer):
    """On-policy distillation on GRPO's loop (module doc)."""

    command, desc = "distill", "distill"
    plot = (("kl", ("train",)), ("reward_mean", ("train",)), ("loss", ("train",)))

    def prepare(self):
        super().prepare()
        cfg, d = self.cfg, self.cfg.distill
        self.fingerprint = distill_setup.check_config(cfg)  # before any model loads
        # every row of a task file (a generator: its first task) has a teacher, before loading
        rows = getattr(self.source, "_rows", None)
        if rows is None:
            rows = copy.copy(self.source).next(1)
        distill.route_rows(rows, dict(d.routes), d.route_field, source=str(cfg.data.tasks),
                           default=d.default)

    def build(self):
        self.run = distill_setup.DistillRun(self.cfg, self.workdir, self.cpu_scorer,
                                            step_cache=self.step_cache,
                                            fresh_start=self.ckpt.latest_step() is None)

    def announce(self):
        cfg, run, g, d = self.cfg, self.run, self.cfg.grpo, self.cfg.distill
        teachers = ", ".join(f"{n} {c.num_params() / 1e6:.1f}M ({d.teachers[n]})"
                             for n, (c, _, _) in run.teachers.items())
        print(f"rossjax distill: student {run.model_cfg.model_type} "
              f"{run.model_cfg.num_params() / 1e6:.1f}M params"
              f"{' + LoRA r=%d' % cfg.lora.rank if cfg.lora.enabled else ''}, teachers {teachers};"
              f" loss {d.loss} at T={run.temperature:g}, {g.steps} steps of {g.contexts} x "
              f"{g.group_size} completions, {grpo.reward_words(cfg.reward)} (measured only), "
              f"from step {self.start_step}.", file=sys.stderr)

    def routed(self, sampled) -> list[str]:
        """Each row's teacher name (the rows of task i are i*G .. i*G+G-1)."""
        d, group = self.cfg.distill, self.cfg.grpo.group_size
        per_task = distill.route_rows(sampled["tasks"], dict(d.routes), d.route_field,
                                      source="the step's tasks", default=d.default)
        return [per_task[r // group] for r in range(len(sampled["records"]))]

    def score(self, sampled, get_cpu, params, timer: _Timer) -> _Scored:
        """Teacher log-probs on the accelerator while the CPU rewards finish."""
        run, batch = self.run, sampled["batch"]
        t = time.perf_counter()
        names = self.routed(sampled)
        if run.fns.full:  # the update is the teachers' one pass; it returns their log-probs
            teacher_lp, idx = None, run.teacher_index(names)
        else:
            teacher_lp, idx = run.teacher_logprobs(batch, names)
        t = timer.span("teacher", t)
        cpu_scores = get_cpu()
        t = timer.span("reward_wait", t)
        reward, rewards = run.rewards(sampled["records"], cpu_scores)
        timer.span("reward_probe", t)
        rows = {**{k: batch[k] for k in grpo_step.BATCH_KEYS}, "teacher_idx": idx}
        if teacher_lp is not None:
            rows["teacher_logp"] = teacher_lp
        sampled["teachers"] = names
        return _Scored(sampled, cpu_scores, reward, rewards, rows, None, {})

    def update(self, step: int, update_rows: dict, timer: _Timer) -> list:
        run = self.run
        t = time.perf_counter()
        self.state, m, teacher_lp = run.fns.update(self.state, run.base, run.teacher_params,
                                                   update_rows)
        if teacher_lp is not None:  # full mode: record() (after this) reads them from the rows
            update_rows["teacher_logp"] = teacher_lp
        timer.span("update", t)
        if int(m["bad_steps"]) >= self.cfg.grpo.max_bad_steps:
            raise Diverged(f"stopped at step {step + 1}: non-finite distillation updates.")
        return [m]

    def record(self, scored: _Scored, updates: list, timer: _Timer, t_step: float) -> dict:
        """History records (teacher, its log-probs, rewards, verdicts) and the step's metrics."""
        cfg, d = self.cfg, self.cfg.distill
        batch, rows = scored.sampled["batch"], scored.update_rows
        k1 = (batch["sampler_logp"] - rows["teacher_logp"]) * batch["mask"]
        for k, rec in enumerate(scored.sampled["records"]):
            p0, n = rec["source"]["prompt_tokens"] - 1, len(rec["logprobs"])
            rec["teacher"] = scored.sampled["teachers"][k]
            rec["teacher_logprobs"] = [float(x) for x in rows["teacher_logp"][k, p0:p0 + n]]
            rec["distill"] = {"loss": d.loss, "temperature": self.run.temperature,
                              "kl_sampled_sum": float(k1[k].sum())}
            rec["reward"] = float(scored.reward[k])
            rec["rewards"] = {name: float(v[k]) for name, v in scored.rewards.items()}
            scores = scored.cpu_scores[k]
            verdicts = [scores[x][1] for x in ("verifier", "contains", "validity") if x in scores]
            rec["verifier"] = history.reward_verdict(rec["reward"], verdicts, cfg.reward.functions,
                                                     cfg.reward.success_threshold)
        self.hist.append(scored.sampled["records"])
        return self.step_metrics(scored, updates[0], k1, timer, time.perf_counter() - t_step)

    def step_metrics(self, scored, u: dict, k1, timer: _Timer, step_s: float) -> dict:
        mask, gen = scored.sampled["batch"]["mask"], scored.sampled["gen"]
        cnt = max(float(mask.sum()), 1.0)
        r = scored.reward
        ok = ~np.isnan(r)
        m = {"kl": float(u["loss"]) if self.cfg.grpo.agg == "token_mean" else float("nan"),
             "loss": float(u["loss"]), "kl_sampled": float(u["kl_sampled"]),
             "kl_sampler": float(k1.sum() / cnt),  # the sampler's log-probs against the teachers'
             "student_logp": float(u["student_logp"]),
             "teacher_logp": float((scored.update_rows["teacher_logp"] * mask).sum() / cnt),
             "grad_norm": float(u["grad_norm"]), "lr": float(u["lr"]),
             "skipped": float(u["skipped"]),
             "reward_mean": float(np.mean(r[ok])) if ok.any() else float("nan"),
             **{f"reward_{n}_mean": float(np.nanmean(v)) for n, v in scored.rewards.items()},
             "completion_len_mean": float(np.mean(gen.lengths)),
             "truncated_frac": float(np.mean([f == "length" for f in gen.finish_reason]))}
        names = scored.sampled["teachers"]
        for name in dict.fromkeys(names):  # per teacher: its rows' sampled-token KL
            sel = np.asarray([x == name for x in names])
            m[f"kl_{name}"] = float(k1[sel].sum() / max(float(mask[sel].sum()), 1.0))
        s = timer.s
        m.update(time_sample_s=s["sample"], time_teacher_s=s["teacher"],
                 time_reward_wait_s=s["reward_wait"], time_update_s=s["update"],
                 time_step_s=step_s)
        return m

    def train_step(self, step: int) -> dict:
        t_step = time.perf_counter()
        timer = _Timer()
        params = self.run.policy(self.state)
        sampled, get_cpu = self.collect(step, params, timer)
        scored = self.score(sampled, get_cpu, params, timer)
        updates = self.update(step, scored.update_rows, timer)
        self.ckpt.check_resumed_step(step, updates[0]["loss"], "distill")
        self.records = scored.sampled["records"]
        return self.record(scored, updates, timer, t_step)

    def progress(self, m: dict) -> dict:
        return {"kl": m["kl_sampled"], "reward": m["reward_mean"],
                "len": m["completion_len_mean"]}

    def plot_title(self) -> str:
        return f"rossjax distill {self.cfg.run_name}"


def run(cfg, workdir: str, *, cpu_scorer=None) -> dict:
    """`rossjax distill`. Returns what grpo.run returns (state, metrics, tokenizer, history,
    the run holder)."""
    return DistillTrainer.execute(cfg, workdir, cpu_scorer, grpo.STEP_CACHE)

