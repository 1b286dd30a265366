"""`rossjax grpo --config=configs/grpo_verifier.py --workdir=DIR`: the GRPO loop.

Per step: take `contexts` tasks, sample `group_size` candidates each (one prefill per prompt),
send the candidates to the reward workers (CPU processes), and while they score, compute the
trainer's log-probs (old policy, and the frozen reference when beta > 0) on the accelerator —
and, with `async_sampling`, already sample the next step's batch. Then group advantages,
`num_iterations` passes of minibatch updates (clipped surrogate + beta x k3 KL; each minibatch
split into `micro_batches` with exact gradient accumulation), metrics, history records and
checkpoints. Resume restores state, task index and history; without `async_sampling` a resumed
run is bit-exact (sampling seeds and minibatch order follow the step).

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

import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from rossjax import sample, sharding
from rossjax.tokenizers import load_tokenizer
from rossjax.models import lora
from rossjax.probes import reward as reward_lib
from rossjax.train import checkpoint as ckpt_lib
from rossjax.tokenizers.ascii import write_ascii_tokenizer
from rossjax.train import grpo_losses, grpo_step, history, optim, rollout, sft
from rossjax.train.grpo_config import check_config, default_config  # noqa: F401 (configs use it)
from rossjax.train import loop as sft_loop
from rossjax.train import metrics as metrics_lib
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


def _render_fn(cfg, tok):
    """What the probe reads for a candidate (must match how its training rows were rendered)."""
    if cfg.reward.probe.render == "record":
        return lambda rec: (rec["token_ids"], None)
    if cfg.reward.probe.render != "task":
        raise ValueError(f"config.reward.probe.render {cfg.reward.probe.render!r} is not task or record.")

    def render(rec):
        msgs = [{"role": "user", "content": rec["messages"][-1]["content"] or " "}]
        return tok.encode(rollout.render_prompt(msgs, cfg.template, tok)), None
    return render


_STEP_FNS: dict = {}


class _Run:
    """Holds the model, step functions and reward machinery of one run."""

    def __init__(self, cfg, workdir, cpu_scorer=None):
        check_config(cfg)
        self.cfg, self.workdir = cfg, workdir
        g = cfg.grpo
        self.tok, self.tok_spec = _setup_tokenizer(cfg, workdir)
        if self.tok.eos_id is None:
            raise ValueError(f"config.tokenizer {cfg.tokenizer!r} has no end-of-turn token (eos).")
        if cfg.tokenizer == "ascii" and not cfg.model.path and cfg.model.vocab_size <= 0:
            cfg.model.vocab_size = self.tok.vocab_size
        devices = jax.devices()[:cfg.mesh.num_devices] if cfg.mesh.num_devices > 0 else None
        self.mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, devices)
        self.rules = sharding.normalize_rules(cfg.sharding_rules or None)
        self.model_cfg, source = sft_loop.abstract_model(cfg)
        self.base_source = source
        if self.tok.vocab_size > self.model_cfg.vocab_size:
            raise ValueError(f"config.tokenizer has {self.tok.vocab_size} tokens but the model only "
                             f"{self.model_cfg.vocab_size}.")
        self.p_shard = sharding.param_shardings(self.model_cfg, self.mesh, self.rules)
        base = sft_loop.load_params(cfg, self.model_cfg, source, self.mesh, self.rules, self.p_shard)
        self.lora_alpha = float(cfg.lora.alpha) if cfg.lora.enabled else None
        if cfg.lora.enabled:
            ad = lora.init_lora(self.model_cfg, jax.random.PRNGKey(cfg.train.seed + 1), cfg.lora.rank,
                                cfg.lora.targets)
            self.t_shard = lora.shardings(self.model_cfg, ad, self.mesh, self.rules)
            trainable, self.base, self.base_shard = jax.device_put(ad, self.t_shard), base, self.p_shard
            self.ref = base  # adapters off
        else:
            self.t_shard, trainable = self.p_shard, base
            self.base, self.base_shard = {}, None
            # A frozen copy: the trainable params are donated and updated in place.
            self.ref = (jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=self.p_shard)(base)
                        if g.beta > 0 or self._uses_probe() else None)
        rows = g.contexts * g.group_size
        self.minibatch = g.minibatch if g.minibatch > 0 else rows
        if rows % self.minibatch:
            raise ValueError(f"config.grpo.minibatch {self.minibatch} does not divide the "
                             f"{rows} rows of a step (contexts x group_size).")
        if self.minibatch % g.micro_batches:
            raise ValueError(f"config.grpo.micro_batches {g.micro_batches} does not divide the "
                             f"minibatch of {self.minibatch} rows.")
        self.updates_per_step = g.num_iterations * (rows // self.minibatch)
        self.optimizer, schedule = optim.make_optimizer(cfg.optim, g.steps * self.updates_per_step)
        abstract_t = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                  trainable, self.t_shard)
        self.s_shard = sft.state_shardings(self.t_shard, self.optimizer, abstract_t, self.mesh)
        self.abstract_t = abstract_t
        self._trainable0 = trainable
        # Compiled steps are reused by later runs in this process with the same settings (a
        # resumed run, tests): jit caches per function object, and StepFns builds new ones.
        g_key = json.dumps({k: v for k, v in g.to_dict().items() if k != "stop_after"},
                           sort_keys=True, default=str)
        key = (self.model_cfg, cfg.optim.to_json(), g_key, cfg.lora.to_json(), self.lora_alpha,
               g.steps, tuple(d.id for d in self.mesh.devices.flat), tuple(self.mesh.shape.items()),
               str(self.rules))
        if key not in _STEP_FNS:
            _STEP_FNS.clear()  # hold one: compiled programs of other models are not kept alive
            _STEP_FNS[key] = grpo_step.StepFns(
                self.model_cfg, self.optimizer, schedule, mesh=self.mesh,
                param_shardings=self.p_shard, state_shardings=self.s_shard,
                base_shardings=self.base_shard or {}, lora_alpha=self.lora_alpha, loss_cfg=g,
                chunk=g.loss_chunk, max_new=g.max_new_tokens)
        self.fns = _STEP_FNS[key]
        self.cpu_kinds = tuple(f for f in cfg.reward.functions if f in rewards.CPU_REWARDS)
        if self._uses_probe() and cfg.reward.probe.gate != "probe_only":
            self.cpu_kinds = tuple(dict.fromkeys(self.cpu_kinds + (cfg.reward.probe.validity,)))
        self.workers = WorkerPool(cfg.reward.workers, cpu_scorer or rewards.score_batch)
        self.probe_reward = None
        if self._uses_probe():
            p = cfg.reward.probe
            render = _render_fn(cfg, self.tok)
            paths = [x for x in [p.path, *p.ensemble.split(",")] if x]
            scorers = [reward_lib.bootstrap_validity_probe(self.model_cfg, self.ref, render,
                                                           seed=cfg.train.seed)
                       if x == "bootstrap" else reward_lib.ProbeScorer.load(x) for x in paths]
            aux = reward_lib.ProbeScorer.load(p.auxiliary) if p.auxiliary else None
            self.probe_reward = reward_lib.ProbeReward(self.model_cfg, self.ref, scorers, render,
                                                       auxiliary=aux)

    def _uses_probe(self):
        return "probe" in self.cfg.reward.functions

    def policy(self, state):
        if self.lora_alpha is None:
            return state["params"]  # used before the update donates it
        return self.fns.merge(state["params"], self.base)

    def sample(self, params, tasks, step):
        g, tok = self.cfg.grpo, self.tok
        msgs = [rollout.prompt_messages(t, self.cfg.system) for t in tasks]
        prompts = [tok.encode(rollout.render_prompt(m, self.cfg.template, tok)) for m in msgs]
        t0 = time.perf_counter()
        gen = sample.generate(self.model_cfg, params, prompts, g.max_new_tokens,
                              temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
                              stop_ids=(tok.eos_id,), num_samples=g.group_size,
                              seed=self.cfg.train.seed * 100_003 + step, mesh=self.mesh)
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
        s = grpo_step.round_up(max(map(len, prompts)) + g.max_new_tokens, 16)
        batch = grpo_step.completion_batch(prompts, gen, g.group_size, s)
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
        used = {f: per[f] for f in c.functions}
        total = reward_lib.combine(used, dict(zip(c.functions, c.weights)))
        return total, per


def _data_state(src_index, hist_bytes):
    return {"tasks_index": int(src_index), "history_bytes": int(hist_bytes)}


def run(cfg, workdir: str, *, cpu_scorer=None) -> dict:
    """`cpu_scorer(kinds, records) -> [{kind: (reward, verdict)}]` replaces `rewards.score_batch`
    on the reward workers (a picklable module-level function; the benchmark's chosen-cost reward)."""
    g = cfg.grpo
    sft_loop.setup_distributed(cfg.distributed)
    if jax.process_count() > 1 and "probe" in cfg.reward.functions:
        raise ValueError(f"config.reward.functions uses 'probe', which runs on one host, but this "
                         f"job has {jax.process_count()} processes.")
    lead = jax.process_index() == 0  # the process that writes files
    os.makedirs(workdir, exist_ok=True)
    source = rollout.TaskSource(cfg.data.tasks, cfg.data.seed)  # a bad task file fails first
    R = _Run(cfg, workdir, cpu_scorer)
    ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), save_every=cfg.checkpoint.save_every,
                                 keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save)
    start = ckpt.latest_step()
    if start is not None:
        state, ds = ckpt.restore(start, sft.abstract_state(R.s_shard, R.optimizer, R.abstract_t))
        source.set_state({"index": ds["tasks_index"]})
        hist = history.HistoryWriter(os.path.join(workdir, "history.jsonl"),
                                     resume_bytes=ds["history_bytes"], enabled=lead)
    else:
        start = 0
        state = sft.init_state(R._trainable0, R.optimizer, R.s_shard, cfg.train.seed)
        hist = history.HistoryWriter(os.path.join(workdir, "history.jsonl"), enabled=lead)
    del R._trainable0
    if lead:
        ckpt_lib.write_model_config(workdir, R.model_cfg)
    if cfg.lora.enabled and lead:  # checkpoints hold adapters only; export merges them into this base
        ckpt_lib.write_lora_manifest(workdir, rank=cfg.lora.rank, alpha=cfg.lora.alpha,
                                     targets=lora.resolve_targets(cfg.lora.targets),
                                     base_source=R.base_source, base_path=cfg.model.path,
                                     seed=cfg.train.seed)
    writer = metrics_lib.MetricsWriter(workdir)
    samples_f = open(os.path.join(workdir, "samples.jsonl") if lead else os.devnull, "a")
    print(f"rossjax grpo{'' if jax.process_count() == 1 else f' (process {jax.process_index()} of {jax.process_count()})'}: {R.model_cfg.model_type} {R.model_cfg.num_params() / 1e6:.1f}M params"
          f"{' + LoRA r=%d' % cfg.lora.rank if cfg.lora.enabled else ''}, {g.steps} steps of "
          f"{g.contexts} x {g.group_size} candidates, {R.updates_per_step} updates/step, rewards "
          f"{tuple(cfg.reward.functions)} on {cfg.reward.workers} workers, from step {start}.",
          file=sys.stderr)
    bar = metrics_lib.Progress(g.steps, initial=start, desc="grpo")
    consumed = source.index
    pending, m = None, {}
    try:
        with ckpt_lib.PreemptionGuard() as guard:
            for step in range(start, g.steps):
                t_step = time.perf_counter()
                params = R.policy(state)
                cur = pending if pending is not None else R.sample(params, source.next(g.contexts), step)
                sample_s = 0.0 if pending is not None else cur["sample_s"]  # time inside this step
                pending = None
                consumed += g.contexts
                get_cpu = R.workers.submit(R.cpu_kinds, cur["records"])
                if g.async_sampling and step + 1 < g.steps:
                    pending = R.sample(params, source.next(g.contexts), step + 1)
                    sample_s += pending["sample_s"]
                t0 = time.perf_counter()
                b = R.fns.put_rows({k: cur["batch"][k] for k in grpo_step.BATCH_KEYS})
                old_lp, ent = (sharding.to_host(x) for x in R.fns.logp(params, b))
                device_s = time.perf_counter() - t0
                t_ref = time.perf_counter()
                ref_lp = sharding.to_host(R.fns.logp(R.ref, b)[0]) if g.beta > 0 else old_lp
                ref_s = time.perf_counter() - t_ref
                t1 = time.perf_counter()
                cpu = get_cpu()
                wait_s = time.perf_counter() - t1
                t2 = time.perf_counter()
                total, per = R.rewards(cur["records"], cpu)
                reward_dev_s = time.perf_counter() - t2
                adv = np.asarray(grpo_losses.group_advantages(total, g.group_size, g.advantages))
                mask = cur["batch"]["mask"]
                if g.is_mode != "none":
                    w, is_m = grpo_losses.importance_weights(
                        old_lp, cur["batch"]["sampler_logp"], mask, mode=g.is_mode, how=g.is_how,
                        low=g.is_low, high=g.is_high)
                else:
                    w, is_m = np.zeros(mask.shape, np.float32), {}
                full = {**{k: cur["batch"][k] for k in grpo_step.BATCH_KEYS}, "old_logp": np.asarray(old_lp),
                        "ref_logp": np.asarray(ref_lp), "is_weights": np.asarray(w), "adv": adv}
                t3 = time.perf_counter()
                n_rows, ums = len(adv), []
                rng = np.random.default_rng([cfg.train.seed, step])  # the same order after a resume
                for _ in range(g.num_iterations):
                    order = rng.permutation(n_rows) if g.shuffle_minibatches else np.arange(n_rows)
                    for s0 in range(0, n_rows, R.minibatch):
                        idx = order[s0:s0 + R.minibatch]
                        state, um = R.fns.update(state, R.base, R.fns.put_rows(
                            {k: v[idx] for k, v in full.items()}))
                        ums.append(um)
                ums = jax.device_get(ums)
                update_s = time.perf_counter() - t3
                if int(ums[-1]["bad_steps"]) >= g.max_bad_steps:
                    raise sft_loop.Diverged(f"stopped at step {step + 1}: non-finite GRPO updates.")

                # history and metrics
                for k, rec in enumerate(cur["records"]):
                    rec["reward"] = float(total[k])
                    rec["rewards"] = {n: float(v[k]) for n, v in per.items()}
                    verdicts = [cpu[k][n][1] for n in ("verifier", "contains", "validity") if n in cpu[k]]
                    verdicts = [v for v in verdicts if v]
                    if verdicts:
                        rec["verifier"] = verdicts[0]
                hist.append(cur["records"])
                done = step + 1
                step_s = time.perf_counter() - t_step
                m = rollout.step_metrics(
                    total, per, g.group_size, cfg.reward.success_threshold, ent=np.asarray(ent),
                    mask=mask, lengths=cur["gen"].lengths, finish=cur["gen"].finish_reason,
                    updates=ums, is_metrics=is_m)
                m.update(time_sample_s=sample_s, time_logp_s=device_s, time_ref_s=ref_s,
                         time_reward_wait_s=wait_s, time_reward_probe_s=reward_dev_s,
                         time_update_s=update_s, time_step_s=step_s,
                         accelerator_idle_frac=wait_s / max(step_s, 1e-9))
                if done % cfg.log_every == 0 or done == g.steps:
                    writer.write(done, m)
                if cfg.sample_every > 0 and done % cfg.sample_every == 0:
                    history.write_samples(samples_f, done, cur["records"][:: max(1, g.group_size // 2)])
                bar.update(1, reward=m["reward_mean"], kl=m["kl"], len=m["completion_len_mean"])
                # The data state counts only tasks of finished steps (a pending batch is redone).
                ds = _data_state(consumed, hist.tell())
                ckpt.save(done, state, ds)
                if ckpt_lib.any_process(guard.requested) or done == g.stop_after:
                    ckpt.save(done, state, ds, force=True)
                    bar.write(f"rossjax grpo: {'SIGTERM' if guard.requested else 'stop_after'} at "
                              f"step {done}; checkpoint saved, exiting.")
                    break
            else:
                ckpt.save(g.steps, state, _data_state(consumed, hist.tell()), force=True)
    finally:
        R.workers.close()
        ckpt.close()
        bar.close()
        writer.close()
        hist.close()
        samples_f.close()
    return {"state": state, "metrics": m, "tokenizer": R.tok_spec,
            "history": os.path.join(workdir, "history.jsonl"), "run": R}


def main(argv) -> int:
    from rossjax.cli import command_config

    cfg, workdir, _ = command_config(argv, "grpo", "configs/grpo_verifier.py (or another GRPO config)")
    t0 = time.time()
    out = run(cfg, workdir)
    print(f"rossjax grpo: done in {time.time() - t0:.0f} s, reward {out['metrics'].get('reward_mean', float('nan')):.3f}; "
          f"history {out['history']} (relearn: rossjax curate --config.input={out['history']} "
          f"--config.rows=verifier_positive --config.mask_mode=eligible "
          f"--config.tokenizer={out['tokenizer']}).")
    return 0
