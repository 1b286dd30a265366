"""The `rossjax train` loop: config -> mesh, model, data, optimizer, checkpoints, metrics.

Resume is automatic: if `WORKDIR/checkpoints` holds a step, params, optimizer state, step, RNG
and the data iterator state are restored from it and the run continues bit-for-bit.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import numpy as np

from rossjax import models, sharding
from rossjax.train import checkpoint as ckpt_lib
from rossjax.train import data as data_lib
from rossjax.train import metrics as metrics_lib
from rossjax.train import optim, sft


class Diverged(ValueError):
    """Too many non-finite steps in a row (printed as one sentence by the CLI)."""


def distributed_config():
    """The `config.distributed` section (train and grpo configs share it)."""
    import ml_collections

    return ml_collections.ConfigDict(dict(
        enabled=False,       # call jax.distributed.initialize (TPU pods detect the rest)
        coordinator="",      # host:port; "" = auto-detect (TPU, SLURM)
        num_processes=-1,
        process_id=-1,
        cpu_collectives="",  # "gloo" for multi-process CPU runs
    ))


def setup_distributed(dcfg):
    if not dcfg.enabled:
        return
    if dcfg.cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", dcfg.cpu_collectives)
    kw = {}
    if dcfg.coordinator:
        kw["coordinator_address"] = dcfg.coordinator
    if dcfg.num_processes > 0:
        kw["num_processes"] = int(dcfg.num_processes)
    if dcfg.process_id >= 0:
        kw["process_id"] = int(dcfg.process_id)
    jax.distributed.initialize(**kw)


def _compute_overrides(cfg, model_cfg):
    return model_cfg.replace(dtype=cfg.model.dtype, remat_policy=cfg.model.remat_policy)


def abstract_model(cfg):
    """ModelConfig and where its params come from: ("hf" | "orbax" | "scratch", path)."""
    m = cfg.model
    if m.path:
        if not os.path.exists(m.path):
            raise FileNotFoundError(f"config.model.path {m.path} does not exist.")
        if os.path.exists(os.path.join(m.path, "config.json")):
            from rossjax.models.hf import read_hf_config

            mc = read_hf_config(m.path).replace(param_dtype=m.param_dtype)
            return _compute_overrides(cfg, mc), "hf"
        if os.path.exists(os.path.join(m.path, "model_config.json")):
            mc = ckpt_lib.read_model_config(m.path).replace(param_dtype=m.param_dtype)
            return _compute_overrides(cfg, mc), "orbax"
        raise ValueError(f"config.model.path {m.path} holds neither config.json (a Hugging Face "
                         f"folder) nor model_config.json (a `rossjax export --format orbax` folder).")
    if not m.preset:
        raise ValueError("config.model.path and config.model.preset are both empty; give a model "
                         "folder or a preset name.")
    over = {"param_dtype": m.param_dtype}
    if m.vocab_size > 0:
        over["vocab_size"] = int(m.vocab_size)
    return _compute_overrides(cfg, models.get_preset(m.preset, **over)), "scratch"


def load_params(cfg, model_cfg, source, mesh, rules, p_shardings):
    if source == "hf":
        _, params = models.load_hf(cfg.model.path, dtype=cfg.model.param_dtype, mesh=mesh, rules=rules)
        return params
    if source == "orbax":
        abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                jax.eval_shape(lambda: models.init_params(model_cfg, jax.random.key(0))),
                                p_shardings)
        return ckpt_lib.restore_params(cfg.model.path, abstract)
    return sharding.init_params_sharded(model_cfg, jax.random.PRNGKey(cfg.train.seed), mesh, rules)


def check_recipe(cfg, paths) -> list[str]:
    """Refuse a training dir whose report.json says it was curated for another recipe.

    Compares `mask_mode` and, when the report records it, the row filter `rows` (accepted |
    verifier_positive) with `sft.RECIPES[cfg.recipe]`. Returns notes for what could not be
    checked (a report that does not record `rows`), which the loop prints.
    """
    if cfg.recipe not in sft.RECIPES:
        raise ValueError(f"config.recipe {cfg.recipe!r} is not one of {', '.join(sft.RECIPES)}.")
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
                raise ValueError(f"{report}: field {field!r} is {got!r} but recipe {cfg.recipe!r} "
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


def run(cfg, workdir: str) -> dict:
    setup_distributed(cfg.distributed)
    nproc = jax.process_count()
    g_rows, micro = int(cfg.train.global_batch), int(cfg.train.micro_batches)
    if g_rows % nproc or g_rows % micro:
        raise ValueError(f"config.train.global_batch {g_rows} must be divisible by the process count "
                         f"({nproc}) and by config.train.micro_batches ({micro}).")
    rows = g_rows // nproc
    rules = sharding.normalize_rules(cfg.sharding_rules or None)
    mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    model_cfg, source = abstract_model(cfg)
    train_paths = data_lib.split_paths(cfg.data.train, "data.train")
    eval_paths = data_lib.split_paths(cfg.data.eval, "data.eval") if cfg.data.eval else []
    for note in check_recipe(cfg, train_paths):
        if jax.process_index() == 0:
            print(f"rossjax train: note: {note}", file=sys.stderr)

    # One pass over this host's shard: how many steps the epochs make, and is anything supervised.
    open_train = lambda: data_lib.open_loader(train_paths, cfg.data, rows_per_host=rows,
                                              num_epochs=cfg.train.epochs, shuffle=cfg.data.shuffle,
                                              seed=cfg.train.seed)
    n_batches, n_sup, n_tok = data_lib.scan(open_train())
    n_batches = int(data_lib.agree([n_batches], "min")[0])
    n_sup, n_tok = (int(x) for x in data_lib.agree([n_sup, n_tok], "sum"))
    if n_sup == 0:
        raise ValueError(f"config.data.train {','.join(train_paths)} has no supervised tokens (every "
                         f"loss_mask is 0 in {n_batches} batches), so there is nothing to train on.")
    total = n_batches if cfg.train.num_steps <= 0 else min(n_batches, int(cfg.train.num_steps))
    if total == 0:
        raise ValueError(f"config.data.train {','.join(train_paths)} gives no batch of {rows} rows.")

    optimizer, schedule = optim.make_optimizer(cfg.optim, total)
    p_shard = sharding.param_shardings(model_cfg, mesh, rules)
    abstract_params = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(lambda: models.init_params(model_cfg, jax.random.key(0))), p_shard)
    shardings = sft.state_shardings(p_shard, optimizer, abstract_params, mesh)
    batch_shard = sharding.batch_sharding(mesh, 2, rules, shape=(g_rows, cfg.data.seq_len))

    ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                 save_every=cfg.checkpoint.save_every, keep=cfg.checkpoint.keep,
                                 async_save=cfg.checkpoint.async_save)
    it = iter(open_train())
    start = ckpt.latest_step()
    if start is not None:
        state, data_state = ckpt.restore(start, sft.abstract_state(shardings, optimizer, abstract_params))
        if data_state is not None:
            it.set_state(data_state)
    else:
        start = 0
        params = load_params(cfg, model_cfg, source, mesh, rules, p_shard)
        state = sft.init_state(params, optimizer, shardings, seed=cfg.train.seed)
    if jax.process_index() == 0:
        os.makedirs(workdir, exist_ok=True)
        ckpt_lib.write_model_config(workdir, model_cfg)

    step_fn = sft.make_train_step(model_cfg, optimizer, schedule, mesh=mesh, shardings=shardings,
                                  batch_sharding=batch_shard, micro_batches=micro,
                                  chunk_size=cfg.train.loss_chunk, rules=rules)
    eval_step = (sft.make_eval_step(model_cfg, mesh=mesh, params_shardings=p_shard,
                                    batch_sharding=batch_shard, chunk_size=cfg.train.loss_chunk)
                 if eval_paths else None)
    writer = metrics_lib.MetricsWriter(workdir)
    # Simulated CPU devices share one machine's cores: the yardstick is one matmul, not n.
    peak = metrics_lib.measure_matmul_flops(512) * (
        1 if jax.default_backend() == "cpu" else jax.device_count())
    thr = metrics_lib.Throughput(metrics_lib.train_flops_per_token(model_cfg, cfg.data.seq_len), peak)
    if jax.process_index() == 0:
        print(f"rossjax train: {model_cfg.model_type} {model_cfg.num_params() / 1e6:.1f}M params "
              f"({source}), {total} steps of {g_rows} x {cfg.data.seq_len} tokens, {n_sup} "
              f"supervised of {n_tok} tokens per run, mesh {dict(mesh.shape)}, from step {start}.",
              file=sys.stderr)
    bar = metrics_lib.Progress(total, initial=start, desc=f"train {cfg.recipe}")

    last, stopped, m = None, False, {}
    with ckpt_lib.PreemptionGuard() as guard:
        for step in range(start, total):
            raw = next(it)
            batch = data_lib.to_global(data_lib.local_batch(raw, rows, cfg.data.seq_len), batch_shard, g_rows)
            state, metrics = step_fn(state, batch)
            m = {k: float(v) for k, v in jax.device_get(metrics).items()}
            done = step + 1
            thr.add(m["tokens"], m["supervised_tokens"])
            if m["bad_steps"] >= cfg.train.max_bad_steps:
                raise Diverged(f"stopped at step {done}: {int(m['bad_steps'])} steps in a row "
                                         f"had a non-finite loss or gradient.")
            if done % cfg.train.log_every == 0 or done == total:
                m.update(thr.rates())
                writer.write(done, m)
            bar.update(1, loss=m["loss"], gnorm=m["grad_norm"], lr=m["lr"])
            ckpt.save(done, state, it.get_state() if hasattr(it, "get_state") else None)
            if cfg.train.debug_kill_at_step == done:
                ckpt.wait()  # the SIGKILL below simulates losing the host right after a save
                os.kill(os.getpid(), 9)
            if eval_step is not None and cfg.train.eval_every > 0 and done % cfg.train.eval_every == 0 \
                    and done != total:
                writer.write(done, evaluate(eval_step, state["params"], cfg, eval_paths, rows,
                                            batch_shard, g_rows), prefix="eval")
            if ckpt_lib.any_process(guard.requested):
                ckpt.save(done, state, it.get_state() if hasattr(it, "get_state") else None, force=True)
                bar.write(f"rossjax train: SIGTERM at step {done}; checkpoint saved, exiting.")
                stopped = True
                break
            last = done
    if not stopped and last is not None:
        ckpt.save(last, state, it.get_state() if hasattr(it, "get_state") else None, force=True)
        if eval_step is not None:
            m_eval = evaluate(eval_step, state["params"], cfg, eval_paths, rows, batch_shard, g_rows)
            writer.write(last, m_eval, prefix="eval")
    ckpt.close()
    bar.close()
    writer.close()
    return {"step": last if last is not None else start, "stopped": stopped, **m}


def main(argv) -> int:
    from rossjax.cli import command_config

    cfg, workdir, _ = command_config(argv, "train", "configs/ross_sft.py (or another SFT config)")
    t0 = time.time()
    out = run(cfg, workdir)
    if jax.process_index() == 0:
        print(f"rossjax train: step {out['step']}, loss {out.get('loss', float('nan')):.4f}, "
              f"{time.time() - t0:.0f} s; checkpoints in {os.path.join(workdir, 'checkpoints')}.")
    return 0
