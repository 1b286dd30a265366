"""RetroGen: structural gate, weighted score, per-domain thresholds, serialization forms."""

import copy
import json

import numpy as np
import pytest

from rossjax.curate.retrogen import (
    SIGNALS,
    format_report,
    gate,
    pick_form,
    run,
    score_traces,
    serialize,
    to_rollouts,
)

SAMPLE = "data/retrogen/sample.jsonl"


@pytest.fixture(scope="module")
def records():
    return [json.loads(line) for line in open(SAMPLE)]


def test_gate_reasons_on_sample(records):
    reasons = {r["id"]: (gate(r) or ("ok",))[0] for r in records}
    assert reasons["rg-finance-1"] == "malformed_call"          # arguments JSON is cut off
    assert reasons["rg-health-1"] == "missing_observation"      # last call never answered
    assert reasons["rg-health-2"] == "failed_retrieval"         # ok: false, error 404
    assert reasons["rg-software-1"] == "missing_draft"
    assert reasons["rg-software-3"] == "invalid_score"          # NaN grounding score
    assert reasons["rg-software-4"] == "malformed_call"         # call without a name
    assert sum(v == "ok" for v in reasons.values()) == 18


def test_gate_more_cases(records):
    good = copy.deepcopy(records[0])
    assert gate(good) is None
    r = copy.deepcopy(good)
    r["trace"].insert(0, {"type": "observation", "content": "x"})
    assert gate(r)[0] == "orphan_observation"
    r = copy.deepcopy(good)
    r["trace"][2]["call_id"] = "zz"
    assert gate(r)[0] == "missing_observation"
    r = copy.deepcopy(good)
    r["trace"] = [t for t in r["trace"] if t["type"] == "note"]
    assert gate(r)[0] == "no_tool_calls"
    r = copy.deepcopy(good)
    r["scores"]["rubric"] = 1.5
    assert gate(r) == ("invalid_score", "scores.rubric is 1.5, not a finite number in [0, 1]")
    r = copy.deepcopy(good)
    r["scores"]["quality"] = float("inf")
    assert gate(r)[0] == "invalid_score"
    r = copy.deepcopy(good)
    r["trace"][1]["arguments"] = "[1, 2]"
    assert gate(r)[0] == "malformed_call"
    assert gate({"task": " "})[0] == "missing_task"
    assert gate([1])[0] == "bad_record"


def test_weighted_score_fixed_threshold(records):
    w = {"rubric": 0.4, "quality": 0.1, "grounding": 0.3, "consistency": 0.2}
    res = score_traces(records, w, threshold=0.6)
    ok = [r for r in records if gate(r) is None]
    want = {r["id"]: sum(w[k] * r["scores"][k] for k in SIGNALS) for r in ok}
    got = {k["record"]["id"]: k["score"] for k in res.kept}
    assert got == {i: s for i, s in want.items() if s >= 0.6}
    assert len(res.kept) + len(res.discarded) == len(records)
    below = [d for d in res.discarded if d["reason"] == "below_threshold"]
    assert {d["id"] for d in below} == {i for i, s in want.items() if s < 0.6}
    for dom, rep in res.report.items():
        s = np.array([want[r["id"]] for r in ok if r["domain"] == dom])
        assert rep["rows"] == sum(r["domain"] == dom for r in records)
        assert rep["scored"] == len(s) and rep["threshold"] == 0.6 and rep["threshold_mode"] == "fixed"
        np.testing.assert_allclose([rep["mean"], rep["median"], rep["p25"], rep["p75"]],
                                   [s.mean(), np.median(s), np.percentile(s, 25), np.percentile(s, 75)])
    assert res.report["health"]["gate_failed"] == {"failed_retrieval": 1, "missing_observation": 1}


def test_quantile_threshold_per_domain_and_override(records):
    res = score_traces(records, quantile=0.5, domain_thresholds={"software": 0.0})
    ok = [r for r in records if gate(r) is None]
    for dom in ("finance", "health"):
        s = np.array([np.mean([r["scores"][k] for k in SIGNALS]) for r in ok if r["domain"] == dom])
        rep = res.report[dom]
        assert rep["threshold"] == pytest.approx(np.quantile(s, 0.5))
        assert rep["threshold_mode"] == "quantile 0.5"
        assert rep["kept"] == int((s >= np.quantile(s, 0.5) - 1e-12).sum())
    assert res.report["software"]["threshold_mode"] == "fixed (domain)"
    assert res.report["software"]["kept"] == res.report["software"]["scored"]
    text = format_report(res.report)
    assert "finance" in text and "quantile 0.5" in text


