"""RetroGen offline to the end (issue 38 items 4 and 5): `rossjax reconstruct :runlocal` goes on
from the stand-in's kept trajectories through `rossjax retrogen` to curate and an SFT run of a
tiny model, printing each command and where its outputs are; `rossjax retrogen-loop` repeats
reconstruct -> gate -> SFT for N rounds and reports every round, naming the endpoint each used.
The two end-to-end runs train one step each (compilation dominates) and are slow-marked."""

import json
import math
import os

import pytest

from rossjax import cli
from rossjax.cli import retrogen_loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNLOCAL = f"--config={ROOT}/configs/reconstruct.py:runlocal"


@pytest.mark.slow
def test_runlocal_chain_ends_with_an_sft_run_on_the_kept_rows(tmp_path, capsys):
    w = tmp_path / "w"
    assert cli.main(["reconstruct", RUNLOCAL, f"--workdir={w}", "--config.sft.epochs=1"]) == 0
    out = capsys.readouterr().out
    rep = json.load(open(w / "report.json"))
    assert rep["buckets"]["kept"] == 6 and rep["retrogen"]["kept"] == 6
    sft = rep["sft"]
    assert sft["rows"] == 6 and sft["supervised_tokens"] > 0 and sft["steps"] == 1
    assert math.isfinite(sft["loss_first"]) and sft["workdir"] == str(w / "sft")
    assert os.path.isdir(w / "sft" / "checkpoints") and sft["base"] == str(w / "tiny_model")
    cur = json.load(open(w / "curated" / "report.json"))
    assert cur["buckets"]["kept"] == 6  # every serialized row reached the trainer
    # what it did, as typed, and where everything is
    assert f"$ rossjax curate --config={ROOT}/configs/curate.py" in out
    assert "$ rossjax train --config=" in out and "retrogen_sft.py:runlocal" in out
    for what in ("trajectories", "SFT rows", "curated", "trained", "report"):
        assert f"  {what} " in out
    # a rerun: everything journaled, the finished SFT with the same rows is kept, not redone
    assert cli.main(["reconstruct", RUNLOCAL, f"--workdir={w}", "--config.sft.epochs=1"]) == 0
    again = capsys.readouterr().out
    assert "$ rossjax train" not in again and "unchanged; kept it" in again
    assert json.load(open(w / "report.json"))["sft"]["resumed"] is True


@pytest.mark.slow
def test_a_two_round_loop_with_the_standin_reports_both_rounds(tmp_path, capsys):
    w = tmp_path / "loop"
    assert cli.main(["retrogen-loop", RUNLOCAL, f"--workdir={w}", "--config.loop.rounds=2",
                     "--config.loop.endpoint=standin", "--config.sft.epochs=1"]) == 0
    rep = json.load(open(w / "report.json"))
    assert rep["stopped"] is None and [r["round"] for r in rep["rounds"]] == [1, 2]
    r1, r2 = rep["rounds"]
    for r in (r1, r2):
        assert r["endpoint"]["kind"] == "standin" and "NOT a model" in r["endpoint"]["note"]
        assert r["buckets"]["kept"] == 6 and r["sft_rows"] == 6
        assert set(r["signals"]) == {"rubric", "quality", "grounding", "consistency", "eq4"}
        assert r["thresholds"] == {"finance": 0.48, "legal": 0.63, "science": 0.52}
        assert r["sft"]["steps"] == 1 and math.isfinite(r["sft"]["loss_last"])
        assert os.path.isfile(os.path.join(r["sft"]["model"], "config.json"))
    assert (r1["seed"], r2["seed"]) == (0, 1)
    assert r2["sft"]["base"] == r1["sft"]["model"]  # round 2 trains round 1's model further
    md = open(w / "report.md").read()
    assert "| 1 | standin | rules-standin | 6 / 0 / 0 |" in md
    assert "| 2 | standin | rules-standin | 6 / 0 / 0 |" in md and "NOT a model" in md


