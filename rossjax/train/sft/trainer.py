"""The `rossjax train` loop: config -> mesh, model, data, optimizer, checkpoints, metrics.

`run(cfg, workdir)` is the command (rossjax/cli/train.py parses the flags): a `Trainer` (on the
shared run skeleton, train/skeleton.py) sets up (plan_data, the model via rossjax.models.loading,
state, compiled steps) and `fit()`s; SIGTERM, SIGHUP or a first Ctrl-C save and stop it.

Resume is automatic: if `WORKDIR/checkpoints` holds a step, params, optimizer state, step, RNG
and the data iterator state are restored from it and the run continues bit-for-bit; metrics.jsonl
and TensorBoard are rewound to that step. A workdir whose checkpoint already reaches the last step
is reported as complete. Before step 1: the workdir is writable and has room for a checkpoint,
stale temporary checkpoint folders are removed, and the full config is saved (config.json/.py).
The workdir may be `gs://...` (etils.epath throughout).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax

from rossjax import sharding
from rossjax.errors import ConfigError, Diverged, InputError
from rossjax.models import loading
from rossjax.monitor import read_metrics
from rossjax.train import (
    data as data_lib,
    metrics as metrics_lib,
    optim,
    resume,
    skeleton,
    trainable as trainable_lib,
)
from rossjax.train.export import model as export_lib
from rossjax.train.sft import step as sft


def check_recipe(cfg, paths) -> list[str]:
    """Refuse a training dir whose report.json says it was curated for another recipe.

    Compares `mask_mode` and, when the report records it, the row filter `rows` (accepted |
    verifier_positive) with `sft.RECIPES[cfg.recipe]`. Returns notes for what could not be
    checked (a report that does not record `rows`), which the loop prints.
    """
    if cfg.recipe not in sft.RECIPES:
        raise ConfigError(f"config.recipe {cfg.recipe!r} is not one of {', '.join(sft.RECIPES)}.")
    want = sft.RECIPES[cfg.recipe]
    notes = []
    for p in paths:
        report = os.path.join(p, "report.json") if os.path.isdir(p) else None
        if not report or not os.path.exists(report):
            notes.append(f"{p} has no report.json; cannot check it was curated for recipe {cfg.recipe!r}.")
            continue
        with open(report) as f:
            rep = json.load(f)
        for field in ("mask_mode", "rows"):
            got = rep.get(field) or (rep.get("config") or {}).get(field)
            if got and got != want[field]:
                raise InputError(f"{report}: field {field!r} is {got!r} but recipe {cfg.recipe!r} "
                                 f"trains on {field} {want[field]!r} (curate with "
                                 f"--config.{field}={want[field]}).")
            if not got:
                notes.append(f"{report} does not record {field!r}; recipe {cfg.recipe!r} expects "
                             f"{field} {want[field]!r}.")
    return notes


def evaluate(eval_step, params, cfg, paths, rows, batch_shard, global_rows) -> dict:
    loader = data_lib.open_loader(paths, cfg.data, rows_per_host=rows, num_epochs=1, shuffle=False,
                                  seed=cfg.train.seed)
    n = data_lib.agree([sum(1 for _ in data_lib.open_loader(
        paths, cfg.data, rows_per_host=rows, num_epochs=1, shuffle=False, seed=cfg.train.seed))], "min")[0]
    total, count = 0.0, 0.0
    for i, b in enumerate(loader):
        if i >= n:
            break
        gb = data_lib.to_global(data_lib.local_batch(b, rows, cfg.data.seq_len), batch_shard, global_rows)
        s, c = eval_step(params, gb)
        total, count = total + float(s), count + float(c)
    return {"loss": total / max(count, 1.0), "supervised_tokens": count}


@dataclasses.dataclass
class DataPlan:
    """What one pass over the training data gives: steps, token counts, this host's rows."""
    train_paths: list
    eval_paths: list
    rows: int           # rows per host per step
    global_rows: int
    total: int          # steps this run trains
    n_sup: int
    n_tok: int
    too_long: dict = dataclasses.field(default_factory=dict)  # data.check_too_long's counts


