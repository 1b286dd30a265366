"""`rossjax train` end to end: runlocal run + export, bit-exact resume after SIGKILL, bad input."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from xla_flags import xla_flags

from rossjax import cli, models
from rossjax.models import loading
from rossjax.monitor import read_metrics
from rossjax.train import checkpoint as ckpt_lib
from rossjax.train.export import model as export_lib
from rossjax.train.sft import trainer as loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "ross_sft.py")


def write_curated(out, n=120, vocab=256, seed=0, supervised=True):
    """A curated dir as `rossjax curate` writes it: ArrayRecord shards of compiled examples."""
    from array_record.python.array_record_module import ArrayRecordWriter

    from rossjax.curate.compiled import encode_example

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = ArrayRecordWriter(os.path.join(out, "compiled-00000.array_record"), "group_size:1")
    for i in range(n):
        length = int(rng.integers(20, 60))
        elig = np.zeros(length, np.uint8)
        start = int(rng.integers(5, length - 5))
        elig[start:] = 1  # prompt context, then an assistant turn
        lm = elig.copy() if supervised else np.zeros(length, np.uint8)
        lm[start + 1:start + 3] = 0  # a reviewer exclusion: eligible but not supervised
        w.write(encode_example({"id": f"ex{i}", "input_ids": rng.integers(0, vocab, length),
                                "loss_mask": lm, "eligible_mask": elig}))
    w.close()
    with open(os.path.join(out, "report.json"), "w") as f:  # train refuses a folder without one
        json.dump({"shards": [{"path": "compiled-00000.array_record", "examples": n}]}, f)
    return str(out)


def _cli(argv):
    return cli.main(argv)


def _argv(data, workdir, *extra):
    return ["train", f"--config={CONFIG}:runlocal", f"--config.data.train={data}",
            f"--workdir={workdir}", *extra]


@pytest.mark.slow
def test_runlocal_trains_evaluates_and_exports(tmp_path):
    data = write_curated(tmp_path / "data", n=100)
    work = tmp_path / "run"
    # seq_len 128 (see _spawn): runlocal's 1,280 fits the shipped sample, not these short rows
    assert _cli(_argv(data, work, f"--config.data.eval={data}", "--config.train.num_steps=4",
                      "--config.data.seq_len=128")) == 0
    rows = read_metrics(str(work))
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(np.isfinite(r["loss"]) and r["supervised_tokens"] > 0 for r in rows)
    assert {"grad_norm", "lr", "tokens_per_s", "supervised_tokens_per_s", "mfu"} <= set(rows[-1])
    assert all(0 < r["target_exclusion_rate"] < 0.5 for r in rows)  # eligible_mask survives packing
    ev = read_metrics(str(work), "eval")
    assert len(ev) == 1 and np.isfinite(ev[0]["loss"])
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(work / "tb"))

    # export --format hf: transformers loads it and gives rossjax's logits.
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    hf_dir = tmp_path / "hf"
    # the shards were written without a report.json, so no tokenizer is known: weights alone
    assert _cli(["export", f"--checkpoint={work}", "--format=hf", "--tokenizer=none",
                 str(hf_dir)]) == 0
    step, params = export_lib.restore_params(str(work / "checkpoints"))
    cfg = ckpt_lib.read_model_config(str(work))
    assert step == 4
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 16)).astype(np.int32)
    ours, _ = models.forward(cfg, params, tokens)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(tokens).long()).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)

    # export --format orbax, then use it as config.model.path: the same params come back.
    ob_dir = tmp_path / "orbax"
    assert _cli(["export", f"--checkpoint={work}", "--format=orbax", str(ob_dir)]) == 0
    from rossjax import sharding
    from rossjax.cli import parse_config

    c, _, _ = parse_config([f"--config={CONFIG}:runlocal", f"--config.model.path={ob_dir}"])
    mcfg, source = loading.abstract_model(c.model)
    assert source == "orbax" and mcfg.vocab_size == cfg.vocab_size
    part = sharding.Partitioner(sharding.make_mesh(data=-1, fsdp=1))
    back = loading.load_params(c.model, mcfg, source, part)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), b)


def _spawn(data, workdir, *extra):
    env = dict(os.environ, XLA_FLAGS=xla_flags(2), JAX_PLATFORMS="cpu")
    # seq_len 128, not runlocal's 1,280: write_curated's rows are 20-60 tokens, so a step's 8
    # rollouts (~260-360 tokens) pack into 3-4 rows instead of one mostly-padding row; a 20-step
    # run costs ~7 CPU s instead of ~26
    cmd = [sys.executable, "-m", "rossjax.cli", *_argv(data, workdir, "--config.data.seq_len=128",
                                                      "--config.train.num_steps=20",
                                                      "--config.checkpoint.save_every=5",
                                                      "--config.train.epochs=3", *extra)]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


@pytest.mark.slow
def test_resume_after_sigkill_is_bit_exact(tmp_path):
    data = write_curated(tmp_path / "data", n=200)
    straight = _spawn(data, tmp_path / "a")
    killed = _spawn(data, tmp_path / "b", "--config.train.debug_kill_at_step=12")
    out_a, _ = straight.communicate(timeout=600)
    out_b, _ = killed.communicate(timeout=600)
    assert straight.returncode == 0, out_a[-3000:]
    assert killed.returncode == -9, out_b[-3000:]
    saved = sorted(int(s) for s in os.listdir(tmp_path / "b" / "checkpoints") if s.isdigit())
    assert saved and max(saved) <= 12
    resumed = _spawn(data, tmp_path / "b")
    out_r, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out_r[-3000:]
    assert f"from step {max(saved)}" in out_r
    step_a, pa = export_lib.restore_params(str(tmp_path / "a" / "checkpoints"))
    step_b, pb = export_lib.restore_params(str(tmp_path / "b" / "checkpoints"))
    assert step_a == step_b == 20
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(pa)[0], jax.tree.leaves(pb)):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
    # The per-step losses after the resume point are the same too.
    la = {r["step"]: r["loss"] for r in read_metrics(str(tmp_path / "a"))}
    lb = {r["step"]: r["loss"] for r in read_metrics(str(tmp_path / "b"))}
    assert all(la[s] == lb[s] for s in range(max(saved) + 1, 21))


def _fails(argv, capsys) -> str:
    assert _cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("rossjax train: ")
    return err


def test_bad_input_is_one_clear_sentence(tmp_path, capsys):
    data = write_curated(tmp_path / "data", n=20)
    empty = write_curated(tmp_path / "nothing", n=20, supervised=False)

    err = _fails(_argv(empty, tmp_path / "w0"), capsys)
    assert "no supervised tokens" in err and "nothing" in err

    err = _fails(_argv(data, tmp_path / "w1", "--config.train.no_such_field=3"), capsys)
    assert "no_such_field" in err

    err = _fails(_argv(data, tmp_path / "w2", f"--config.model.path={tmp_path}/missing"), capsys)
    assert "config.model.path" in err and "does not exist" in err

    # A checkpoint from a model with another vocabulary in the workdir: refuse to resume.
    other = models.get_preset("tiny_qwen2", vocab_size=128)
    params = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                          jax.eval_shape(lambda: models.init_params(other, jax.random.key(0))))
    opt = optax.adamw(1e-3)
    state = {"params": params, "opt_state": opt.init(params), "step": jnp.array(3, jnp.int32),
             "rng": jax.random.PRNGKey(0), "bad_steps": jnp.array(0, jnp.int32)}
    ck = ckpt_lib.Checkpointer(str(tmp_path / "w3" / "checkpoints"), save_every=1)
    ck.save(3, state)
    ck.close()
    err = _fails(_argv(data, tmp_path / "w3"), capsys)
    assert "incompatible" in err and "embedding" in err and "(128, 64)" in err

    assert not json.dumps(err).count("Traceback")


def test_recipe_check_compares_mask_mode_and_rows(tmp_path):
    from rossjax.cli import parse_config

    def cfg(recipe):
        return parse_config([f"--config={CONFIG}:runlocal,{recipe}"])[0]

    def curated(name, **conf):
        d = tmp_path / name
        d.mkdir()
        (d / "report.json").write_text(json.dumps({"config": conf}))
        return str(d)

    annotated = curated("a", mask_mode="annotated", rows="accepted")
    eligible = curated("e", mask_mode="eligible", rows="accepted")
    positive = curated("p", mask_mode="eligible", rows="verifier_positive")
    old = curated("o", mask_mode="eligible")   # a report from before curate recorded `rows`
    assert loop.check_recipe(cfg("ross"), [annotated]) == []
    assert loop.check_recipe(cfg("ross_no_mask"), [eligible]) == []
    assert loop.check_recipe(cfg("positive_sft"), [positive]) == []
    for recipe, d, field in (("ross", eligible, "mask_mode"), ("ross_no_mask", annotated, "mask_mode"),
                             ("ross_no_mask", positive, "rows"), ("positive_sft", eligible, "rows")):
        with pytest.raises(ValueError, match=f"field '{field}'.*--config.{field}="):
            loop.check_recipe(cfg(recipe), [d])
    notes = loop.check_recipe(cfg("positive_sft"), [old])
    assert len(notes) == 1 and "'rows'" in notes[0] and "verifier_positive" in notes[0]


def test_a_derived_model_path_goes_into_the_runs_config_not_the_callers():
    """train.loop.with_model_path: the exported params of a run workdir given as the model are
    named in a copy (what the run checks, saves and trains from); the caller's config is read
    only."""
    import ml_collections

    cfg = ml_collections.ConfigDict({"model": {"path": "RUN"}, "train": {"seed": 0}})
    cfg.lock()
    assert loop.with_model_path(cfg, "RUN") is cfg
    out = loop.with_model_path(cfg, "RUN/init_params")
    assert out.model.path == "RUN/init_params" and cfg.model.path == "RUN"
    assert out.train.seed == 0 and out.is_locked