def test_bad_config():
    with pytest.raises(ValueError, match="weights.rubric must be a finite non-negative"):
        score_traces([], {"rubric": float("nan"), "quality": 0, "grounding": 0, "consistency": 1})
    with pytest.raises(ValueError, match="weights must name exactly"):
        score_traces([], {"rubric": 1.0})
    with pytest.raises(ValueError, match="must not all be zero"):
        score_traces([], {k: 0.0 for k in SIGNALS})
    with pytest.raises(ValueError, match="quantile must be a number in"):
        score_traces([], quantile=1.5)
    with pytest.raises(ValueError, match="threshold must be finite"):
        score_traces([], threshold=float("nan"))
    assert score_traces([]).kept == []


def test_serialize_json_form(records):
    msgs = serialize(records[0], "json", system="You are a careful analyst.")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    # task, then its evidence (included by default)
    ev = "\n".join(f"- {e}" for e in records[0]["evidence"])
    assert msgs[1]["content"] == records[0]["task"] + "\n\nEvidence:\n" + ev
    first = msgs[2]["content"]
    # each tool call is followed by its note (the paper's order); before_call is the option
    assert first.startswith("<tool_call>\n") and first.endswith("\nI need sources about Acme for 2015.")
    before = serialize(records[0], "json", note_position="before_call", evidence_in_prompt=False)
    assert before[0]["content"] == records[0]["task"]
    assert before[1]["content"].startswith("I need sources") and before[1]["content"].endswith("</tool_call>")
    call = json.loads(first.split("<tool_call>\n")[1].split("\n</tool_call>")[0])
    assert call == {"name": "search", "arguments": {"query": records[0]["trace"][1]["arguments"]["query"]}}
    assert msgs[3]["content"].startswith("<tool_response>\n") and msgs[3]["content"].endswith("</tool_response>")
    call2 = json.loads(msgs[4]["content"].split("<tool_call>\n")[1].split("\n</tool_call>")[0])
    assert call2["arguments"] == json.loads(records[0]["trace"][4]["arguments"])   # string args parsed
    assert msgs[-1]["content"] == records[0]["draft"]


def test_serialize_react_and_artifact_only(records):
    msgs = serialize(records[0], "react")
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert msgs[1]["content"].splitlines() == [
        "Thought: I need sources about Acme for 2015.", "Action: search",
        'Action Input: {"query": "Acme 2015"}']
    assert msgs[2]["content"].startswith("Observation: Found:")
    assert msgs[-1]["content"].startswith("Final Answer: ")
    art = serialize(records[0], "react", artifact_only=True, evidence_in_prompt=True)
    assert [m["role"] for m in art] == ["user", "assistant"]
    assert "Evidence:\n- " in art[0]["content"]
    assert art[1]["content"] == records[0]["draft"]
    assert "tool_call" not in json.dumps(art) and "Action" not in json.dumps(art)
    with pytest.raises(ValueError, match="form must be one of"):
        serialize(records[0], "xml")


def test_form_choice_seeded_and_order_independent():
    ids = [f"t{i}" for i in range(400)]
    forms = [pick_form(i, 7, 0.3) for i in ids]
    assert forms == [pick_form(i, 7, 0.3) for i in ids]
    assert 0.22 < forms.count("react") / 400 < 0.38
    assert {pick_form(i, 7, 0.0) for i in ids} == {"json"}
    assert {pick_form(i, 7, 1.0) for i in ids} == {"react"}
    assert forms != [pick_form(i, 8, 0.3) for i in ids]