def plan_data(cfg, workdir: str | None = None) -> DataPlan:
    """Check the batch split, read the data once: how many steps, is anything supervised."""
    nproc = jax.process_count()
    g_rows, micro = int(cfg.train.global_batch), int(cfg.train.micro_batches)
    if g_rows % nproc or g_rows % micro:
        raise ConfigError(f"config.train.global_batch {g_rows} must be divisible by the process "
                          f"count ({nproc}) and by config.train.micro_batches ({micro}).")
    rows = g_rows // nproc
    train_paths = data_lib.split_paths(cfg.data.train, "data.train")
    eval_paths = data_lib.split_paths(cfg.data.eval, "data.eval") if cfg.data.eval else []
    for note in check_recipe(cfg, train_paths):
        if jax.process_index() == 0:
            print(f"rossjax train: note: {note}", file=sys.stderr)
    too_long = data_lib.check_too_long(cfg, train_paths, eval_paths,
                                       workdir if jax.process_index() == 0 else None)
    n_batches, n_sup, n_tok = data_lib.scan(open_train(cfg, train_paths, rows))
    n_batches = int(data_lib.agree([n_batches], "min")[0])
    n_sup, n_tok = (int(x) for x in data_lib.agree([n_sup, n_tok], "sum"))
    if n_sup == 0:
        raise InputError(f"config.data.train {','.join(train_paths)} has no supervised tokens (every "
                         f"loss_mask is 0 in {n_batches} batches), so there is nothing to train on.")
    total = n_batches if cfg.train.num_steps <= 0 else min(n_batches, int(cfg.train.num_steps))
    if total == 0:
        raise InputError(f"config.data.train {','.join(train_paths)} gives no batch of {rows} rows.")
    return DataPlan(train_paths, eval_paths, rows, g_rows, total, n_sup, n_tok, too_long)


def open_train(cfg, paths, rows):
    # batch_mode "sequences": a step is global_batch rollouts (packed into <= global_batch rows)
    return data_lib.open_loader(paths, cfg.data, rows_per_host=rows, num_epochs=cfg.train.epochs,
                                shuffle=cfg.data.shuffle, seed=cfg.train.seed,
                                batch_mode=cfg.train.get("batch_mode", "token_budget"),
                                micro_batches=int(cfg.train.micro_batches))


def with_model_path(cfg, path: str):
    """`cfg` itself when it names `path` already, else a copy naming it (config.model.path)."""
    if path == cfg.model.path:
        return cfg
    out = cfg.copy_and_resolve_references()
    out.model.path = path
    return out


