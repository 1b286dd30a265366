"""Two processes x 4 simulated CPU devices (jax.distributed over gloo) == one process x 8 devices.

Each process reads only its own shard of the rows (row i goes to process i % 2), contributes it to
the global batch, and the loss and the updated params must equal the single-process ones.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROWS, SEQ, STEPS = 8, 32, 2

WORKER = textwrap.dedent("""
    import json, sys
    import jax, ml_collections, numpy as np, optax
    from rossjax import models, sharding
    from rossjax.models import shardings as model_shardings
    from rossjax.train import data as data_lib, sft, state as state_lib

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
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
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
