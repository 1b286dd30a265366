"""Two processes x 4 simulated CPU devices (jax.distributed over gloo) == one process x 8 devices.

Each process reads only its own shard of the rows (row i goes to process i % 2), contributes it to
the global batch, and the loss and the updated params must equal the single-process ones.
"""

import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from test_sft_loop import CONFIG, ROOT, write_curated
from xla_flags import xla_flags

ROWS, SEQ, STEPS = 8, 32, 2

WORKER = textwrap.dedent("""
    import json, sys
    import jax, ml_collections, numpy as np, optax
    from rossjax import models, sharding
    from rossjax.models import shardings as model_shardings
    from rossjax.train import data as data_lib, state as state_lib
    from rossjax.train.sft import step as sft

    port, pid, nproc, data_file, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    if nproc > 1:
        sharding.initialize_distributed(ml_collections.ConfigDict(dict(
            enabled=True, coordinator=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid,
            cpu_collectives="gloo")))
    assert jax.process_count() == nproc and jax.device_count() == 8, (jax.process_count(), jax.device_count())
    rows_all = dict(np.load(data_file))
    mine = {k: v[pid::nproc] for k, v in rows_all.items()}        # this host's shard only
    cfg = models.get_preset("tiny_qwen2")
    mesh = sharding.make_mesh(data=-1, fsdp=1, tensor=1)
    p_shard = model_shardings.param_shardings(cfg, mesh)
    params = model_shardings.init_params_sharded(cfg, jax.random.PRNGKey(0), mesh)
    opt = optax.sgd(0.5)  # linear in the gradient: order-of-summation noise stays tiny
    sh = state_lib.state_shardings(p_shard, opt, jax.eval_shape(lambda: params), mesh)
    state = state_lib.init_state(params, opt, sh)
    g_rows, seq = rows_all["input_ids"].shape[0] // 2, rows_all["input_ids"].shape[1]
    bs = sharding.batch_sharding(mesh, 2, shape=(g_rows, seq))
    step = sft.make_train_step(cfg, opt, lambda s: 1e-2, mesh=mesh, shardings=sh, batch_sharding=bs,
                               micro_batches=2, chunk_size=16)
    losses = []
    per_host = g_rows // nproc
    for i in range(2):
        local = {k: v[i * per_host:(i + 1) * per_host] for k, v in mine.items()}
        batch = data_lib.to_global(data_lib.local_batch(local, per_host, seq), bs, g_rows)
        state, m = step(state, batch)
        losses.append([float(m["loss"]), float(m["supervised_tokens"])])
    if pid == 0:
        flat = {jax.tree_util.keystr(p): np.asarray(x) for p, x in
                jax.tree_util.tree_flatten_with_path(state["params"])[0]}
        np.savez(out + ".npz", **flat)
        json.dump(losses, open(out + ".json", "w"))
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(path):
    rng = np.random.default_rng(0)
    n = ROWS * STEPS  # rows for 2 global steps of 8
    seg = np.ones((n, SEQ), np.int32)
    seg[::3, SEQ // 2:] = 2  # some rows pack two documents
    pos = np.where(seg == 2, np.arange(SEQ) - SEQ // 2, np.arange(SEQ)).astype(np.int32)
    lm = (rng.random((n, SEQ)) < np.linspace(0.05, 0.95, n)[:, None]).astype(np.int32)
    np.savez(path, input_ids=rng.integers(0, 256, (n, SEQ)).astype(np.int32), loss_mask=lm,
             segment_ids=seg, positions=pos)


def _spawn(pid, nproc, port, data, out, devices):
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices),
               JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, "-c", WORKER, str(port), str(pid), str(nproc), data, out],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_hosts_equal_one_host(tmp_path):
    data = str(tmp_path / "rows.npz")
    _rows(data)
    port = _free_port()
    procs = [_spawn(pid, 2, port, data, str(tmp_path / "multi"), 4) for pid in range(2)]
    single = _spawn(0, 1, 0, data, str(tmp_path / "single"), 8)
    for p in procs + [single]:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    multi_losses = json.load(open(tmp_path / "multi.json"))
    single_losses = json.load(open(tmp_path / "single.json"))
    # Host shards interleave rows, so the global batch is the same set of rows in another order.
    for (lm, cm), (ls, cs) in zip(multi_losses, single_losses):
        assert cm == cs > 0
        np.testing.assert_allclose(lm, ls, rtol=1e-6)
    a, b = np.load(tmp_path / "multi.npz"), np.load(tmp_path / "single.npz")
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        np.testing.assert_allclose(a[k], b[k], atol=1e-6, err_msg=k)


# ----------------------------------------------------------------------------- the whole command

def _spawn_train(data, workdir, nproc, pid, port, devices):
    """`rossjax train` (configs/ross_sft.py:runlocal) as one process of `nproc`."""
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices),
               JAX_PLATFORMS="cpu")
    dist = ([] if nproc == 1 else
            ["--config.distributed.enabled=True", f"--config.distributed.coordinator=127.0.0.1:{port}",
             f"--config.distributed.num_processes={nproc}", f"--config.distributed.process_id={pid}",
             "--config.distributed.cpu_collectives=gloo"])
    # No shuffle: each host shuffles only its own shard, so with shuffling a 2-process run reads
    # the same rows per epoch in another order. Unshuffled, host h reads rows h, h+2, ... and a
    # step's global batch is the same 8 rollouts as one process's. Adam's eps is raised so that a
    # gradient entry that is pure reduction-order noise stays a noise-sized step (see
    # test_grpo_multihost.py).
    cmd = [sys.executable, "-m", "rossjax.cli", "train", f"--config={CONFIG}:runlocal",
           f"--config.data.train={data}", f"--workdir={workdir}", "--config.data.shuffle=False",
           "--config.train.num_steps=3", "--config.train.epochs=1", "--config.train.eval_every=0",
           "--config.checkpoint.save_every=3", "--config.optim.eps=1e-3",
           # seq_len 128, not runlocal's 1,280: the rows are 20-60 tokens, so a host's share of a
           # step packs into 1-2 rows instead of one mostly-padding row
           "--config.data.seq_len=128", *dist]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_train_command_two_hosts_equal_one_host(tmp_path):
    """The whole `rossjax train` (plan_data, each host's loader over its shard, packing, the
    loop, metrics and checkpoint) as 2 processes x 4 devices == 1 process x 8 devices: the
    same per-step losses and token counts, the same trained params."""
    from rossjax.monitor import read_metrics
    from rossjax.train.export import model as export_lib

    data = write_curated(tmp_path / "data", n=40)
    multi, single = tmp_path / "multi", tmp_path / "single"
    port = _free_port()
    procs = [_spawn_train(data, multi, 2, pid, port, 4) for pid in range(2)]
    procs.append(_spawn_train(data, single, 1, 0, 0, 8))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-3000:]
        outs.append(out)
    # one run over 8 devices (a lone 4-device process would print 'data': 4), led by process 0
    mesh = re.search(r"mesh (\{[^}]*\})", outs[2]).group(1)
    assert "'data': 8" in mesh and f"mesh {mesh}" in outs[0], (outs[0][-2000:], mesh)
    assert "rossjax train:" not in outs[1]
    rm, rs = read_metrics(str(multi)), read_metrics(str(single))
    assert [r["step"] for r in rm] == [r["step"] for r in rs] == [1, 2, 3]
    for a, b in zip(rm, rs):
        assert a["sequences"] == b["sequences"] == 8  # global_batch rollouts a step, both ways
        assert a["supervised_tokens"] == b["supervised_tokens"] > 0
        assert a["tokens"] == b["tokens"]
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-6)
    step_m, pm = export_lib.restore_params(str(multi / "checkpoints"))
    step_s, ps = export_lib.restore_params(str(single / "checkpoints"))
    assert step_m == step_s == 3
    flat_m = jax.tree_util.tree_flatten_with_path(pm)[0]
    flat_s = jax.tree.leaves(ps)
    assert len(flat_m) == len(flat_s)
    for (path, a), b in zip(flat_m, flat_s):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))
    # and every step moved them (else equal params would prove little)
    assert all(r["grad_norm"] > 0 and r["lr"] > 0 for r in rs)