def test_the_report_names_a_failed_served_round_and_why_the_loop_stopped(tmp_path):
    """A served round that kept nothing (a tiny model's answers are noise) is reported as what
    it was: served, its reasons, no SFT; a round whose server never came up says so."""
    ok = {"round": 1, "seed": 0, "workdir": "w/round_1",
          "endpoint": {"kind": "standin", "model": "rules-standin", "note": "rules, NOT a model"},
          "buckets": {"kept": 6, "withheld": 0, "invalid": 0}, "reasons": {},
          "signals": {"rubric": 1.0, "quality": 0.75, "grounding": 1.0, "consistency": 1.0,
                      "eq4": 0.9375}, "thresholds": {"legal": 0.63}, "sft_rows": 6,
          "sft": {"steps": 1, "loss_first": 4.9, "loss_last": 4.8, "model": "w/round_1/sft/hf"}}
    noise = {"round": 2, "seed": 1, "workdir": "w/round_2",
             "endpoint": {"kind": "served", "model": "round1-sft", "note": "rossjax serve"},
             "buckets": {"kept": 0, "withheld": 0, "invalid": 6},
             "reasons": {"model_truncated": 6}, "signals": {}, "thresholds": {}, "sft_rows": 0,
             "sft": {"skipped": "no SFT row was kept: nothing to train on"}}
    down = {"round": 3, "seed": 2, "workdir": "w/round_3", "error": "serve exited with code 1",
            "endpoint": {"kind": "served", "model": "round2-sft", "note": "failed"}}
    out = {"rounds_asked": 3, "loop_endpoint": "served", "rounds": [ok, noise, down],
           "stopped": "round 3 failed: serve exited with code 1"}
    retrogen_loop.write_markdown(str(tmp_path / "r.md"), out)
    md = open(tmp_path / "r.md").read()
    assert "| 1 | standin | rules-standin | 6 / 0 / 0 | 1.000 | 0.750 |" in md
    assert "| 2 | served | round1-sft | 0 / 0 / 6 | - |" in md and "model_truncated 6" in md
    assert "| 3 | served | round2-sft | failed |" in md and "Failed: serve exited" in md
    assert "Stopped: round 3 failed" in md and "no SFT (no SFT row was kept" in md


@pytest.mark.parametrize("flag,msg", [("--config.loop.endpoint=bogus", "config.loop.endpoint"),
                                      ("--config.loop.rounds=0", "config.loop.rounds"),
                                      ("--config.then_retrogen=False", "then_retrogen")])
def test_a_loop_setting_that_cannot_run_is_one_sentence_before_anything_runs(tmp_path, capsys,
                                                                            flag, msg):
    assert cli.main(["retrogen-loop", RUNLOCAL, f"--workdir={tmp_path / 'l'}", flag]) == 2
    assert msg in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "l" / "round_1")


@pytest.mark.slow
def test_a_served_round_reconstructs_with_the_trained_model_and_says_how_it_did(tmp_path):
    """Round 2 serves round 1's exported model with `rossjax serve` on loopback: a tiny model
    trained one step answers noise, so every artifact ends invalid, nothing is trained and the
    loop stops, and the report says so rather than keeping the stand-in."""
    w = tmp_path / "served"
    assert cli.main(["retrogen-loop", RUNLOCAL, f"--workdir={w}", "--config.loop.rounds=3",
                     "--config.sft.epochs=1", "--config.loop.max_tokens=16",
                     "--config.serve.startup_s=240"]) == 0
    rep = json.load(open(w / "report.json"))
    r1, r2 = rep["rounds"]  # round 3 would serve the same model again: not run
    assert r1["endpoint"]["kind"] == "standin" and r1["sft"]["model"]
    assert r2["endpoint"] == {"kind": "served", "model": "round1-sft",
                              "note": f"the model the round before trained ({r1['sft']['model']}"
                                      f"), served by `rossjax serve` on 127.0.0.1"}
    assert r2["buckets"]["kept"] == 0 and r2["requests"] >= 6 and "steps" not in r2["sft"]
    assert sum(r2["reasons"].values()) == 6 and "round 2 kept no SFT row" in rep["stopped"]
    assert sum(sum(c.values()) for c in r2["ended_at"].values()) == 6  # the stage each ended at
    assert "| 2 | served | round1-sft | 0 / " in open(w / "report.md").read()
