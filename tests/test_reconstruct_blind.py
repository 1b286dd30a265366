"""RetroGen's agent never sees the expert artifact y* (issue 38 item 1; the paper, App. A.1 and
C): every request of the execution stages (plan, every step, the last of which writes the draft)
is recorded by the scripted loopback server and checked for any 8-word span of y* (less the
spans y* shares with a corpus document: those reach the agent through its own observations,
as the evidence they are); the stages
that may read y* (cues, task induction, the quality judge) do carry it, so the check can see
one. Consistency of an empty trace is no free point."""

import json
import re

import pytest
from test_reconstruct import ARTS, DOCS, config, lines, serve

from rossjax.reconstruct import run as rc_run, verify

EXECUTION = ("plan", "step")


def spans(text: str, n: int = 8) -> set:
    w = re.findall(r"\w+", text.lower())
    return {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)}


CORPUS_SPANS = set().union(*(spans(f"{d.get('title', '')}\n{d['text']}") for d in DOCS.values()))


def carries(body: dict, art_spans: set) -> bool:
    return bool(spans("\n".join(m["content"] for m in body["messages"])) & art_spans)


@pytest.mark.parametrize("method", ["retrogen", "forwardgen"])
def test_no_execution_request_carries_an_8_word_span_of_the_artifact(tmp_path, method):
    with serve() as srv:
        rep = rc_run.run(config(srv.url, tmp_path, method=method), str(tmp_path / "w"))
        assert rep["buckets"]["kept"] == 6
        for rid, art in ARTS.items():
            s = spans(art["text"]) - CORPUS_SPANS
            assert len(s) > 100
            execution = [b for st in EXECUTION for b in srv.bodies(rid, st)]
            assert len(execution) >= 7  # a plan and the steps up to the draft
            assert not [b for b in execution if carries(b, s)], rid
            # the check can fail: induction and the quality judge read y*
            assert all(carries(b, s) for st in ("task", "verify_quality")
                       for b in srv.bodies(rid, st))
    shown_evidence = method == "retrogen"
    recs = lines(tmp_path / "w" / "trajectories.jsonl")
    assert all(r["trace"] and r["draft"] for r in recs)
    with serve() as srv:  # Ê's titles go to the RetroGen agent only
        rc_run.run(config(srv.url, tmp_path, method=method), str(tmp_path / "w2"))
        steps = srv.bodies(stage="step")
    assert all(("Corpus documents retrieved" in b["messages"][1]["content"]) == shown_evidence
               for b in steps)


def test_consistency_of_an_empty_trace_is_not_a_free_point():
    class Asker:
        def ask(self, stage, msgs, check):
            return check({"references": []})

    score, detail = verify.consistency(Asker(), ARTS["fin-10k-1"], "t", [], "a draft")
    assert score == 0.0 and detail == {"references": 0, "consistent": 0}


def test_side_context_feeds_induction_only(tmp_path):
    one = tmp_path / "one.jsonl"
    marker = "Abstract: the side context of this filing, quoted here as an xyzzy marker."
    one.write_text(json.dumps({**ARTS["fin-10k-1"], "context": marker}) + "\n")
    with serve() as srv:
        rep = rc_run.run(config(srv.url, tmp_path, input=str(one)), str(tmp_path / "w"))
        seen = {st for _, st, b, _ in srv.requests if "xyzzy marker" in json.dumps(b)}
    assert rep["buckets"]["kept"] == 1 and seen == {"rubric", "task"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**ARTS["fin-10k-1"], "context": 3}) + "\n")
    with serve() as srv:
        rep = rc_run.run(config(srv.url, tmp_path, input=str(bad)), str(tmp_path / "b"))
    assert "context must be a string when given" in \
        lines(tmp_path / "b" / "invalid.jsonl")[0]["detail"]
