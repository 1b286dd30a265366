"""Promises of README / docs/failures.md that only an end-to-end run shows (issue 30 part 1):
a curating tokenizer larger than the model's vocabulary is refused before step 1, and
train.max_bad_steps non-finite steps in a row stop the run with one sentence (docs/failures.md
'non-finite losses')."""

import json
import math
import os
import subprocess
import sys

import pytest
from test_sft_loop import write_curated
from xla_flags import xla_flags

from rossjax import demo
from rossjax.tokenizers.ascii import write_ascii_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu",
           HF_HUB_OFFLINE="1")


def _cli(*argv, timeout=300):
    return subprocess.run([sys.executable, "-m", "rossjax.cli", *argv], env=ENV, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _big_ascii_tokenizer(folder, extra=5):
    """The ascii tokenizer (131 ids) plus `extra` special tokens no row uses: ids 131.."""
    from tokenizers import Tokenizer

    write_ascii_tokenizer(folder)
    path = os.path.join(folder, "tokenizer.json")
    tok = Tokenizer.from_file(path)
    tok.add_special_tokens([f"<|unused_{i}|>" for i in range(extra)])
    tok.save(path)
    return folder


def _curate(tmp_path, tok):
    rows = tmp_path / "rows.jsonl"
    with open(demo.data_path("rollouts", "sample.jsonl"), encoding="utf-8") as f:
        rows.write_text("".join(f.readlines()[:6]), encoding="utf-8")
    out = str(tmp_path / "curated")
    p = _cli("curate", f"--config={ROOT}/configs/curate.py", f"--config.input={rows}",
             f"--config.output={out}", f"--config.tokenizer={tok}", "--config.verify=stored")
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_before_step_1(tmp_path):
    tok = _big_ascii_tokenizer(str(tmp_path / "tok"), extra=5)
    out = _curate(tmp_path, tok)
    with open(os.path.join(out, "report.json")) as f:
        tid = json.load(f)["token_ids"]
    # every kept id fits 131 (ascii + 3 chat specials): only the tokenizer's size can refuse
    assert tid["tokenizer_vocab_size"] == 136 and tid["max"] <= 130, tid
    work = tmp_path / "run"
    p = _cli("train", f"--config={ROOT}/configs/ross_sft.py:runlocal", "--config.model.vocab_size=131",
             f"--config.data.train={out}", f"--workdir={work}", "--config.train.num_steps=2")
    assert p.returncode == 2, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last == (f"rossjax train: {out} was curated with tokenizer {tok} of 136 tokens, more "
                    f"than the model's vocabulary of 131; curate with the model's tokenizer "
                    f"(--config.tokenizer=MODEL_DIR)"), last
    assert "Traceback" not in p.stderr
    assert not os.path.exists(work / "metrics.jsonl")  # refused before step 1

    # the same dir passes the check for a model of the tokenizer's size: the size is the gate
    from ml_collections import ConfigDict

    from rossjax.train.data import check_fits_model

    cfg = ConfigDict({"data": {"train": out, "eval": "", "seq_len": 128, "too_long": "truncate"}})
    check_fits_model(cfg, 136)


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """A run whose lr of 1e30 turns step 1's update into non-finite params: every later step is
    non-finite (and skipped, so the params stay so) until max_bad_steps=5 in a row stop it."""
    tmp = tmp_path_factory.mktemp("diverge")
    data = write_curated(tmp / "data", n=80)
    work = tmp / "run"
    p = _cli("train", f"--config={ROOT}/configs/ross_sft.py:runlocal", f"--config.data.train={data}",
             f"--workdir={work}", "--config.optim.peak_lr=1e30", "--config.train.num_steps=10",
             "--config.data.seq_len=128",
             "--config.train.epochs=10", "--config.checkpoint.save_every=100")
    return p, work


def test_max_bad_steps_stops_the_run_at_the_fifth_non_finite_step_in_a_row(diverged):
    from rossjax.monitor import read_metrics

    p, work = diverged
    assert p.returncode != 0
    assert ("stopped at step 6: 5 steps in a row had a non-finite loss or gradient."
            in p.stderr.strip().splitlines()[-1]), p.stderr[-3000:]
    rows = read_metrics(str(work))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # step 6 raised before it was logged
    assert [r["bad_steps"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["skipped"] for r in rows] == [0, 1, 1, 1, 1]
    losses = [float(r["loss"]) for r in rows]  # metrics.jsonl writes a NaN as "nan"
    assert math.isfinite(losses[0]) and all(math.isnan(x) for x in losses[1:]), losses


def test_max_bad_steps_is_one_sentence_and_exit_2(diverged):
    p, _ = diverged
    assert "Traceback" not in p.stderr and p.returncode == 2, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1] == (
        "rossjax train: stopped at step 6: 5 steps in a row had a non-finite loss or gradient.")


def test_export_tokenizer_hf_dir_overrides_the_runs_own_tokenizer(tmp_path):
    """`rossjax export --tokenizer=HF_DIR`: the folder's tokenizer, chat template and generation
    config, not the ascii tokenizer the run's config names (README 'export')."""
    import jax
    from test_export import TEMPLATE, _base, _lora_run
    from transformers import AutoTokenizer, GenerationConfig

    from rossjax import models
    from rossjax.models.hf import read_hf_config
    from rossjax.train import checkpoint as ckpt_lib

    base = _base(tmp_path / "base")
    run = _lora_run(tmp_path / "run", base)
    os.remove(os.path.join(run, "lora.json"))  # a full-weights run: no LoRA base to fall back on
    ck = ckpt_lib.Checkpointer(os.path.join(run, "checkpoints"), async_save=False)
    ck.save(6, {"params": models.init_params(read_hf_config(str(base)), jax.random.key(0))},
            force=True)
    ck.close()
    write_ascii_tokenizer(os.path.join(run, "tokenizer"))
    with open(os.path.join(run, "config.json"), "w") as f:
        json.dump({"tokenizer": "ascii", "template": "chatml", "model": {"path": ""}}, f)
    hf = tmp_path / "dir"
    p = _cli("export", f"--checkpoint={run}", f"--tokenizer={base}", str(hf))
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"tokenizer {base} " in p.stderr, p.stderr[-2000:]
    tok, ref = AutoTokenizer.from_pretrained(str(hf)), AutoTokenizer.from_pretrained(str(base))
    assert tok.chat_template == TEMPLATE and tok.eos_token == "<eos>"
    msgs = [{"role": "user", "content": "w3 w7"}, {"role": "assistant", "content": "w9"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|user|> w3 w7 <|assistant|> w9 <|assistant|>"  # TEMPLATE, not chatml
    words = ["<|user|>", "w3", "w7", "<|assistant|>", "w9"]
    assert tok.convert_tokens_to_ids(words) == ref.convert_tokens_to_ids(words) == [2, 7, 11, 3, 13]
    with open(hf / "tokenizer.json") as a, open(base / "tokenizer.json") as b:
        assert json.load(a)["model"]["vocab"] == json.load(b)["model"]["vocab"]  # 104 words, not ascii
    gen = GenerationConfig.from_pretrained(str(hf))
    assert gen.eos_token_id == 1 and gen.max_new_tokens == 7


@pytest.mark.slow  # two trainer processes, each compiling its step (~20 s each on 2 cores)
def test_sigterm_to_a_running_train_checkpoints_exits_0_and_the_rerun_continues(tmp_path):
    """docs/failures.md 'SIGTERM': the step in progress finishes, a checkpoint is saved, one line
    says so, exit 0; a rerun (2 steps further) continues from that step and records no step twice."""
    import signal

    from test_faults_runs import _ckpt_steps, _cli_sub, _steps, train_signalled_at_step_2

    p, work, argv, out, seen = train_signalled_at_step_2(tmp_path, signal.SIGTERM)
    assert p.returncode == 0, out[-3000:]
    stopped = _ckpt_steps(work)
    assert len(stopped) == 1 and seen <= stopped[0] < 40, (stopped, out[-2000:])
    at = stopped[0]  # save_every=100: only the SIGTERM can have written this checkpoint
    assert f"SIGTERM at step {at}; checkpoint saved" in out, out[-2000:]
    assert _steps(work) == list(range(1, at + 1))
    p = _cli_sub(*argv, "--config.train.num_steps=" + str(at + 2))
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 0 and f"from step {at}" in out, out[-3000:]
    assert _steps(work) == list(range(1, at + 3))
