"""GRPO loop: learning on a tiny model, equal rewards change nothing, history -> rossjax curate,
LoRA + KL + async sampling + IcePop + resume, CLI with the shipped config."""

import json
import os

import jax
import numpy as np
import pytest

from rossjax.models import shardings as model_shardings
from rossjax.monitor import read_metrics
from rossjax.train.rl import grpo
from rossjax.train.rl.history import read_history


def tiny_config(steps=2, contexts=4, group=4, new=8):
    c = grpo.default_config()
    c.tokenizer = "ascii"
    c.model.preset = "tiny_qwen2"
    c.model.dtype = "float32"
    c.data.tasks = "gen:contains"
    c.grpo.steps, c.grpo.contexts, c.grpo.group_size, c.grpo.max_new_tokens = steps, contexts, group, new
    c.grpo.loss_chunk = 32
    c.reward.functions = ("contains",)
    c.reward.workers = 0
    c.optim.peak_lr = c.optim.end_lr = 3e-3
    c.mesh.num_devices = 1
    c.checkpoint.async_save = False
    c.checkpoint.save_every = 1000
    return c


@pytest.mark.slow
def test_reward_rises_on_tiny_model(tmp_path):
    c = tiny_config(steps=30, contexts=8, group=8, new=8)
    grpo.run(c, str(tmp_path))
    r = [m["reward_mean"] for m in read_metrics(str(tmp_path))]
    assert len(r) == 30
    first, last = np.mean(r[:6]), np.mean(r[-6:])
    assert last > first + 0.2, (first, last, r)


def test_equal_rewards_leave_params_unchanged(tmp_path):
    c = tiny_config(steps=3)
    c.reward.weights = (0.0,)  # every reward 0: all advantages 0
    c.grpo.num_iterations = 2
    c.grpo.minibatch = 8
    c.optim.weight_decay = 0.0
    out = grpo.run(c, str(tmp_path))
    # the run started from the seed's init: rebuild it and compare
    p0 = model_shardings.init_params_sharded(out["run"].model_cfg, jax.random.PRNGKey(c.train.seed),
                                      out["run"].mesh)
    p1 = out["state"]["params"]
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    m = read_metrics(str(tmp_path))[-1]
    assert m["grad_norm"] == 0.0 and m["zero_var_group_frac"] == 1.0 and m["reward_mean"] == 0.0


@pytest.mark.slow
def test_micro_batches_give_the_same_updates(tmp_path):
    """Gradient accumulation is exact: 4 micro-batches per minibatch update the policy as one
    whole minibatch does (same loss, gradient norm, KL, clip fractions and params)."""
    runs = {}
    for n in (1, 4):
        c = tiny_config(steps=1, contexts=4, group=4, new=24)  # long enough for some rewards
        c.grpo.micro_batches, c.grpo.num_iterations, c.grpo.beta = n, 2, 0.1
        c.optim.eps = 1e-3  # Adam's g / sqrt(v) would turn rounding noise of ~0 grads into +-lr
        c.grpo.agg, c.grpo.eps_high = "seq_mean_token_mean", 0.28
        c.optim.peak_lr = c.optim.end_lr = 3e-2  # visible changes: the second update clips
        out = grpo.run(c, str(tmp_path / str(n)))
        runs[n] = (read_metrics(str(tmp_path / str(n)))[-1],
                   [np.asarray(x) for x in jax.tree.leaves(out["state"]["params"])])
    (m1, p1), (m4, p4) = runs[1], runs[4]
    assert m1["grad_norm"] > 0 and m1["kl"] > 0 and m1["reward_std"] > 0
    for k in ("loss", "pg_loss", "grad_norm", "kl", "clip_frac_low", "clip_frac_high", "ratio_mean"):
        np.testing.assert_allclose(m4[k], m1[k], rtol=1e-4, atol=1e-7, err_msg=k)
    for a, b in zip(p1, p4):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_history_loads_in_curate(tmp_path):
    from rossjax import cli

    work = str(tmp_path / "run")
    rc = cli.main(["grpo", "--config=configs/grpo_verifier.py:runlocal", f"--workdir={work}",
                   "--config.grpo.steps=2", "--config.grpo.max_new_tokens=12",
                   "--config.grpo.contexts=4", "--config.data.tasks=gen:contains", "--config.reward.functions=('contains',)",
                   "--config.reward.workers=1"])
    assert rc == 0
    rows = read_history(os.path.join(work, "history.jsonl"))
    assert len(rows) == 2 * 4 * 4
    r0 = rows[0]
    assert {"messages", "token_ids", "logprobs", "reward", "verifier", "source"} <= set(r0)
    assert r0["source"]["step"] == 0 and rows[-1]["source"]["step"] == 1
    n_new = len(r0["token_ids"]) - r0["source"]["prompt_tokens"]
    assert len(r0["logprobs"]) == n_new or r0["source"]["finish_reason"] == "length"
    out = str(tmp_path / "curated")
    rc = cli.main(["curate", "--config=configs/curate.py", f"--config.input={work}/history.jsonl",
                   f"--config.tokenizer={work}/tokenizer", f"--config.output={out}",
                   "--config.rows=verifier_positive", "--config.mask_mode=eligible",
                   "--config.progress=False"])  # unreviewed history: the positive_sft rows
    assert rc == 0
    rep = json.load(open(os.path.join(out, "report.json")))
    b = rep["buckets"]
    assert rep["input_rows"] == len(rows) == b["kept"] + b["withheld"] + b["invalid"]
    assert b["invalid"] == 0 and rep["reasons"]["withheld"].keys() <= {"verifier_failed"}
    passed = sum(bool(r["verifier"]["passed"]) for r in rows)
    assert b["kept"] == passed


