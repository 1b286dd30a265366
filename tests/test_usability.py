"""The first hour of a TRL or verl user (issue 29), walked through the command line: nothing is
lost silently in training, curate's verifiers read the rows users have, GRPO runs relearn with
any reward, exports carry a tokenizer, `rossjax generate` and `rossjax inspect --list`."""

import json
import os

import numpy as np
import pytest

from rossjax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SFT = os.path.join(ROOT, "configs", "ross_sft.py")
CURATE = os.path.join(ROOT, "configs", "curate.py")


def _compiled(out, lengths, vocab_top=200):
    """A curated dir of compiled rows of the given lengths (the second half of each supervised)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    from rossjax.curate.compiled import encode_example

    os.makedirs(out)
    w = ArrayRecordWriter(os.path.join(out, "compiled-00000.array_record"), "group_size:1")
    rng = np.random.default_rng(0)
    for i, n in enumerate(lengths):
        mask = np.r_[np.zeros(n // 2), np.ones(n - n // 2)].astype(np.uint8)
        w.write(encode_example({"id": f"e{i}", "input_ids": rng.integers(0, vocab_top, n),
                                "loss_mask": mask, "eligible_mask": mask}))
    w.close()
    with open(os.path.join(out, "report.json"), "w") as f:  # train refuses a folder without one
        json.dump({"shards": [{"path": "compiled-00000.array_record",
                               "examples": len(lengths)}]}, f)
    return str(out)


def _train(data, workdir, *extra):
    return cli.main(["train", f"--config={SFT}:runlocal", f"--config.data.train={data}",
                     "--config.train.num_steps=1", "--config.data.seq_len=128",
                     f"--workdir={workdir}", *extra])


def test_rows_longer_than_seq_len_stop_the_run_or_are_counted(tmp_path, capsys):
    """The default (too_long=error) stops before step 1 with the count and the three fixes; drop
    and truncate train, and say how many rows they dropped or cut in the banner, the metrics and
    WORKDIR/too_long.jsonl."""
    data = _compiled(tmp_path / "c", [40, 300, 50, 60, 200, 70, 80, 90])
    assert _train(data, tmp_path / "w0") == 2
    err = capsys.readouterr().err
    assert "2 of the 8 rows of" in err and "longer than config.data.seq_len=128" in err
    assert "the longest has 300" in err and "config.data.too_long=drop" in err
    assert "config.data.too_long=truncate" in err and "Traceback" not in err

    assert _train(data, tmp_path / "w1", "--config.data.too_long=drop") == 0
    err = capsys.readouterr().err
    assert "2 of 8 rows longer than data.seq_len=128 (2 dropped" in err
    rows = [json.loads(x) for x in open(tmp_path / "w1" / "too_long.jsonl")]
    assert [(r["id"], r["tokens"], r["result"]) for r in rows] == [("e1", 300, "dropped"),
                                                                   ("e4", 200, "dropped")]
    m = [json.loads(x) for x in open(tmp_path / "w1" / "metrics.jsonl")][-1]
    assert (m["data_too_long"], m["data_dropped"], m["data_truncated"]) == (2, 2, 0)

    assert _train(data, tmp_path / "w2", "--config.data.too_long=truncate") == 0
    assert "(2 truncated to their last 128 tokens" in capsys.readouterr().err
    m = [json.loads(x) for x in open(tmp_path / "w2" / "metrics.jsonl")][-1]
    assert (m["data_too_long"], m["data_dropped"], m["data_truncated"]) == (2, 0, 2)

    assert _train(data, tmp_path / "w3", "--config.data.too_long=cut") == 2
    assert "config.data.too_long 'cut' is not one of error, drop, truncate" in capsys.readouterr().err


def _jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _curate(*extra, workdir):
    return cli.main(["curate", f"--config={CURATE}", "--config.progress=False",
                     "--config.verify_workers=0", "--config.rows=verifier_positive",
                     "--config.mask_mode=eligible", f"--workdir={workdir}", *extra])


def _report(d):
    with open(os.path.join(d, "report.json")) as f:
        return json.load(f)


def test_curate_verify_fn_hook_from_the_working_directory(tmp_path, monkeypatch):
    """--config.verify_fn=module:function with GRPO's reward.fn signature: a module in the
    working directory verifies every row (on worker processes too); a bool, a number (>=
    verify_threshold), None or a raised error each give their verdict, and a bad spec is one
    sentence."""
    import subprocess
    import sys

    (tmp_path / "myverify.py").write_text(
        "def check(prompt, completion, task):\n"
        "    if completion == 'boom':\n"
        "        raise RuntimeError('cannot judge')\n"
        "    if completion == 'maybe':\n"
        "        return None\n"
        "    return 1.0 if completion.strip() == task['reference'] else 0.25\n")
    rows = _jsonl(tmp_path / "rows.jsonl", [
        {"id": f"r{i}", "task": {"reference": "4"},
         "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": a}]}
        for i, a in enumerate(["4", "5", "maybe", "boom", " 4"])])
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    p = subprocess.run([sys.executable, "-m", "rossjax.cli", "curate", f"--config={CURATE}",
                        f"--config.input={rows}", "--config.verify_fn=myverify:check",
                        "--config.rows=verifier_positive", "--config.mask_mode=eligible",
                        "--config.verify_workers=1", "--config.progress=False",
                        f"--workdir={tmp_path / 'out'}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rep = _report(tmp_path / "out")
    assert rep["buckets"]["kept"] == 2
    assert rep["reasons"]["withheld"] == {"verifier_failed": 1, "verifier_undecided": 2}
    held = {r["id"]: r["detail"] for r in map(json.loads, open(tmp_path / "out" / "withheld.jsonl"))}
    assert "myverify:check error: RuntimeError: cannot judge" in held["r3"]
    assert "returned None" in held["r2"]

    monkeypatch.chdir(tmp_path)
    assert _curate(f"--config.input={rows}", "--config.verify_fn=myverify:nope",
                   workdir=tmp_path / "o2") == 2
    assert _curate(f"--config.input={rows}", "--config.verify_fn=nomodule_xyz:f",
                   workdir=tmp_path / "o3") == 2
    assert _curate(f"--config.input={rows}", "--config.verify_fn=myverify:check",
                   "--config.verify=stored", workdir=tmp_path / "o4") == 2


def test_gsm8k_answers_verify_as_math(tmp_path):
    """A GSM8K row (gold = the worked solution ending in `#### 72`, answer ending in `#### 72`)
    passes the math verifier; `#### 71` fails; a thousands comma is read as a number."""
    gold = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72.\n#### 72"
    rows = _jsonl(tmp_path / "gsm.jsonl", [
        {"id": f"g{i}", "task": {"domain": "math", "reference": ref},
         "prompt": "How many clips?", "completion": ans}
        for i, (ref, ans) in enumerate([(gold, "48 + 24 = 72.\n#### 72"), (gold, "#### 71"),
                                        ("#### 1,200", "So the total is #### 1,200.")])])
    assert _curate(f"--config.input={rows}", "--config.verify=rerun", workdir=tmp_path / "o") == 0
    rep = _report(tmp_path / "o")
    assert rep["buckets"]["kept"] == 2 and rep["reasons"]["withheld"] == {"verifier_failed": 1}
    failed = json.loads(open(tmp_path / "o" / "withheld.jsonl").readline())
    assert failed["id"] == "g1" and "'71'" in failed["detail"]


CHATML_PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                 "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_verl_rollout_dump_score_is_the_verdict_and_the_prompt_is_not_templated_twice(tmp_path):
    """verl's rollout dump (input already rendered by the policy's template, with or without its
    special tokens; output; score; step): the prompt is split back into its turns, so the curated
    text holds one chat template; score 1.0 passes, 0 fails; a field mapping that only names the
    reward column keeps the dump's format and its step."""
    from rossjax.curate import load_tokenizer, read_compiled

    stripped = "system\nYou are a helpful assistant.\nuser\nWhat is 2+2?\nassistant\n"
    rows = _jsonl(tmp_path / "0.jsonl", [
        {"input": CHATML_PROMPT, "output": "4", "score": 1.0, "step": 3, "acc": 1.0},
        {"input": stripped, "output": "4", "score": 1.0, "step": 5, "acc": 0.0},
        {"input": CHATML_PROMPT, "output": "5", "score": 0.0, "step": 4, "acc": 0.0},
        {"input": "What is 2+2?", "output": "4", "score": 1.0, "step": 4, "acc": 1.0}])
    assert _curate(f"--config.input={rows}", workdir=tmp_path / "o") == 0
    rep = _report(tmp_path / "o")
    assert rep["buckets"]["kept"] == 3 and rep["reasons"]["withheld"] == {"verifier_failed": 1}
    tok = load_tokenizer("qwen")
    texts = [tok.decode(ex["input_ids"].tolist()) for ex in read_compiled(str(tmp_path / "o"))]
    want = CHATML_PROMPT + "4<|im_end|>\n"
    assert texts[0] == want and texts[1] == want, texts
    assert texts[2] == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"

    # the mapping names the reward column only: rows are still read as a verl dump, step kept
    assert _curate(f"--config.input={rows}", "--config.fields.reward_key=acc",
                   "--config.fields.reward_threshold=0.5", workdir=tmp_path / "m") == 0
    rep = _report(tmp_path / "m")
    assert rep["buckets"]["kept"] == 2 and rep["reasons"]["withheld"] == {"verifier_failed": 2}
    assert set(rep["ter_by_step"]) == {"3", "4"}  # the kept rows, step 3 and 4


