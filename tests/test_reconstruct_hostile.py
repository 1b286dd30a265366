"""Hostile model answers and artifacts against `rossjax reconstruct`: each ends its artifact
invalid with one sentence naming the artifact, the stage and the field, and the run goes on (a
crash would lose every other artifact's outcome)."""

import json
import os
import re

import pytest
from test_reconstruct import ARTS, adds_up, artifact_of, config, lines, serve, step_answer

from rossjax.reconstruct import run as rc_run

ONE = "sci-rw-1"


def one_artifact(tmp_path, art=None):
    path = tmp_path / "arts.jsonl"
    path.write_text(json.dumps(art or ARTS[ONE]) + "\n" + json.dumps(ARTS["fin-10k-1"]) + "\n")
    return str(path)


def run_with(tmp_path, over, art=None):
    with serve(over) as srv:
        rep = rc_run.run(config(srv.url, tmp_path, input=one_artifact(tmp_path, art)),
                         str(tmp_path / "rc"))
    adds_up(rep)
    assert rep["input_rows"] == 2 and rep["buckets"]["kept"] == 1  # the other artifact is kept
    (bad,) = lines(tmp_path / "rc" / "invalid.jsonl")
    assert bad["row"] == 1
    return bad


def _only_first(answer):
    return lambda b: answer(b) if artifact_of(b) == ONE else None


def test_a_grounding_source_with_a_non_ascii_digit_is_malformed_not_a_crash(tmp_path):
    # "²".isdigit() is True but int("²") raises: the check must name the field instead
    bad = run_with(tmp_path, {"verify_grounding": _only_first(lambda b: json.dumps(
        {"claims": [{"source": "note \u00b2", "supported": True, "evidence": None}]}))})
    assert bad["reason"] == "model_malformed"
    assert "(artifact sci-rw-1): verify_grounding answer: verify_grounding.claims[0].source " \
           "must be 'draft' or 'note K'" in bad["detail"]


def test_a_lone_surrogate_in_an_answer_field_is_malformed(tmp_path):
    def step(b):
        s = step_answer(b)
        if s["action"] == "draft":
            s["arguments"]["text"] = "a draft with half \ud800 a character"
        return json.dumps(s)  # ASCII JSON: the lone half arrives as the escape \ud800

    bad = run_with(tmp_path, {"step": _only_first(step)})
    assert bad["reason"] == "model_malformed"
    assert "(artifact sci-rw-1): step answer: step.arguments.text holds a lone UTF-16 " \
           "surrogate" in bad["detail"]


def test_a_lone_surrogate_in_the_raw_answer_text_is_unparseable(tmp_path):
    # the server's JSON body carries "\ud800" inside the answer text itself
    bad = run_with(tmp_path, {"verify_quality": _only_first(
        lambda b: '{"score": 4, "why": "half \ud800 a character"}')})
    assert bad["reason"] == "model_unparseable"
    assert "(artifact sci-rw-1): verify_quality answer: the answer holds a lone UTF-16 " \
           "surrogate" in bad["detail"]


@pytest.mark.parametrize("field", ["id", "text", "title"])
def test_an_artifact_with_a_lone_surrogate_is_invalid_naming_the_field(tmp_path, field):
    art = dict(ARTS[ONE])
    art[field] = art.get(field, "t") + "\ud800"
    bad = run_with(tmp_path, {}, art)
    assert bad["reason"] == "invalid_artifact"
    assert bad["detail"].startswith("arts.jsonl row 1")
    assert re.search(rf"\b{field}( '[^']*')? holds a lone UTF-16 surrogate", bad["detail"])


def test_a_corpus_document_with_a_lone_surrogate_is_never_sent_nor_written(tmp_path):
    from test_reconstruct import CORPUS

    docs = [json.loads(x) for x in open(CORPUS)]
    for d in docs:
        d["text"] += " half \ud800 a character"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    with serve() as srv:
        rep = rc_run.run(config(srv.url, tmp_path, input=one_artifact(tmp_path),
                                corpus=str(corpus)), str(tmp_path / "rc"))
    adds_up(rep)
    bad = lines(tmp_path / "rc" / "invalid.jsonl")
    assert [(b["row"], b["reason"]) for b in bad] == [(1, "unencodable_text"), (2, "unencodable_text")]
    assert "(artifact sci-rw-1): step: the request holds a lone UTF-16 surrogate" in bad[0]["detail"]


@pytest.mark.parametrize("over, says", [
    ({"search_k": 0}, "config.search_k must be >= 1, got 0"),
    ({"search_k": -2}, "config.search_k must be >= 1, got -2"),  # ran, slicing hits [:-2]
    ({"max_answer_chars": 0}, "config.max_answer_chars must be >= 1"),
    ({"min_artifact_chars": 0}, "config.min_artifact_chars must be >= 1"),
    ({"min_artifact_chars": 500, "max_artifact_chars": 100},
     r"config.max_artifact_chars \(100\) < config.min_artifact_chars \(500\)"),
    ({"leak.max_task_chars": 0}, "config.leak.max_task_chars must be >= 1"),
    ({"endpoint.max_tokens": 0}, "config.endpoint.max_tokens must be >= 1"),
])
def test_config_values_that_would_fail_every_artifact_are_refused_first(tmp_path, over, says):
    from rossjax.errors import ConfigError

    with pytest.raises(ConfigError, match=says):
        rc_run.run(config("http://127.0.0.1:9/v1", tmp_path, **over), str(tmp_path / "rc"))
    assert not os.path.exists(tmp_path / "rc")  # refused before anything is written


def test_an_entry_longer_than_the_window_is_shown_cut_not_dropped():
    # a compare over 5 documents returns up to 5 x 2,000 characters: more than the 8,000 window
    from rossjax.reconstruct.trace import window

    big = "\n\n".join(f"[d{i}]\n" + "z" * 1990 for i in range(5))
    trace = [{"type": "call", "id": "c1", "name": "compare", "arguments": {"ids": ["d0"]}},
             {"type": "observation", "call_id": "c1", "content": big, "ok": True}]
    w = window(trace, 8000)
    assert "[2] observation: [d0]" in w  # the model sees the newest observation's start
    assert "characters of this entry are cut: it is longer than the window" in w
    assert len(w) <= 8000 + 200
    assert window(trace[:1], 8000).startswith("[1] call compare")  # a fitting entry is whole


def test_a_second_run_on_a_workdir_in_use_is_refused_and_touches_nothing(tmp_path):
    from rossjax import runlock

    work = tmp_path / "rc"
    held = runlock.acquire(str(work), "rossjax reconstruct")  # a first run, still going
    (work / "journal.jsonl").write_text('{"fingerprint": "theirs"}\n')
    try:
        with pytest.raises(runlock.LockHeld, match="is in use by `rossjax reconstruct`"):
            rc_run.run(config("http://127.0.0.1:9/v1", tmp_path), str(work))
        assert (work / "journal.jsonl").read_text() == '{"fingerprint": "theirs"}\n'
    finally:
        held.release()
    with serve() as srv:  # once it ended, a run goes ahead (and releases the folder after)
        rep = rc_run.run(config(srv.url, tmp_path, input=one_artifact(tmp_path)), str(work))
    assert rep["buckets"]["kept"] == 2
    runlock.acquire(str(work), "check").release()