def test_lora_kl_async_icepop_and_resume(tmp_path):
    c = tiny_config(steps=2)
    c.lora.enabled, c.lora.rank, c.lora.alpha = True, 4, 8.0
    c.grpo.beta = 0.05
    c.grpo.async_sampling = True
    c.grpo.is_mode, c.grpo.is_how, c.grpo.is_low, c.grpo.is_high = "token", "mask", 0.5, 2.0
    c.grpo.agg = "seq_mean_token_sum_norm"
    c.checkpoint.save_every = 1
    c.grpo.steps, c.grpo.stop_after = 4, 2  # stops after step 2 as if preempted
    out = grpo.run(c, str(tmp_path))
    assert set(out["state"]["params"]) == {"layers"}  # only adapters are trained
    m = read_metrics(str(tmp_path))
    for k in ("zero_var_group_frac", "mixed_outcome_rate", "clip_frac_low", "clip_frac_high", "kl",
              "entropy", "completion_len_mean", "truncated_frac", "is_outside_frac",
              "accelerator_idle_frac", "reward_contains_mean"):
        assert k in m[-1], k
    assert m[0]["kl"] == 0.0 or abs(m[0]["kl"]) < 1e-6  # adapters start at zero: policy == reference
    assert len(m) == 2
    c.grpo.stop_after = -1
    grpo.run(c, str(tmp_path))  # resumes from step 2
    rows = read_history(os.path.join(tmp_path, "history.jsonl"))
    assert [r["source"]["step"] for r in rows[::16]] == [0, 1, 2, 3]
    assert [x["step"] for x in read_metrics(str(tmp_path))] == [1, 2, 3, 4]

    # export merges the trained adapters into the (seed-rebuilt) random base
    from rossjax import models
    from rossjax.models import lora
    from rossjax.train.export.model import export, restore_params

    assert export(str(tmp_path), str(tmp_path / "hf"), "hf") == 4
    mc, got = models.load_hf(str(tmp_path / "hf"))
    base = models.init_params(mc, jax.random.PRNGKey(c.train.seed))
    _, adapters = restore_params(str(tmp_path / "checkpoints"), 4)
    want = lora.merge(base, adapters, c.lora.alpha)
    assert not np.allclose(want["layers"]["attn"]["q"]["kernel"], base["layers"]["attn"]["q"]["kernel"])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6),
                 got, want)
    os.remove(tmp_path / "lora.json")  # without its manifest the adapters are not a model
    with pytest.raises(ValueError, match="adapters only"):
        export(str(tmp_path), str(tmp_path / "hf2"), "hf")


@pytest.mark.parametrize("over, says", [
    ("--config.grpo.group_size=1", "config.grpo.group_size"),
    ("--config.reward.functions=('nope',)", "config.reward.functions"),
    ("--config.reward.weights=(1.0,2.0)", "config.reward.functions"),
    ("--config.grpo.agg=sum", "config.grpo.agg"),
    ("--config.grpo.is_mode=tok", "config.grpo.is_mode"),
    ("--config.grpo.micro_batches=0", "config.grpo.micro_batches"),
    ("--config.reward.functions=('probe',)", "config.reward.probe.path is empty"),
])
def test_bad_config_sentences(over, says):
    from rossjax import cli

    c = cli.parse_config(["--config=configs/grpo_verifier.py:runlocal", over])[0]
    with pytest.raises(ValueError, match=says) as e:
        grpo.check_config(c)
    assert str(e.value).count(". ") == 0 and str(e.value).endswith(".")  # one sentence


def test_missing_probe_manifest_is_named(tmp_path):
    from rossjax import cli

    c = cli.parse_config(["--config=configs/propel_azr.py",
                          f"--config.reward.probe.path={tmp_path}/probe"])[0]
    with pytest.raises(ValueError, match=f"{tmp_path}/probe.json"):
        grpo.check_config(c)


def test_bench_code_reward_runs_the_sandboxed_verifier():
    """The benchmark's chosen-cost reward really verifies its pool programs: the right ones pass,
    the wrong answer and the crash fail."""
    from rossjax.bench import grpo as bench

    ids, seen = [], set()
    for i in range(200):  # one record id per pool program
        k = bench.zlib.crc32(f"r{i}".encode()) % len(bench._PROGRAMS)
        if k not in seen:
            seen.add(k)
            ids.append((k, f"r{i}"))
    out = bench.sandboxed_code_batch(("verifier",), [{"id": i} for _, i in sorted(ids)])
    assert [r["verifier"][0] for r in out] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_resume_is_exact_without_async_sampling(tmp_path):
    """Stopped after step 2 and resumed, a synchronous run ends where an uninterrupted one does:
    same history and same params (sampling seeds, task order and minibatch order follow the step)."""
    def config():
        c = tiny_config(steps=3, contexts=2, group=4, new=8)
        c.grpo.minibatch, c.grpo.num_iterations = 4, 2  # shuffled minibatches
        c.checkpoint.save_every = 1
        return c

    full = grpo.run(config(), str(tmp_path / "a"))
    c = config()
    c.grpo.stop_after = 2
    grpo.run(c, str(tmp_path / "b"))
    resumed = grpo.run(config(), str(tmp_path / "b"))
    ha, hb = (read_history(str(tmp_path / d / "history.jsonl")) for d in "ab")
    assert [r["token_ids"] for r in ha] == [r["token_ids"] for r in hb] and len(ha) == 3 * 8
    for a, b in zip(jax.tree.leaves(full["state"]["params"]), jax.tree.leaves(resumed["state"]["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