GRPO = os.path.join(ROOT, "configs", "grpo_verifier.py")


@pytest.fixture(scope="module")
def custom_grpo(tmp_path_factory):
    """A 2-step GRPO run whose only reward is the user's reward.fn (odd-length answers score 1)."""
    tmp = tmp_path_factory.mktemp("grpo_fn")
    (tmp / "myreward.py").write_text(
        "def odd(prompt, completion, task):\n    return float(len(completion) % 2)\n")
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(tmp))
    work = str(tmp / "grpo")
    rc = cli.main(["grpo", f"--config={GRPO}:runlocal", f"--workdir={work}", "--config.grpo.steps=2",
                   "--config.grpo.max_new_tokens=12", "--config.grpo.contexts=4",
                   "--config.reward.fn=myreward:odd",
                   "--config.reward.workers=1", "--config.checkpoint.save_every=1"])
    mp.undo()
    assert rc == 0
    return tmp, work


def test_grpo_history_with_a_custom_reward_relearns(custom_grpo, capsys):
    """Every history row carries the verdict of its reward (passed = reward >=
    reward.success_threshold), so curate keeps exactly the rows the custom reward passed and
    re-verifies none of them (was: every row re-verified as math and failed)."""
    from rossjax.train.rl.history import read_history

    tmp, work = custom_grpo
    rows = read_history(os.path.join(work, "history.jsonl"))
    assert len(rows) == 2 * 4 * 4
    for r in rows:
        v = r["verifier"]
        assert v["name"] == "grpo_reward" and v["passed"] == (r["reward"] >= 0.5)
        assert "reward.success_threshold 0.5 (fn)" in v["evidence"]
    passed = sum(r["verifier"]["passed"] for r in rows)
    assert 0 < passed < len(rows)
    out = str(tmp / "curated")
    assert _curate(f"--config.input={work}/history.jsonl", f"--config.tokenizer={work}/tokenizer",
                   workdir=out) == 0
    rep = _report(out)
    assert rep["buckets"]["kept"] == passed and rep["verify"]["rerun"] == 0
    assert rep["reasons"]["withheld"] == {"verifier_failed": len(rows) - passed}


