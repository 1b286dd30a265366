"""rossjax review --config.classify=True: excluded spans sampled by the stated protocol, labelled
by the scripted reviewer into the seven categories, counted per domain (report.json + PNG)."""

import json
import os

import pytest
from review_server import Reviewer, as_json
from test_review import SAMPLE, config, math_row, write

from rossjax import cli
from rossjax.review import classify
from rossjax.templates import render_chat


def _answer(rid, body):
    span = body["messages"][1]["content"].split("EXCLUDED SPAN:\n<<<", 1)[1].split(">>>", 1)[0]
    cat = "arithmetic_error" if any(ch.isdigit() for ch in span) else "irrelevant_content"
    return as_json({"category": cat, "reason": "because"})


def test_excluded_spans_are_the_unkept_content():
    rec = math_row(annotation={"status": "ok", "keep": [
        {"message": 2, "start": "Since 7!/5!", "end": "= 42."},
        {"message": 2, "start": "The answer is", "end": "\\boxed{42}."}]})
    r = render_chat(rec["messages"], "chatml", None)
    got = [r.text[s:e] for s, e in classify.excluded_spans(rec, r)]
    # the reasoning part and the wrong check line are left out; nothing kept is listed
    assert any("6 + 7 = 13" in g for g in got) and any("5040" in g for g in got)
    assert not any("\\boxed{42}" in g or "Since 7!/5!" in g for g in got)


def test_sampling_is_uniform_over_rows_first_and_seeded():
    rows = {"a": ("math", [(0, 1)] * 9), "b": ("math", [(0, 1)]), "c": ("math", [(0, 1)] * 2),
            "d": ("code", [(0, 1)] * 3), "e": ("code", [])}
    picks = classify.sample_spans(rows, 4, seed=0)
    math = [p for p in picks if rows[p[0]][0] == "math"]
    assert len(math) == 4 and {k for k, _, r in math if r == 0} == {"a", "b", "c"}
    assert [p for p in picks if p[0] == "d"] and len([p for p in picks if p[0] == "d"]) == 3
    assert picks == classify.sample_spans(rows, 4, seed=0)
    assert len({(k, j) for k, j, _ in picks}) == len(picks)  # no span twice


def test_classify_run_report_png_and_cache(tmp_path, capsys):
    seen = []

    def answer(rid, body):  # the very first answer names no category: asked again
        seen.append(rid)
        return as_json({"category": "typo", "reason": "x"}) if len(seen) == 1 else _answer(rid, body)

    with Reviewer(default=answer) as srv:
        cfg = config(SAMPLE, srv.url, classify=True, classify_per_domain=5)
        rep = classify.run(cfg, str(tmp_path))
        n_req = len(srv.requests)
        retries = [b["messages"][-1]["content"] for b in srv.bodies(stage="retry")]
    assert len(retries) == 1 and "'typo' is not one of" in retries[0]
    dom = rep["domains"]
    assert set(dom) == {"math", "code"}
    for d in dom.values():
        assert d["sampled"] == min(5, d["spans_total"]) and d["labelled"] == d["sampled"]
        assert sum(d["counts"].values()) == d["labelled"]
        assert abs(sum(d["shares"].values()) - 1.0) < 1e-12
        assert set(d["counts"]) == set(classify.CATEGORIES) and len(classify.CATEGORIES) == 7
    assert rep["rows"]["read"] == 30 and rep["rows"]["invalid"] == 3
    spans = [json.loads(x) for x in open(tmp_path / "classify" / "spans.jsonl")]
    assert len(spans) == sum(d["sampled"] for d in dom.values()) == n_req - 1
    assert {s["category"] for s in spans} <= set(classify.CATEGORIES)
    assert os.path.getsize(tmp_path / "classify" / "categories.png") > 1000
    # rerun: every answer from the cache but the one that failed its check (config.reask=failed)
    with Reviewer(default=_answer) as srv2:
        cfg.endpoint.base_url = srv2.url
        assert cli.main(["review", "--config=configs/review.py", f"--workdir={tmp_path}",
                         f"--config.input={SAMPLE}", f"--config.endpoint.base_url={srv2.url}",
                         "--config.endpoint.model=tiny-reviewer", "--config.classify=True",
                         "--config.classify_per_domain=5", "--config.progress=False"]) == 0
        assert len(srv2.requests) == 1
    assert "math:" in capsys.readouterr().out
    again = json.load(open(tmp_path / "classify" / "report.json"))
    assert again["domains"] == dom


def test_unlabelled_spans_are_counted_not_dropped_and_no_spans_is_an_error(tmp_path):
    with Reviewer(default=lambda rid, body: "no json here") as srv:
        rep = classify.run(config(SAMPLE, srv.url, classify=True, classify_per_domain=2,
                                  max_step_retries=1), str(tmp_path / "a"))
    for d in rep["domains"].values():
        assert d["labelled"] == 0 and d["unlabelled"] == {"reviewer_unparseable": d["sampled"]}
    src = write(tmp_path / "plain.jsonl", [math_row()])
    with pytest.raises(ValueError, match="no excluded content to classify"):
        classify.run(config(src, "http://127.0.0.1:9/v1", classify=True), str(tmp_path / "b"))
