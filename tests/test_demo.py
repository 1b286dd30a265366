"""`make demo` end to end: `rossjax demo` on the shipped data, in a fresh process, and what it
says it wrote (README 'What `make demo` does')."""

import ast
import json
import math
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest
from xla_flags import xla_flags

from rossjax import demo

# One test for the whole run (its checks below): a module fixture shared by several tests would
# run the 6-minute demo once per xdist worker that draws one of them (make test: two xdist workers).
pytestmark = pytest.mark.slow

_PNG = b"\x89PNG\r\n\x1a\n"


def _run_demo(wd):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               XLA_FLAGS=xla_flags(1))
    proc = subprocess.run([sys.executable, "-m", "rossjax.cli", "demo", f"--workdir={wd}",
                           "--steps=3", "--agent_sft_steps=5", "--agent_grpo_steps=1"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return wd, proc.stdout


def _curate_accounts_for_every_shipped_row(run):
    wd, _ = run
    with open(demo.data_path("rollouts", "sample.jsonl"), encoding="utf-8") as f:
        n_rows = sum(1 for line in f if line.strip())
    with open(wd / "curated" / "report.json") as f:
        report = json.load(f)
    b = report["buckets"]
    assert report["input_rows"] == n_rows == b["kept"] + b["withheld"] + b["invalid"]
    # The sample is built to hit each outcome; a change here is a change of curate's behaviour.
    assert b == {"kept": 19, "withheld": 8, "invalid": 3}
    assert report["reasons"]["withheld"] == {
        "anchor_ambiguous": 1, "annotation_drop": 1, "exclude_protected": 1, "not_annotated": 1,
        "token_mismatch": 1, "verifier_failed": 3}
    assert 0 < report["ter"] < 1


def _training_ran_every_step_and_export_reloads(run):
    wd, out = run
    rows = [json.loads(line) for line in open(wd / "sft" / "metrics.jsonl")]
    steps = sorted({r["step"] for r in rows if "loss" in r})
    assert steps == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r)
    diff = float(re.search(r"max \|logit diff\| ([0-9.e+-]+)", out).group(1))
    assert diff < 1e-4  # fp32 on both sides

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(wd / "export_hf")
    text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.startswith("<|im_start|>user\n2+2?<|im_end|>")
    ids = tok(text).input_ids
    assert len(ids) > 5 and len(set(ids)) > 3  # a real tokenizer, not a one-token stand-in
    model = AutoModelForCausalLM.from_pretrained(wd / "export_hf", dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits.numpy()
    assert np.isfinite(logits).all() and logits.shape[-1] >= len(tok)


def _views_are_written(run):
    wd, out = run
    html = (wd / "mask.html").read_text(encoding="utf-8")
    pick = re.search(r"\(mask of ([^)]+)\)", out).group(1)
    assert f"<h2>{pick}</h2>" in html and "supervised" in html
    for png in (wd / "sft" / "loss.png", wd / "select" / "selection.png"):
        assert png.read_bytes()[:8] == _PNG, png
    sel = [json.loads(line) for line in open(wd / "select" / "selected.jsonl")]
    assert 0 < len(sel) <= 56
    assert str(wd) in out.splitlines()[-7]  # the summary says where the outputs are


def _agentic_grpo_wrote_a_finite_reward_each_step(run):
    wd, out = run
    grpo = wd / "agents" / "grpo"
    rows = [json.loads(line) for line in open(grpo / "metrics.jsonl")]
    rewards = {r["step"]: r["reward_mean"] for r in rows if "reward_mean" in r}
    assert sorted(rewards) == [1] and all(math.isfinite(v) for v in rewards.values())
    assert all(0.0 <= v <= 1.0 for v in rewards.values())  # the env's verdict is pass/fail
    history = [json.loads(line) for line in open(grpo / "history.jsonl")]
    assert len(history) == 4 * 8  # :runlocal,vault: 4 tasks x 8 episodes a step
    assert all(r["verifier"]["name"] == "agents.vault" for r in history)
    assert re.search(r"GRPO step 1: reward_mean [0-9.]+; opened the vault \d+/32", out)


def _serve_answered_and_the_server_is_gone(run):
    wd, out = run
    m = re.search(r"served +vault_hf at http://127\.0\.0\.1:(\d+)/v1 answered (.*) to "
                  r"'Vault code\?' \(log: (.*)\)$", out, re.M)
    assert m, out[-2000:]
    assert isinstance(ast.literal_eval(m.group(2)), str)
    assert "the served model answered" in out
    assert "rossjax serve: vault_hf on http://127.0.0.1" in open(m.group(3)).read()
    with socket.socket() as s:  # the demo terminated the server: nothing listens on its port
        # (SO_REUSEADDR: the closed connections' TIME_WAIT does not count; a listener does)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(m.group(1))))


def _summary_names_every_stage(run):
    _, out = run
    tail = out.splitlines()[-7:]
    assert tail[0].startswith("rossjax demo done in ")
    labels = [line.split()[0] for line in tail[1:]]
    assert labels == ["curated", "trained", "exported", "look", "agents", "served"]
    assert re.search(r"agents +vault GRPO reward first->last [0-9.]+ -> [0-9.]+ over 1 steps",
                     out)
    assert [int(k) for k in re.findall(r"^== (\d)/7 ", out, re.M)] == list(range(1, 8))


def test_demo_runs_every_stage_and_says_where_its_outputs_are(tmp_path):
    (tmp_path / "demo").mkdir()
    run = _run_demo(tmp_path / "demo")
    _curate_accounts_for_every_shipped_row(run)
    _training_ran_every_step_and_export_reloads(run)
    _views_are_written(run)
    _agentic_grpo_wrote_a_finite_reward_each_step(run)
    _serve_answered_and_the_server_is_gone(run)
    _summary_names_every_stage(run)


def test_a_server_that_dies_is_reported_with_its_log(tmp_path):
    from rossjax.errors import ConfigError
    from rossjax.reconstruct.local import LocalServer

    log = tmp_path / "serve.log"
    with pytest.raises(ConfigError, match=r"rossjax demo: .*exited with code [1-9].*no-such-model"):
        with LocalServer(str(tmp_path / "no-such-model"), str(log), max_len=64, slots=1,
                         startup_s=60, where="rossjax demo"):
            pass