@pytest.mark.slow  # ~40 s: three trains / a generate, an export and a generate
def test_train_starts_from_a_grpo_workdir_and_complete_names_the_field(custom_grpo, capsys):
    """`rossjax train --config.model.path=GRPO_WORKDIR` starts from the GRPO run's last
    checkpoint (its params exactly); a finished run names the field that extends it."""
    import jax

    from rossjax.train.export.model import restore_params

    tmp, work = custom_grpo
    out = str(tmp / "curated2")
    assert _curate(f"--config.input={work}/history.jsonl", f"--config.tokenizer={work}/tokenizer",
                   "--config.verify=stored", "--config.unverified=keep", "--config.undecided=keep",
                   workdir=out) == 0
    sft = str(tmp / "sft")
    argv = ["train", f"--config={SFT}:runlocal,positive_sft", f"--config.model.path={work}",
            f"--config.data.train={out}", "--config.train.num_steps=1",
            "--config.optim.peak_lr=0", "--config.optim.end_lr=0", f"--workdir={sft}"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert f"config.model.path {work} is a run's workdir; starting from its step 2" in err
    _, grpo_params = restore_params(os.path.join(work, "checkpoints"))
    _, sft_params = restore_params(os.path.join(sft, "checkpoints"))
    # lr 0: the one SFT step leaves the GRPO run's final weights unchanged
    jax.tree.map(np.testing.assert_array_equal, grpo_params, sft_params)

    assert cli.main(argv) == 0
    said = capsys.readouterr().out
    assert "already complete" in said and "Raise --config.train.num_steps" in said
    assert cli.main(argv[:4] + argv[5:]) == 0  # no num_steps: the epochs end the run
    assert "Raise --config.train.epochs" in capsys.readouterr().out


@pytest.mark.slow  # ~40 s: three trains / a generate, an export and a generate
def test_generate_from_a_grpo_workdir_and_its_hf_export(custom_grpo, tmp_path, capsys):
    """`rossjax generate` on a run's workdir (its checkpoint, the run's ascii tokenizer and
    template) and on the Hugging Face export of it gives the same greedy completions, one JSON
    line per prompt and sample; a bad prompts row is one sentence naming it."""
    _, work = custom_grpo
    prompts = _jsonl(tmp_path / "p.jsonl", [
        {"id": "chat", "messages": [{"role": "user", "content": "What is 2 + 3?"}]},
        {"id": "raw", "prompt": "1 + 1 ="}])
    out = tmp_path / "o.jsonl"
    assert cli.main(["generate", f"--model={work}", f"--prompts={prompts}", f"--out={out}",
                     "--max_new_tokens=6", "--num_samples=2", "--temperature=0"]) == 0
    rows = [json.loads(x) for x in open(out)]
    assert [(r["id"], r["sample"]) for r in rows] == [("chat", 0), ("chat", 1), ("raw", 0), ("raw", 1)]
    assert all(r["finish_reason"] in ("stop", "length") and 0 < r["completion_tokens"] <= 6
               for r in rows)
    assert rows[0]["completion"] == rows[1]["completion"]  # greedy: the samples agree
    assert rows[0]["messages"][0]["content"] == "What is 2 + 3?" and rows[2]["prompt"] == "1 + 1 ="

    hf = str(tmp_path / "hf")
    assert cli.main(["export", f"--checkpoint={work}", "--format=hf", hf]) == 0
    capsys.readouterr()
    assert cli.main(["generate", f"--model={hf}", f"--prompts={prompts}", "--max_new_tokens=6",
                     "--dtype=float32"]) == 0
    again = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["completion"] for r in again] == [rows[0]["completion"], rows[2]["completion"]]

    bad = _jsonl(tmp_path / "bad.jsonl", [{"id": "x", "text": "hello"}])
    assert cli.main(["generate", f"--model={work}", f"--prompts={bad}"]) == 2
    assert "bad.jsonl row 1: field 'messages'" in capsys.readouterr().err
    assert cli.main(["generate", f"--model={tmp_path / 'nope'}", "--prompt=hi"]) == 2


def test_demo_tensorboard_hint_says_how_to_install_the_viewer(monkeypatch):
    import importlib.util
    import shutil

    from rossjax import demo

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert demo.tensorboard_hint("runs/demo/sft/tb") == (
        "tensorboard --logdir runs/demo/sft/tb, after pip install 'rossjax[tensorboard]' (or pip "
        "install tensorboard)")
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/tensorboard")
    assert demo.tensorboard_hint("tb") == "tensorboard --logdir tb"


@pytest.mark.slow
def test_grpo_verifier_runlocal_learns_in_its_20_steps(tmp_path):
    """configs/grpo_verifier.py:runlocal as printed: its reward rises over the 20 steps (the
    plot shows learning, not three flat lines)."""
    from rossjax.monitor import read_metrics

    assert cli.main(["grpo", f"--config={GRPO}:runlocal", f"--workdir={tmp_path}"]) == 0
    r = [m["reward_mean"] for m in read_metrics(str(tmp_path))]
    assert len(r) == 20
    first, last = np.mean(r[:5]), np.mean(r[-5:])
    assert last > first + 0.15, r  # measured 0.31 -> 0.50 at seed 0
    assert os.path.exists(tmp_path / "metrics.png")
