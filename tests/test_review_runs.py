"""Whole rossjax.review runs: resume after a kill asks nothing twice, the official `openai`
client accepts every request shape the reviewer sends, transcripts, and the shipped sample
through review (CLI) then curate."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from review_server import Reviewer, as_json, stage_of
from test_review import (
    AUDIT_ERR,
    CLEAN,
    REPO,
    SPANS,
    WHOLE,
    config,
    math_row,
    propose,
    reviewed,
    write,
)
from test_review_agentic import AGENT, ERR_RM, LOC_OMIT, LOC_RM, OMIT, discovery, judge

from rossjax.review.run import run
from rossjax.review.transcripts import format_transcript, read_transcript

TESTS = os.path.dirname(os.path.abspath(__file__))


def _canon(body) -> str:
    return json.dumps(body, sort_keys=True)


def _staged(rid, body):
    """A reviewer that accepts every single-turn proposal as spans and audits clean."""
    return {"proposal": SPANS, "audit": CLEAN}[stage_of(body)]


def test_resume_after_kill_asks_nothing_twice(tmp_path):
    rows = [math_row(f"r{k}") for k in range(4)]  # 2 requests each
    inp = write(tmp_path / "in.jsonl", rows)
    cache, work = str(tmp_path / "cache"), str(tmp_path / "out")
    child = {}

    def kill_at_sixth(n, body):
        if n == 5 and "proc" in child and child["proc"].poll() is None:
            child["proc"].send_signal(signal.SIGKILL)  # mid-run, with the 6th request in flight
            child["killed_body"] = body
            return False
        return True

    with Reviewer(default=_staged, on_request=kill_at_sixth) as srv:
        code = (f"import sys; sys.path.insert(0, {TESTS!r})\n"
                "from test_review import config\nfrom rossjax.review.run import run\n"
                f"c = config({inp!r}, {srv.url!r}, cache_dir={cache!r})\n"
                "c.endpoint.concurrency = 1\nc.endpoint.max_retries = 0\n"
                f"run(c, {work!r})\n")
        child["proc"] = subprocess.Popen([sys.executable, "-c", code], cwd=REPO,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        child["proc"].communicate(timeout=300)
        assert child["proc"].returncode == -signal.SIGKILL and "killed_body" in child
        first = [_canon(b) for b in srv.answered]
        assert len(first) == 5 and not os.path.exists(os.path.join(work, "report.json"))
        n_first = len(srv.requests)
        rep = run(config(inp, srv.url, cache_dir=cache), work)
        second = [_canon(b) for _, _, b, _ in srv.requests[n_first:]]
    assert not set(first) & set(second)  # nothing answered before the kill is asked again
    assert len(second) == 3 and _canon(child["killed_body"]) in second
    assert rep["requests"]["cache_hits"] == 5 and rep["requests"]["requests"] == 3
    assert rep["buckets"] == {"kept": 4, "withheld": 0, "invalid": 0}
    assert rep["stages"]["proposal"]["cache_hits"] == 3 and rep["stages"]["audit"]["cache_hits"] == 2


def test_transcript_per_row_holds_every_request_and_answer(tmp_path, capsys):
    inp = write(tmp_path / "in.jsonl", [math_row("fix"), math_row("ok")])
    with Reviewer({"fix": [WHOLE, AUDIT_ERR, "not json", SPANS, CLEAN]}, default=_staged) as srv:
        run(config(inp, srv.url), str(tmp_path / "out"))
    t = read_transcript(str(tmp_path / "out"), "fix")
    assert t["status"] == "kept" and t["procedure"] == "single_turn"
    assert [e["stage"] for e in t["entries"]] == ["proposal", "audit", "repair", "repair", "audit"]
    assert [e["answer"] for e in t["entries"]] == [WHOLE, AUDIT_ERR, "not json", SPANS, CLEAN]
    assert t["entries"][2]["check"]["code"] == "reviewer_unparseable"
    bodies = srv.bodies("fix")
    assert [e["messages"] for e in t["entries"]] == [b["messages"] for b in bodies]
    assert all(e["usage"]["prompt_tokens"] > 0 for e in t["entries"])
    assert read_transcript(str(tmp_path / "out"), "nope") is None
    # `rossjax inspect` on the reviewed rollouts shows the transcript next to the mask
    from rossjax.cli import inspect as inspect_cli

    rep = json.load(open(tmp_path / "out" / "report.json"))
    shard = str(tmp_path / "out" / rep["outputs"][0]["path"])
    assert inspect_cli.main([shard, "--id", "fix", "--no-color",
                             "--out", str(tmp_path / "fix.html")]) == 0
    shown = capsys.readouterr().out
    assert "review transcript of fix (row 1, single_turn): kept" in shown
    assert "-- 3. repair" in shown and "failed check reviewer_unparseable" in shown
    assert shown.index("review transcript") > shown.index("fix")  # after the mask
    assert format_transcript(t).splitlines()[0] == "review transcript of fix (row 1, single_turn): kept"


def _every_shape(tmp_path):
    """Request bodies of a run that takes every path: proposal, retry, audit, repair, discovery
    (with a retry), localization, with extra_body fields and per-stage JSON schemas."""
    script = {
        "m": [propose("spans", [{"message": 2, "start": "Since 7!/5!", "end": "= 42."}]),
              WHOLE, AUDIT_ERR, SPANS, CLEAN],
        "fib": [discovery([judge(2, 0, operation="fail")], []),
                discovery([judge(2, 0, operation="fail"), judge(2, 1),
                           judge(5, 0, execution="fail"), judge(7, 0)], [ERR_RM, OMIT]),
                LOC_RM, LOC_OMIT],
    }
    inp = write(tmp_path / "in.jsonl", [math_row("m"), AGENT])
    extra = '{"seed": 3, "top_p": 0.95, "chat_template_kwargs": {"enable_thinking": false}}'
    with Reviewer(script) as srv:
        rep = run(config(inp, srv.url, **{"endpoint.extra_body": extra,
                                          "endpoint.response_format": "json_schema"}),
                  str(tmp_path / "out"))
    assert rep["buckets"]["kept"] == 2
    assert {s for _, s, _, _ in srv.requests} == {"proposal", "retry", "audit", "repair",
                                                  "discovery", "localization"}
    return [b for _, _, b, _ in srv.requests]


def test_official_openai_client_accepts_every_request_shape(tmp_path):
    openai = pytest.importorskip("openai")
    import pydantic
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
    from openai.types.shared_params import ResponseFormatJSONSchema

    bodies = _every_shape(tmp_path)
    messages_t = pydantic.TypeAdapter(list[ChatCompletionMessageParam])
    format_t = pydantic.TypeAdapter(ResponseFormatJSONSchema)
    for b in bodies:
        messages_t.validate_python(b["messages"])
        format_t.validate_python(b["response_format"])
    # replay each body through the official client: it must send exactly what we sent, and
    # parse what an OpenAI-compatible server answers
    with Reviewer(default=lambda rid, body: CLEAN) as srv:
        oc = openai.OpenAI(base_url=srv.url, api_key="sk-test", max_retries=0)
        typed = ("model", "messages", "temperature", "max_tokens", "response_format")
        for b in bodies:
            resp = oc.chat.completions.create(**{k: b[k] for k in typed},
                                              extra_body={k: v for k, v in b.items()
                                                          if k not in typed})
            assert isinstance(resp, ChatCompletion) and resp.choices[0].message.content == CLEAN
        assert [_canon(x) for x in srv.bodies()] == [_canon(b) for b in bodies]


def _sample_reviewer(orig, rows):
    """Staged answers that reproduce each shipped sample annotation: keep rows propose their
    keep spans; exclude rows report one error per exclusion (its message, call 0, operation)
    and localize it, the shipped protect regions going with the first finding."""
    by_id = {r["id"]: r for r in rows}

    def answer(rid, body):
        stage, ann = stage_of(body), orig.get(rid) or {}
        if stage == "proposal":
            keep = ann.get("keep")
            return propose("spans", keep) if keep else propose("whole")
        if stage == "audit":
            return CLEAN
        if stage == "discovery":
            text = body["messages"][-1]["content"]
            steps = [(m, n) for m, n in ((int(p.split()[1]), int(p.split()[2][1:]))
                     for p in text.split("rollout: ", 1)[1].split(". A step", 1)[0].split(", "))]
            bad = {s["message"] for s in ann.get("exclude") or []}
            calls = [judge(m, c, **({"operation": "fail"} if m in bad and c == 0 else {}))
                     for m, n in steps for c in range(n)]
            found = [{"kind": "error", "message": m, "call": 0, "axes": ["operation"],
                      "what": f"x{j}"} for m, _ in steps if m in bad
                     for j, s in enumerate(ann["exclude"]) if s["message"] == m]
            return discovery(calls, found, record=by_id[rid])
        if stage == "localization":
            what = body["messages"][-1]["content"].split("(operation): ", 1)[1].split("\n", 1)[0]
            j = int(what[1:])
            return as_json({"exclude": [ann["exclude"][j]],
                            "protect": ann.get("protect", []) if j == 0 else []})
        raise AssertionError(f"unexpected {stage} for {rid} ({by_id[rid]['id']})")

    return answer


def test_sample_review_then_curate_end_to_end(tmp_path, capsys):
    """The shipped sample, annotations stripped -> `rossjax review` (CLI) -> `rossjax curate`:
    accounting adds up, and the masks curate compiles from the reviewed rows equal those of
    the shipped annotations the scripted reviewer reproduced."""
    from rossjax.cli import curate as curate_cli, review as review_cli
    from rossjax.curate import read_compiled
    from rossjax.curate.masks import compile_rollout
    from rossjax.curate.schema import iter_records
    from rossjax.tokenizers import load_tokenizer

    sample = os.path.join(REPO, "data", "rollouts", "sample.jsonl")
    rows = [r.record for r in iter_records(sample) if r.record is not None]
    orig = {r["id"]: r["annotation"] for r in rows if "annotation" in r}
    # the three shipped annotations that do not compile (ambiguous, protected, no message 5)
    # are what a reviewer would have fixed: keep the rest
    tok = load_tokenizer("qwen")
    good = {rid for rid, r in ((r["id"], r) for r in rows) if rid in orig
            and compile_rollout(r, tok).status == "kept"}
    inp = tmp_path / "stripped.jsonl"
    with open(inp, "w") as f:
        for line in open(sample, encoding="utf-8"):
            try:
                rec = json.loads(line)
            except ValueError:
                f.write(line)
                continue
            if isinstance(rec, dict):
                rec.pop("annotation", None)
            f.write(json.dumps(rec) + "\n")
    work = tmp_path / "rev"
    t0 = time.perf_counter()
    with Reviewer(default=_sample_reviewer({k: v for k, v in orig.items() if k in good}, rows)) as srv:
        assert review_cli.main([f"--config={REPO}/configs/review.py", f"--workdir={work}",
                                f"--config.input={inp}", f"--config.endpoint.base_url={srv.url}",
                                "--config.endpoint.model=tiny-reviewer",
                                "--config.unverified=keep", "--config.progress=False"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rep, by = reviewed(work)
    assert rep["input_rows"] == 30 == sum(rep["buckets"].values())
    assert lines[0].startswith(f"rossjax review: 30 rows: {rep['buckets']['kept']} kept")
    assert lines[2].startswith("stages: proposal")
    assert rep["reasons"]["invalid"] == {"invalid_record": 2}
    assert set(rep["stages"]) == {"proposal", "audit", "discovery", "localization"}
    assert sum(s["requests"] for s in rep["stages"].values()) == len(srv.requests)
    # the 'next:' command review printed runs as printed (from another folder), plus settings
    nxt = next(ln for ln in lines if "next: rossjax curate" in ln).split("next: rossjax curate ")[1]
    printed = nxt.split()
    cur = work / "curated"
    assert f"--config.output={cur}" in printed
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert curate_cli.main([*printed, "--config.verify=stored", "--config.unverified=keep",
                                "--config.progress=False"]) == 0
    finally:
        os.chdir(here)
    crep = json.load(open(cur / "report.json"))
    assert crep["buckets"] == {"kept": rep["buckets"]["kept"], "withheld": 0, "invalid": 0}
    shipped = {r["id"]: r for r in rows}
    compiled = list(read_compiled(str(cur)))
    checked = 0
    for ex in compiled:
        loss = np.asarray(ex["loss_mask"])
        assert loss.sum() > 0, ex["id"]
        if ex["id"] in good:  # the reviewer reproduced the shipped annotation's mask
            want = compile_rollout(shipped[ex["id"]], tok)
            np.testing.assert_array_equal(loss, want.loss_mask, err_msg=ex["id"])
            checked += 1
    assert checked >= 15, checked
    assert time.perf_counter() - t0 < 120
