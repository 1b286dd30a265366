"""GRPO over two processes x 4 simulated CPU devices (jax.distributed over gloo) == one process x 8
devices: the same samples, rewards and history, and the same trained params (full fine-tuning, and
LoRA with a KL reference, async sampling and the truncated-IS correction)."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from xla_flags import xla_flags

WORKER = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from rossjax.train.rl import grpo

    port, pid, nproc, workdir, variant = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                                          sys.argv[5])
    c = grpo.default_config()
    c.tokenizer = "ascii"
    c.model.preset = "tiny_qwen2"
    c.model.dtype = "float32"
    c.data.tasks = "gen:contains"
    c.grpo.steps, c.grpo.contexts, c.grpo.group_size, c.grpo.max_new_tokens = 2, 4, 4, 8
    c.grpo.temperature = 1.0
    c.grpo.loss_chunk = 32
    c.reward.functions = ("contains",)
    c.reward.workers = 0
    c.optim.peak_lr = c.optim.end_lr = 3e-3
    # Adam divides by sqrt(v) + eps: with the default 1e-8 a gradient entry that is pure rounding
    # noise (a group with equal rewards contributes none) becomes a full lr-sized step whose sign
    # the reduction order decides. A larger eps keeps noise-level entries still.
    c.optim.eps = 1e-3
    c.checkpoint.async_save = False
    c.checkpoint.save_every = 1000
    if variant == "lora_kl_async":
        c.lora.enabled, c.lora.rank, c.lora.alpha = True, 4, 8.0
        c.grpo.beta, c.grpo.async_sampling, c.grpo.is_mode = 0.05, True, "token"
    if nproc > 1:
        c.distributed.enabled = True
        c.distributed.coordinator = f"127.0.0.1:{port}"
        c.distributed.num_processes, c.distributed.process_id = nproc, pid
        c.distributed.cpu_collectives = "gloo"
    out = grpo.run(c, workdir)
    assert jax.process_count() == nproc and jax.device_count() == 8
    flat = {jax.tree_util.keystr(p): np.asarray(jax.experimental.multihost_utils.process_allgather(
                x, tiled=True)) for p, x in jax.tree_util.tree_flatten_with_path(out["state"]["params"])[0]}
    if pid == 0:
        np.savez(workdir + "/params.npz", **flat)
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(pid, nproc, port, workdir, devices, variant):
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices),
               JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, "-c", WORKER, str(port), str(pid), str(nproc), workdir,
                             variant],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _history(workdir):
    rows = [json.loads(line) for line in open(os.path.join(workdir, "history.jsonl"))]
    return [(r["messages"][-1]["content"], r["reward"], r["token_ids"]) for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["full", "lora_kl_async"])
def test_grpo_two_hosts_equal_one_host(tmp_path, variant):
    multi, single = str(tmp_path / "multi"), str(tmp_path / "single")
    port = _free_port()
    procs = [_spawn(pid, 2, port, multi, 4, variant) for pid in range(2)]
    procs.append(_spawn(0, 1, 0, single, 8, variant))
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-3000:]
    assert _history(multi) == _history(single) and len(_history(single)) == 2 * 16
    # process 0 alone wrote the run's files
    assert os.path.exists(os.path.join(multi, "metrics.jsonl"))
    a, b = np.load(os.path.join(multi, "params.npz")), np.load(os.path.join(single, "params.npz"))
    assert sorted(a.files) == sorted(b.files)
    # Gradients are all-reduced over gloo, in another order than within one process.
    for k in a.files:
        np.testing.assert_allclose(a[k], b[k], atol=1e-6, err_msg=k)