def test_rollouts_are_valid_records_that_compile(records):
    from rossjax.curate.masks import compile_rollout
    from rossjax.curate.schema import validate_record
    from rossjax.tokenizers import load_tokenizer

    res = score_traces(records, threshold=0.0)
    rows = to_rollouts(res.kept, seed=1, react_prob=0.5)
    assert len(rows) == 18
    assert {"json", "react"} == {r["verifier"]["evidence"].rsplit(" ", 1)[-1] for r in rows}
    tok = load_tokenizer("qwen")
    assistant = to_rollouts(res.kept, seed=1, react_prob=0.5, loss="assistant")
    for r, a in zip(rows[:6], assistant[:6]):
        assert validate_record(r) is None and r["loss_scope"] == "sequence"
        ex = compile_rollout(r, tok, template="chatml")
        assert ex.status == "kept", (ex.reason, getattr(ex, "detail", None))
        # Eq. 7: the whole serialized sample is supervised (task, evidence, observations too)
        assert ex.n_supervised == len(ex.input_ids) > ex.n_content
        ea = compile_rollout(a, tok, template="chatml")
        assert np.array_equal(ea.input_ids, ex.input_ids)
        assert 0 < ea.n_supervised < len(ea.input_ids)  # assistant-only
    with pytest.raises(ValueError, match="loss must be one of"):
        to_rollouts(res.kept, loss="everything")
    bad = dict(rows[0], loss_scope="everything")
    assert compile_rollout(bad, tok).reason == "invalid_record"
    rows_a = to_rollouts(res.kept, seed=1, react_prob=0.5, artifact_only=True)
    assert all(len(r["messages"]) == 2 for r in rows_a)


def test_run_writes_outputs(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("retrogen_cfg", "configs/retrogen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = mod.get_config("runlocal")
    cfg.output = str(tmp_path / "rg")
    res = run(cfg)
    rep = json.loads((tmp_path / "rg" / "report.json").read_text())
    kept = (tmp_path / "rg" / "retrogen.jsonl").read_text().splitlines()
    disc = (tmp_path / "rg" / "discarded.jsonl").read_text().splitlines()
    assert rep["rows"] == 24 and len(kept) == rep["kept"] == len(res.kept)
    assert len(kept) + len(disc) == 24
    assert set(rep["domains"]) == {"finance", "health", "software"}
    # finance has the paper's calibrated threshold; the sample's other domains are calibrated
    assert rep["domains"]["finance"]["threshold"] == 0.48
    assert rep["domains"]["finance"]["threshold_mode"] == "fixed (domain)"
    assert all(rep["domains"][d]["threshold_mode"] == "quantile 0.5" for d in ("health", "software"))
    assert rep["loss"] == "sequence"
    assert rep["discarded"] == {k: sum(json.loads(x)["reason"] == k for x in disc)
                                for k in rep["discarded"]}
    assert sum(rep["discarded"].values()) == len(disc)
    assert all(json.loads(x)["detail"].startswith("sample.jsonl row ") for x in disc)


def test_run_buckets_unreadable_lines_and_reads_gz(tmp_path, monkeypatch):
    """A line that is not JSON is discarded with its row, not the end of the run."""
    import gzip
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "configs", "retrogen.py")
    spec = importlib.util.spec_from_file_location("retrogen_cfg2", path)
    rcfg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rcfg)
    good = {"id": "g", "domain": "d", "task": "t", "draft": "answer",
            "trace": [{"type": "call", "id": "c", "name": "search", "arguments": {"q": 1}},
                      {"type": "observation", "call_id": "c", "content": "found"}],
            "scores": {k: 0.9 for k in ("rubric", "quality", "grounding", "consistency")}}
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(('{"id": 1}\n{not json\n\n' + json.dumps(good) + "\n").encode()))
    cfg = rcfg.get_config()
    cfg.input, cfg.output = str(bad), str(tmp_path / "out")
    res = run(cfg)
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["rows"] == 3 and rep["kept"] == 1 == len(res.kept)
    assert rep["discarded"] == {"invalid_json": 1, "missing_task": 1}
    disc = [json.loads(x) for x in (tmp_path / "out" / "discarded.jsonl").read_text().splitlines()]
    assert {d["row"]: d["reason"] for d in disc} == {1: "missing_task", 2: "invalid_json"}
    assert all(d["detail"].startswith("bad.jsonl.gz row ") for d in disc)

    # The default config is found from any working directory (not only the repo root).
    from rossjax.cli.retrogen import main

    monkeypatch.chdir(tmp_path)
    assert main([f"--config.input={bad}", f"--config.output={tmp_path / 'o2'}"]) == 0
    assert (tmp_path / "o2" / "report.json").exists()


def test_config_ships_the_paper_defaults():
    import importlib.util

    spec = importlib.util.spec_from_file_location("retrogen_cfg3", "configs/retrogen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config()
    assert dict(c.domain_thresholds) == {"science": 0.52, "finance": 0.48, "legal": 0.63}
    assert c.evidence_in_prompt is True and c.note_position == "after_call"
    assert c.loss == "sequence"
    res = score_traces([], domain_thresholds=dict(c.domain_thresholds))
    assert res.kept == []
