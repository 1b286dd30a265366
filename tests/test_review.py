"""rossjax.review against a real local chat-completions server (http.server in a thread).

The server answers from a script keyed on the rollout id it finds in the request: per id a list
of answers, consumed in order (the repair round gets the next one). An answer is a string (the
assistant text) or (status, body) for an HTTP error.
"""

import gzip
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from rossjax.templates import render_chat
from rossjax.curate.schema import iter_records
from rossjax.tokenizers import load_tokenizer
from rossjax.cli import review as review_cli
from rossjax.review import annotate, answers, client as client_mod, prompt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(REPO, "data", "rollouts", "sample.jsonl")


class Reviewer:
    """A scripted chat-completions server on 127.0.0.1 (port 0)."""

    def __init__(self, script, default=None):
        self.script = {k: list(v) for k, v in script.items()}
        self.default = default  # callable(id) -> answer, for ids not in the script
        self.requests = []  # (rollout id, request json)
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert self.path == "/v1/chat/completions", self.path
                text = body["messages"][1]["content"]
                rid = text.split("Rollout id: ", 1)[1].split("\n", 1)[0]
                with outer.lock:
                    outer.requests.append((rid, body))
                    todo = outer.script.get(rid)
                    ans = todo.pop(0) if todo else outer.default(rid)
                if isinstance(ans, tuple):
                    status, payload = ans
                    data = json.dumps(payload).encode()
                else:
                    status = 200
                    data = json.dumps({"id": "x", "object": "chat.completion", "choices": [
                        {"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": ans}}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _config(input_path, url, **kw):
    import importlib.util

    spec = importlib.util.spec_from_file_location("review_config", os.path.join(REPO, "configs", "review.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config()
    c.input = str(input_path)
    c.endpoint.base_url = url
    c.endpoint.model = "tiny-reviewer"
    c.endpoint.backoff_s = 0.01
    c.endpoint.concurrency = 4
    c.progress = False
    for k, v in kw.items():
        c[k] = v
    return c


def _stripped_sample(path):
    """data/rollouts/sample.jsonl with every annotation removed (bad lines kept as they are);
    returns the original annotations by id."""
    orig = {}
    with open(SAMPLE, encoding="utf-8") as f, open(path, "w", encoding="utf-8") as out:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                out.write(line)
                continue
            if isinstance(rec, dict) and "annotation" in rec:
                orig[rec["id"]] = rec.pop("annotation")
            out.write(json.dumps(rec) + "\n")
    return orig


def _math_row(rid="m1"):
    return {"id": rid, "task": {"id": "t", "domain": "math", "prompt": "Compute 7!/5!."},
            "messages": [{"role": "system", "content": "Be careful."},
                         {"role": "user", "content": "Compute 7!/5!."},
                         {"role": "assistant", "reasoning": "7! = 5040, 5! = 120, so 42.",
                          "content": "Since 7!/5! = 7 \\cdot 6 = 42, the answer is \\boxed{42}."}],
            "reward": 1.0, "verifier": {"name": "math", "passed": True, "evidence": "gold 42"}}


def _write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _read_reviewed(workdir):
    rep = json.load(open(os.path.join(workdir, "report.json")))
    out = []
    for o in rep["outputs"]:
        with gzip.open(os.path.join(workdir, o["path"]), "rt", encoding="utf-8") as f:
            out += [json.loads(line) for line in f]
    return rep, out


def _withheld(workdir):
    return {d["id"]: d for d in map(json.loads, open(os.path.join(workdir, "withheld.jsonl")))}


KEEP_OK = json.dumps({"status": "accept", "keep": [
    {"message": 2, "start": "Since 7!/5!", "end": "\\boxed{42}."}], "reason": "clean"})


# -- answers -------------------------------------------------------------------------------------

def test_extract_json_tolerates_fences_and_prose_but_not_two_objects():
    obj = {"status": "accept", "keep": [{"message": 2, "start": "a {b}", "end": "c"}]}
    s = json.dumps(obj)
    assert answers.extract_json(s) == obj
    assert answers.extract_json(f"Here you go:\n```json\n{s}\n```\nDone.") == obj
    assert answers.extract_json(f"<think>maybe {{no}}</think>Sure: {s} -- hope it helps") == obj
    for bad in ("", "no json here", "[1, 2]", s + " and also " + json.dumps({"status": "drop"})):
        with pytest.raises(answers.Unparseable):
            answers.extract_json(bad)


def test_review_mode_and_prompt_show_numbered_parts():
    tok = load_tokenizer("qwen")
    rows = [r.record for r in iter_records(SAMPLE) if r.record is not None]
    code = next(r for r in rows if r["id"] == "code-fib-s23-r0")
    math = next(r for r in rows if r["id"] == "math-2-s12-r0")
    assert prompt.review_mode(code) == "exclude" and prompt.review_mode(math) == "keep"
    assert prompt.review_mode(code, "keep") == "keep"
    msgs = prompt.build_messages(code, render_chat(code["messages"], "chatml", tok), "exclude")
    user = msgs[1]["content"]
    assert "Rollout id: code-fib-s23-r0" in user and "EXCLUDE mode" in user
    # the line the sample's exclusion quotes, with its 1-based number, under message 2
    after = user.split("[message 2] assistant", 1)[1]
    assert "  2 | rm -rf /tmp/work && mkdir /tmp/work  # clean slate" in after
    assert " tool_calls:\n" in after and " reasoning:\n" in after


# -- client --------------------------------------------------------------------------------------

def test_client_retries_5xx_then_succeeds_and_400_is_one_clear_error(tmp_path):
    with Reviewer({"a": [(500, {"error": {"message": "overloaded"}}), "fine"],
                   "b": [(400, {"error": {"message": "prompt is too long"}})]}) as srv:
        c = client_mod.ReviewerClient(srv.url, "tiny", backoff_s=0.01)
        assert c.complete([{"role": "system", "content": ""},
                           {"role": "user", "content": "Rollout id: a\n"}]) == "fine"
        assert [r for r, _ in srv.requests] == ["a", "a"] and c.stats["retries"] == 1
        with pytest.raises(client_mod.ReviewerError) as e:
            c.complete([{"role": "system", "content": ""}, {"role": "user", "content": "Rollout id: b\n"}])
    msg = str(e.value)
    assert e.value.status == 400 and srv.url + "/chat/completions" in msg
    assert "HTTP 400" in msg and "prompt is too long" in msg and "\n" not in msg


def test_client_malformed_response_is_a_clear_error():
    with Reviewer({"a": [(200, {"choices": []})]}) as srv:
        c = client_mod.ReviewerClient(srv.url, "tiny", backoff_s=0.01)
        with pytest.raises(client_mod.ReviewerError, match="not a chat completion") as e:
            c.complete([{"role": "system", "content": ""}, {"role": "user", "content": "Rollout id: a\n"}])
    assert srv.url in str(e.value)


# -- pipeline ------------------------------------------------------------------------------------

def test_keep_repair_garbage_drop_and_retry(tmp_path):
    rows = [_math_row(r) for r in ("ok", "fix", "junk", "drop", "flaky")]
    bad = json.dumps({"status": "revise", "keep": [
        {"message": 2, "start": "Since 7!/5!", "end": "\\boxed{41}."}]})
    script = {"ok": [KEEP_OK], "fix": [bad, "```json\n" + KEEP_OK + "\n```"],
              "junk": ["I think this rollout is fine!"],
              "drop": ['{"status": "drop", "reason": "lucky guess"}'],
              "flaky": [(503, {"error": "busy"}), KEEP_OK]}
    inp = _write(tmp_path / "in.jsonl", rows)
    with Reviewer(script) as srv:
        rep = annotate.review(_config(inp, srv.url), str(tmp_path / "out"))
    assert rep["input_rows"] == 5
    assert rep["buckets"] == {"kept": 3, "withheld": 2, "invalid": 0}
    assert rep["reasons"]["withheld"] == {"reviewer_drop": 1, "reviewer_unparseable": 1}
    assert rep["attempts"] == {"1": 4, "2": 1}
    _, out = _read_reviewed(tmp_path / "out")
    by = {r["id"]: r for r in out}
    assert set(by) == {"ok", "fix", "flaky"}
    assert by["ok"]["annotation"] == {"status": "accept", "keep": json.loads(KEEP_OK)["keep"]}
    assert by["ok"]["review"]["attempts"] == 1 and by["ok"]["review"]["reason"] == "clean"
    assert by["ok"]["review"]["model"] == "tiny-reviewer"
    assert by["ok"]["review"]["prompt_version"] == prompt.PROMPT_VERSION
    assert by["fix"]["review"]["attempts"] == 2
    # the repair request carries the reviewer's answer and the exact curate error sentence
    fix = [b for r, b in srv.requests if r == "fix"]
    assert len(fix) == 2
    err = "keep[0].end '\\\\boxed{41}.' does not occur in message 2"
    assert fix[1]["messages"][-2] == {"role": "assistant", "content": bad}
    assert err in fix[1]["messages"][-1]["content"] and err not in json.dumps(fix[0]["messages"])
    assert [r for r, _ in srv.requests].count("flaky") == 2
    assert rep["requests"]["retries"] == 1
    wh = _withheld(tmp_path / "out")
    assert "lucky guess" in wh["drop"]["detail"]


def test_unfixed_anchor_is_withheld_with_curate_code(tmp_path):
    bad = json.dumps({"status": "revise", "keep": [
        {"message": 2, "start": "42", "end": "\\boxed{42}."}]})  # "42" occurs 3 times
    inp = _write(tmp_path / "in.jsonl", [_math_row("amb")])
    with Reviewer({"amb": [bad, bad, bad]}) as srv:
        rep = annotate.review(_config(inp, srv.url, max_repairs=1), str(tmp_path / "out"))
    assert len(srv.requests) == 2
    assert rep["reasons"]["withheld"] == {"anchor_ambiguous": 1}
    assert "after 2 reviewer answer(s)" in _withheld(tmp_path / "out")["amb"]["detail"]


def test_setup_refusal_stops_the_run_with_one_sentence(tmp_path):
    inp = _write(tmp_path / "in.jsonl", [_math_row("a")])
    with Reviewer({"a": [(404, {"error": {"message": "model tiny-reviewer not found"}})]}) as srv:
        with pytest.raises(ValueError, match=r"refused the request with HTTP 404: model"):
            annotate.review(_config(inp, srv.url), str(tmp_path / "out"))


def test_one_refused_row_is_withheld_and_the_run_goes_on(tmp_path):
    inp = _write(tmp_path / "in.jsonl", [_math_row("long"), _math_row("ok")])
    with Reviewer({"long": [(400, {"error": {"message": "maximum context length exceeded"}})],
                   "ok": [KEEP_OK]}) as srv:
        rep = annotate.review(_config(inp, srv.url), str(tmp_path / "out"))
    assert rep["buckets"] == {"kept": 1, "withheld": 1, "invalid": 0}
    detail = _withheld(tmp_path / "out")["long"]["detail"]
    assert "HTTP 400" in detail and "maximum context length" in detail and srv.url in detail


def test_annotated_rows_pass_through_unless_overwrite(tmp_path):
    pre = {"status": "revise", "keep": [{"message": 2, "start": "7 \\cdot 6", "end": "42,"}]}
    failed = {**_math_row("bad"), "verifier": {"name": "math", "passed": False}}
    inp = _write(tmp_path / "in.jsonl", [{**_math_row("pre"), "annotation": pre}, failed])
    with Reviewer({"pre": [KEEP_OK]}) as srv:
        rep = annotate.review(_config(inp, srv.url), str(tmp_path / "a"))
        assert srv.requests == []
        assert rep["kept_by"] == {"reviewed": 0, "passed_through": 1}
        assert rep["reasons"]["withheld"] == {"not_verifier_positive": 1}
        assert _read_reviewed(tmp_path / "a")[1][0]["annotation"] == pre
        rep = annotate.review(_config(inp, srv.url, overwrite=True), str(tmp_path / "b"))
        assert [r for r, _ in srv.requests] == ["pre"] and rep["kept_by"]["reviewed"] == 1
        assert _read_reviewed(tmp_path / "b")[1][0]["annotation"]["status"] == "accept"


def test_resume_from_cache_asks_nothing(tmp_path):
    rows = [_math_row(f"r{k}") for k in range(6)]
    inp = _write(tmp_path / "in.jsonl", rows)
    cache = str(tmp_path / "cache")
    with Reviewer({}, default=lambda rid: KEEP_OK) as srv:
        rep1 = annotate.review(_config(inp, srv.url, cache_dir=cache), str(tmp_path / "a"))
        n1 = len(srv.requests)
        rep2 = annotate.review(_config(inp, srv.url, cache_dir=cache), str(tmp_path / "b"))
    assert n1 == 6 and len(srv.requests) == 6  # the second run made zero HTTP requests
    assert rep2["requests"] == {"requests": 0, "retries": 0, "cache_hits": 6}
    assert _read_reviewed(tmp_path / "a")[1] == _read_reviewed(tmp_path / "b")[1]
    assert rep1["buckets"] == rep2["buckets"] == {"kept": 6, "withheld": 0, "invalid": 0}


def _sample_reviewer(orig):
    """Answers each sample row with its shipped annotation; rows whose shipped annotation does
    not compile get a corrected one in the repair round."""
    fixed = {
        # ambiguous "42" -> a unique start anchor
        "math-2-s50-r4": {"status": "accept", "keep": [
            {"message": 2, "start": "Since 7!/5!", "end": "\\boxed{42}."}]},
        # the last exclusion touches the protected "Here is the solution:" -> drop it
        "code-add_pair-s51-r5": {**orig["code-add_pair-s51-r5"],
                                 "exclude": orig["code-add_pair-s51-r5"]["exclude"][:2]},
        # row 22: the keep points at message 5 of 3
        "math-8-s55-r9": {"status": "accept", "keep": [
            {"message": 2, "start": "A hexagon has", "end": "\\boxed{720}."}]},
    }
    script = {rid: [json.dumps(a)] for rid, a in orig.items()}
    for rid, a in fixed.items():
        script[rid].append("Corrected:\n```json\n" + json.dumps(a) + "\n```")
    # the unannotated positive row, and row 22 whose annotation points at a missing message
    script["math-12-s22-r0"] = [json.dumps({"status": "accept", "keep": [
        {"message": 2, "start": "We have", "end": "\\boxed{15}."}]})]
    return script


def _reference_loss(record, input_ids, tok):
    """The loss mask the reviewer's spans select, the slow obvious way: per token its character
    range in the rendered text; supervised iff it overlaps an assistant part and (keep) a kept
    span / (exclude) no excluded quote."""
    r = render_chat(record["messages"], "chatml", tok)
    text = r.text
    raw = text.encode("utf-8")
    bounds, b = [], 0
    for t in input_ids:
        n = len(tok.token_bytes(int(t)))
        bounds.append((len(raw[:b].decode("utf-8", "ignore")), len(raw[:b + n].decode("utf-8", "ignore"))))
        b += n
    assistant = [(p.start, p.end) for p in r.parts if p.role == "assistant"]
    ann = record["annotation"]
    spans = []
    for k in ann.get("keep") or []:
        parts = [p for p in r.parts if p.message == k["message"]]
        lo, hi = min(p.start for p in parts), max(p.end for p in parts)
        s = text.index(k["start"], lo, hi)
        e = text.index(k["end"], lo, hi) + len(k["end"])
        spans.append((s, e))
        body_end = max(p.text_end for p in parts if p.kind != "end")
        if e >= body_end:  # kept through the last word: the end-of-turn marker is kept too
            spans += [(p.start, p.end) for p in parts if p.kind == "end"]
    excl = []
    for x in ann.get("exclude") or []:
        p = next(p for p in r.parts if p.message == x["message"] and p.kind == x.get("part", "content"))
        lines = text[p.text_start:p.text_end].split("\n")
        base = p.text_start + sum(len(line) + 1 for line in lines[:x["line"] - 1])
        col = lines[x["line"] - 1].index(x["quote"])
        excl.append((base + col, base + col + len(x["quote"])))

    def hits(s, e, ivs):
        return any(a < e and s < b for a, b in ivs)

    out = []
    for s, e in bounds:
        sup = hits(s, e, assistant)
        if ann.get("keep"):
            sup = sup and hits(s, e, spans)
        out.append(sup and not hits(s, e, excl))
    return np.array(out, np.uint8)


def test_sample_review_then_curate_end_to_end(tmp_path, capsys):
    """The shipped sample with annotations stripped -> `rossjax review` (CLI main) -> `rossjax
    curate`: accounting adds up, and every row the review kept compiles in curate with the
    non-empty loss mask the reviewer's spans select."""
    from rossjax.curate import pipeline

    inp = tmp_path / "stripped.jsonl"
    orig = _stripped_sample(inp)
    work = tmp_path / "rev"
    with Reviewer(_sample_reviewer(orig)) as srv:
        assert review_cli.main([f"--config={REPO}/configs/review.py", f"--workdir={work}",
                         f"--config.input={inp}", f"--config.endpoint.base_url={srv.url}",
                         "--config.endpoint.model=tiny-reviewer", "--config.endpoint.backoff_s=0.01",
                         "--config.progress=False"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("rossjax review: 30 rows: 23 kept")
    rep, out = _read_reviewed(work)
    assert rep["input_rows"] == 30 == sum(rep["buckets"].values())
    assert rep["buckets"] == {"kept": 23, "withheld": 5, "invalid": 2}
    # math-6-s53-r7 stores token_ids of another template: no annotation can make it compile,
    # so it is withheld with curate's code before the reviewer is asked
    assert rep["reasons"] == {"withheld": {"not_verifier_positive": 3, "reviewer_drop": 1,
                                           "token_mismatch": 1},
                              "invalid": {"invalid_record": 2}}
    assert rep["modes"] == {"exclude": 8, "keep": 16}
    # math-2-s50-r4 (ambiguous), code-add_pair-s51-r5 (protected), math-8-s55-r9 (row 22:
    # message 5 does not exist) took a repair round
    assert rep["attempts"] == {"1": 21, "2": 3}
    assert len(srv.requests) == 27 and "math-6-s53-r7" not in {r for r, _ in srv.requests}
    repaired = {r["id"] for r in out if r["review"]["attempts"] == 2}
    assert repaired == {"math-2-s50-r4", "code-add_pair-s51-r5", "math-8-s55-r9"}
    wrong_msg = [b for r, b in srv.requests if r == "math-8-s55-r9"][1]["messages"][-1]["content"]
    assert "annotation.keep[0].message 5 points at a message that does not exist" in wrong_msg

    cur = tmp_path / "cur"
    assert pipeline.main([f"--config={REPO}/configs/curate.py", f"--config.input={work / rep['outputs'][0]['path']}",
                          f"--config.output={cur}", "--config.verify=stored",
                          "--config.unverified=keep", "--config.progress=False"]) == 0
    crep = json.load(open(cur / "report.json"))
    assert crep["buckets"] == {"kept": 23, "withheld": 0, "invalid": 0}
    tok = load_tokenizer("qwen")
    by = {r["id"]: r for r in out}
    compiled = list(pipeline.read_compiled(str(cur)))
    assert sorted(ex["id"] for ex in compiled) == sorted(by)
    for ex in compiled:
        loss = np.asarray(ex["loss_mask"])
        assert loss.sum() > 0, ex["id"]
        np.testing.assert_array_equal(loss, _reference_loss(by[ex["id"]], ex["input_ids"], tok),
                                      err_msg=ex["id"])


def test_review_imports_without_jax():
    code = ("import sys, importlib, pkgutil, rossjax.review as r\n"
            "for m in pkgutil.iter_modules(r.__path__): importlib.import_module('rossjax.review.' + m.name)\n"
            "[getattr(r, n) for n in r.__all__]\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'flax')]\n"
            "assert not bad, bad\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
