"""`rossjax retrogen`'s selection ablations (issue 38 item 2): next-N replace trains on the next
K traces by score in place of the K the threshold selects; a single-signal filter thresholds one
signal alone; the Artifact-Only rows are the selected rows with their process removed."""

import pytest

from rossjax.curate.retrogen import score_traces, to_rollouts
from rossjax.errors import ConfigError


def rec(i, dom, s, **scores):
    trace = [{"type": "call", "id": "c1", "name": "search", "arguments": {"query": "q"}},
             {"type": "observation", "call_id": "c1", "content": "hit", "ok": True},
             {"type": "note", "content": f"note {i}"}]
    return {"id": f"r{i}", "domain": dom, "task": "t", "evidence": ["d1: x"], "trace": trace,
            "draft": f"draft {i}", "scores": {k: scores.get(k, s) for k in
                                              ("rubric", "quality", "grounding", "consistency")}}


RECS = [rec(i, "finance", s) for i, s in enumerate((0.9, 0.8, 0.7, 0.45, 0.4, 0.35, 0.1))] + \
       [rec(10, "legal", 0.9), rec(11, "legal", 0.2)]


def ids(res):
    return [k["record"]["id"] for k in res.kept]


def test_next_n_replace_keeps_the_next_k_by_score_in_place_of_the_selected():
    th = score_traces(RECS, domain_thresholds={"finance": 0.6, "legal": 0.6})
    assert ids(th) == ["r0", "r1", "r2", "r10"]
    nn = score_traces(RECS, domain_thresholds={"finance": 0.6, "legal": 0.6},
                      selection="next_n_replace")
    assert ids(nn) == ["r3", "r4", "r5", "r11"]  # ranks 4-6 of finance, 2 of legal
    assert nn.report["finance"]["kept"] == nn.report["finance"]["selected"] == 3
    assert {d["id"] for d in nn.discarded if d["reason"] == "replaced_by_next_n"} == \
        {"r0", "r1", "r2", "r10"}
    assert len(nn.kept) + len(nn.discarded) == len(RECS)


def test_single_signal_filter_thresholds_one_signal_alone():
    recs = [rec(0, "x", 0.9, grounding=0.1), rec(1, "x", 0.1, grounding=0.9)]
    assert ids(score_traces(recs, threshold=0.5)) == ["r0"]  # Eq. 4: 0.7 and 0.3
    g = score_traces(recs, threshold=0.5, selection="signal:grounding")
    r = score_traces(recs, threshold=0.5, selection="signal:rubric")
    assert ids(g) == ["r1"] and ids(r) == ["r0"]
    assert g.kept[0]["score"] == 0.9
    with pytest.raises(ConfigError, match="config.selection 'signal:vibes' must be one of"):
        score_traces(recs, selection="signal:vibes")


def test_artifact_only_rows_are_the_selected_rows_without_their_process():
    th = score_traces(RECS, domain_thresholds={"finance": 0.6, "legal": 0.6})
    full = to_rollouts(th.kept, seed=0, react_prob=0.0)
    bare = to_rollouts(th.kept, seed=0, react_prob=0.0, artifact_only=True)
    assert [r["id"] for r in bare] == [r["id"] for r in full]
    for b in bare:
        text = "".join(m["content"] for m in b["messages"])
        assert "search" not in text and "note " not in text and "hit" not in text
        assert b["messages"][-1]["content"].startswith("draft")