class Trainer(skeleton.Skeleton):
    """One SFT run on the shared skeleton (train/skeleton.py): its data plan, model, steps,
    eval and messages."""

    command, desc = "train", "train"
    plot = (("loss", ("train", "eval")),)

    def configure(self, cfg):
        # a GRPO (or SFT) run's workdir as the model: start from its last checkpoint. The run's
        # own config (checked on resume, saved, trained from) names the exported params; the
        # caller's config is read, never written
        return with_model_path(cfg, export_lib.init_from_run(cfg.model.path, self.workdir))

    def prepare(self):
        self.desc = f"train {self.cfg.recipe}"
        data_lib.check_fits_model(self.cfg, loading.abstract_model(self.cfg.model)[0].vocab_size)
        self.plan = plan_data(self.cfg, self.workdir)

    def total_steps(self) -> int:
        return self.plan.total

    def data_fingerprint(self):
        return resume.curated_fingerprint(self.plan.train_paths), "data.train"

    def _trainable(self):
        if not hasattr(self, "trainable"):
            cfg = self.cfg
            self.part = sharding.partitioner_from_config(cfg)
            # config.lora.enabled: the state trains LoRA adapters; the base is loaded frozen.
            self.trainable = trainable_lib.Trainable(cfg, self.part)
            self.model_cfg, self.source = self.trainable.model_cfg, self.trainable.source
        return self.trainable

    def check_complete(self, step: int):
        self.ckpt.check_compatible(step, self._trainable().abstract)

    def build(self):
        cfg, t = self.cfg, self._trainable()
        self.optimizer, self.schedule = optim.make_optimizer(cfg.optim, self.plan.total)
        self.shardings = t.state_shardings(self.optimizer)
        self.batch_shard = self.part.rows(2, (self.plan.global_rows, cfg.data.seq_len),
                                          name="the training batch (config.train.global_batch)")
        self.it = iter(open_train(cfg, self.plan.train_paths, self.plan.rows))

    def abstract_state(self):
        return self.trainable.abstract_state(self.optimizer, self.shardings)

    def init_state(self):
        return self.trainable.init_state(self.optimizer, self.shardings)

    def restored(self, data_state):
        if data_state is not None:
            self.it.set_state(data_state)

    def run_files(self):
        self.trainable.write_run_files(self.workdir)

    def opened(self):
        t = self.trainable
        self.base = t.load_weights() if t.lora is not None else None  # LoRA's frozen base
        self.step_fn, self.eval_step = self.compile_steps()
        # Simulated CPU devices share one machine's cores: the yardstick is one matmul, not n.
        peak = metrics_lib.measure_matmul_flops(512) * (
            1 if jax.default_backend() == "cpu" else jax.device_count())
        self.thr = metrics_lib.Throughput(
            metrics_lib.train_flops_per_token(self.model_cfg, self.cfg.data.seq_len), peak)

    def compile_steps(self):
        cfg, t = self.cfg, self.trainable
        lora_kw = dict(lora_alpha=t.lora_alpha, base_shardings=t.base_shardings)
        step_fn = sft.make_train_step(self.model_cfg, self.optimizer, self.schedule, mesh=self.part,
                                      shardings=self.shardings, batch_sharding=self.batch_shard,
                                      micro_batches=int(cfg.train.micro_batches),
                                      chunk_size=cfg.train.loss_chunk, **lora_kw)
        eval_step = (sft.make_eval_step(self.model_cfg, mesh=self.part, params_shardings=t.shardings,
                                        batch_sharding=self.batch_shard,
                                        chunk_size=cfg.train.loss_chunk, **lora_kw)
                     if self.plan.eval_paths else None)
        if t.lora is None:
            return step_fn, eval_step
        # LoRA: both steps also take the frozen base.
        return ((lambda state, batch: step_fn(state, batch, self.base)),
                eval_step and (lambda params, batch: eval_step(params, batch, self.base)))

    def announce(self):
        if self.lead:
            p, mc = self.plan, self.model_cfg
            print(f"rossjax train: {mc.model_type} {mc.num_params() / 1e6:.1f}M params "
                  f"({self.source}), {p.total} steps of {p.global_rows} x {self.cfg.data.seq_len} "
                  f"tokens, {p.n_sup} supervised of {p.n_tok} tokens per run, mesh "
                  f"{dict(self.part.mesh.shape)}, from step {self.start_step}.", file=sys.stderr)
            if data_lib.too_long_note(p.too_long):
                print(f"rossjax train: {data_lib.too_long_note(p.too_long)}.", file=sys.stderr)

    def data_state(self):
        return self.it.get_state() if hasattr(self.it, "get_state") else None

    def evaluate(self) -> dict:
        p = self.plan
        return evaluate(self.eval_step, self.state["params"], self.cfg, p.eval_paths, p.rows,
                        self.batch_shard, p.global_rows)

    def train_step(self, step: int) -> dict:
        """One optimizer step on the next batch; returns its metrics as floats."""
        cfg, p = self.cfg, self.plan
        local = data_lib.local_batch(next(self.it), p.rows, cfg.data.seq_len)
        batch = data_lib.to_global(local, self.batch_shard, p.global_rows)
        self.state, metrics = self.step_fn(self.state, batch)
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        self.ckpt.check_resumed_step(step, m["loss"], "train")  # a resume's first step: finite?
        self.thr.add(m["tokens"], m["supervised_tokens"])
        if m["bad_steps"] >= cfg.train.max_bad_steps:
            raise Diverged(f"stopped at step {step + 1}: {int(m['bad_steps'])} steps in a row "
                           f"had a non-finite loss or gradient.")
        return m

    def log_every(self) -> int:
        return self.cfg.train.log_every

    def log_metrics(self, m: dict) -> dict:
        m.update(self.thr.rates(), **data_lib.too_long_metrics(self.plan.too_long))
        return m

    def progress(self, m: dict) -> dict:
        return {"loss": m["loss"], "gnorm": m["grad_norm"], "lr": m["lr"]}

    def step_hooks(self):
        if self.eval_step is None:
            return []
        # the last step's eval comes from finish()
        return [skeleton.Hook(lambda i: self.writer.write(i.done, self.evaluate(), prefix="eval"),
                              every=self.cfg.train.eval_every, last=False)]

    def hooks(self):
        return super().hooks() + [skeleton.Hook(self._debug_kill)]

    def _debug_kill(self, info):
        if self.cfg.train.debug_kill_at_step == info.done:
            self.ckpt.wait()  # the SIGKILL simulates losing the host right after a save
            os.kill(os.getpid(), 9)

    def finish(self, last):
        if last is not None and self.eval_step is not None:  # before the save, as the hooks
            self.writer.write(last, self.evaluate(), prefix="eval")

    def plot_title(self) -> str:
        return f"rossjax train {self.cfg.recipe}"

    def complete_result(self) -> dict:
        last = (read_metrics(self.workdir) or [{}])[-1]
        return {**last, "step": self.complete, "stopped": False, "complete": True}

    def result(self) -> dict:
        return {**self.stop_info(), **self.metrics}


def run(cfg, workdir: str) -> dict:
    """`rossjax train`: returns {"step", "stopped", "stopped_by", "total", **the last step's
    metrics}; for a workdir already trained to its last step "complete": True (and its last
    logged metrics)."""
    return Trainer.execute(cfg, workdir)
