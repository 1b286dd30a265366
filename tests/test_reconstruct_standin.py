"""`:runlocal` end to end offline with nothing started by hand (issue 38 item 5): the run starts
the rule-driven stand-in endpoint (rossjax/reconstruct/standin.py, named a stand-in in the
report and on stderr) on 127.0.0.1, every artifact ends kept with its four signals scored,
`rossjax retrogen` applies the thresholds and serializes SFT rows, and a rerun asks nothing.
The stand-in's judges are rules that can say no: a ForwardGen draft citing a document outside
Ê scores lower grounding, and a draft with no citation fails the rubric."""

import json
import os

from rossjax import cli
from rossjax.curate import retrogen
from rossjax.reconstruct.standin import MODEL_ID, Rules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def runlocal(tmp_path, name, *extra):
    # the SFT run at :runlocal's end is tested in test_retrogen_loop.py
    assert cli.main(["reconstruct", f"--config={ROOT}/configs/reconstruct.py:runlocal",
                     f"--workdir={tmp_path / name}", "--config.then_sft=False", *extra]) == 0
    rep = json.load(open(tmp_path / name / "report.json"))
    recs = [json.loads(x) for x in open(tmp_path / name / "trajectories.jsonl")]
    return rep, recs


def test_runlocal_ends_with_kept_scored_trajectories_and_sft_rows(tmp_path, capsys):
    rep, recs = runlocal(tmp_path, "w")
    out = capsys.readouterr()
    assert "stand-in endpoint (rules-standin)" in out.err and "NOT a model" in out.err
    assert rep["model"]["model"] == MODEL_ID and "NOT a model" in rep["model"]["standin"]
    assert rep["buckets"] == {"kept": 6, "withheld": 0, "invalid": 0}
    for r in recs:
        assert retrogen.gate(r) is None and r["model"] == MODEL_ID
        assert set(r["scores"]) == set(retrogen.SIGNALS) and r["tool_steps"] >= 2
        assert [c["name"] for c in r["trace"] if c["type"] == "call"][:2] == ["search", "open"]
        assert [x["aspect"] for x in r["rubric"]] == ["coverage", "structure", "synthesis",
                                                      "citation"]
    # :runlocal goes on through `rossjax retrogen`: the gate, the paper's thresholds, SFT rows
    assert rep["retrogen"]["thresholds"] == retrogen.PAPER_THRESHOLDS
    assert rep["retrogen"]["kept"] == 6 and rep["retrogen"]["discarded"] == 0
    rg = json.load(open(tmp_path / "w" / "retrogen" / "report.json"))
    assert all(d["kept"] == d["scored"] == 2 and d["mean"] >= d["threshold"]
               for d in rg["domains"].values())
    rows = [json.loads(x) for x in open(rep["retrogen"]["rows"])]
    assert len(rows) == 6 and all(r["messages"][-1]["role"] == "assistant" for r in rows)
    again, _ = runlocal(tmp_path, "w")  # all journaled: nothing asked, nothing served
    assert again["resumed"] == 6 and again["requests"]["requests"] == 0


def test_forwardgen_under_the_standin_grounds_less_than_retrogen(tmp_path):
    rg, _ = runlocal(tmp_path, "rg")
    fw, _ = runlocal(tmp_path, "fw", "--config.method=forwardgen")
    assert fw["buckets"]["kept"] == 6
    mean = lambda rep: sum(d["grounding"] for d in rep["scores"].values()) / 3  # noqa: E731
    assert mean(fw) < mean(rg) == 1.0


def test_the_standin_judges_can_fail_a_draft():
    rules = Rules(os.path.join(ROOT, "data", "retrogen", "corpus.jsonl"))
    got = rules.answer("STAGE: verify_rubric\n1. (coverage) a\n2. (citation) b\n\n"
                       "ANSWER TO JUDGE:\n<<<\nRevenue rose.\n>>>")
    assert [v["verdict"] for v in got["verdicts"]] == ["missed", "missed"]
    ground = rules.answer("STAGE: verify_grounding\nEVIDENCE (the documents the claims may rest "
                          "on):\n[shipping-rates] t\nContract rates declined less than spot "
                          "rates.\n\nNOTES OF THE WORK:\n(no notes)\n\nFINAL ANSWER:\n<<<\n"
                          "Contract rates declined less than spot rates. [shipping-rates]\n"
                          "Spot rates doubled. [shipping-rates]\n>>>")
    assert [c["supported"] for c in ground["claims"]] == [True, False]


def test_the_standin_slips_like_a_sampling_model_only_above_temperature_zero():
    # at T > 0 a draft line misquotes its figure with probability T / 2, drawn from a hash of
    # the request (a rerun gives the same slips); at T = 0 (:runlocal) never
    from rossjax.reconstruct import standin

    reqs = [f"STAGE: step\nrequest {i}" for i in range(400)]
    assert not any(any(standin._slips(r, 0.0, 3)) for r in reqs)
    hot = [standin._slips(r, 0.7, 1)[0] for r in reqs]
    assert 0.25 < sum(hot) / len(hot) < 0.45 and hot == [standin._slips(r, 0.7, 1)[0] for r in reqs]
    assert standin._misquote("X melts at 1186 kelvin. [x-note]") == "X melts at 2186 kelvin. [x-note]"
    assert standin._misquote("X melts at 942 kelvin.") == "X melts at 842 kelvin."


def test_the_induced_task_names_no_citation_of_the_artifact():
    from rossjax.reconstruct.standin import induced_task

    task = induced_task("Kelvarite melts at 900 kelvin [kelvarite-note]. Kelvarite is cast.", "brief")
    assert "kelvarite" in task and "note" not in task and "900" not in task
