"""rossjax.review: the client and the single-turn procedure against a scripted local
chat-completions server (tests/review_server.py); agentic, resume and end-to-end runs are in
test_review_agentic.py and test_review_runs.py."""

import gzip
import json
import os
import subprocess
import sys

import pytest
from review_server import Reviewer, as_json

from rossjax.curate.schema import iter_records, verifier_positive
from rossjax.review import answers, client as client_mod, prompts, render
from rossjax.review.run import run
from rossjax.templates import render_chat
from rossjax.tokenizers import load_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(REPO, "data", "rollouts", "sample.jsonl")


def config(input_path, url, **kw):
    import importlib.util

    spec = importlib.util.spec_from_file_location("review_config",
                                                  os.path.join(REPO, "configs", "review.py"))
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
        if "." in k:
            a, b = k.split(".")
            c[a][b] = v
        else:
            c[k] = v
    return c


def math_row(rid="m1", **kw):
    return {"id": rid, "task": {"id": "t", "domain": "math", "prompt": "Compute 7!/5!.",
                                "reference": "42"},
            "messages": [{"role": "system", "content": "Be careful."},
                         {"role": "user", "content": "Compute 7!/5!."},
                         {"role": "assistant", "reasoning": "7! = 5040, 5! = 120, so 42.",
                          "content": "Since 7!/5! = 7 \\cdot 6 = 42.\n"
                                     "Check: 6 + 7 = 13, wrong but harmless.\n"
                                     "The answer is \\boxed{42}."}],
            "reward": 1.0, "verifier": {"name": "math", "passed": True, "evidence": "gold 42"},
            **kw}


def write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def reviewed(workdir):
    rep = json.load(open(os.path.join(workdir, "report.json")))
    out = []
    for o in rep["outputs"]:
        with gzip.open(os.path.join(workdir, o["path"]), "rt", encoding="utf-8") as f:
            out += [json.loads(line) for line in f]
    return rep, {r["id"]: r for r in out}


def withheld(workdir):
    return {d["id"]: d for d in map(json.loads, open(os.path.join(workdir, "withheld.jsonl")))}


SPAN_A = {"message": 2, "start": "Since 7!/5!", "end": "= 42."}
SPAN_B = {"message": 2, "start": "The answer is", "end": "\\boxed{42}."}


def propose(decision, keep=(), left_out=None, risk=(), reason="", **extra):
    """A proposal answer with the paper's outputs, consistent with `decision` unless `extra`
    overrides a field; each keep span gets a reason unless it has one."""
    obj = {"decision": decision, "whole_clean": decision == "whole",
           "clean_solution": decision != "reject",
           "keep": [{"reason": f"kept part {j}", **k} for j, k in enumerate(keep)],
           "left_out": ("the wrong check" if decision == "spans" else "") if left_out is None
           else left_out, "risk": list(risk), "reason": reason, **extra}
    return as_json(obj)


SPANS = propose("spans", [SPAN_A, SPAN_B], reason="skip the bad check")
WHOLE = propose("whole", reason="all clean")
CLEAN = as_json({"verdict": "accept", "errors": []})
AUDIT_ERR = as_json({"verdict": "revise", "errors": [
    {"kind": "error", "quote": "6 + 7 = 13, wrong but harmless",
     "problem": "an irrelevant wrong check"}]})


# -- answers and prompts ---------------------------------------------------------------------

def test_extract_json_tolerates_fences_and_prose_but_not_two_objects():
    obj = {"decision": "spans", "keep": [{"message": 2, "start": "a {b}", "end": "c"}]}
    s = json.dumps(obj)
    assert answers.extract_json(s) == obj
    assert answers.extract_json(f"Here you go:\n```json\n{s}\n```\nDone.") == obj
    assert answers.extract_json(f"<think>maybe {{no}}</think>Sure: {s} -- hope it helps") == obj
    for bad in ("", "no json here", "[1, 2]", s + " and also " + json.dumps({"verdict": "x"})):
        with pytest.raises(answers.Unparseable):
            answers.extract_json(bad)


def test_review_mode_and_prompts_show_numbered_parts():
    tok = load_tokenizer("qwen")
    rows = [r.record for r in iter_records(SAMPLE) if r.record is not None]
    code = next(r for r in rows if r["id"] == "code-fib-s23-r0")
    math = next(r for r in rows if r["id"] == "math-2-s12-r0")
    assert render.review_mode(code) == "exclude" and render.review_mode(math) == "keep"
    assert render.review_mode(code, "keep") == "keep"
    msgs = prompts.discovery(code, render_chat(code["messages"], "chatml", tok), [(2, 1), (4, 1)])
    user = msgs[1]["content"]
    assert "Rollout id: code-fib-s23-r0" in user and "SEMANTIC ERROR DISCOVERY" in user
    assert "message 2 (1 call), message 4 (1 call)" in user
    after = user.split("[message 2] assistant", 1)[1]
    assert "  2 | rm -rf /tmp/work && mkdir /tmp/work  # clean slate" in after
    assert " tool_calls:\n" in after and " reasoning:\n" in after


def test_verifier_positive_is_one_definition():
    row = math_row()
    assert verifier_positive(row)
    assert not verifier_positive({**row, "verifier": {"name": "math", "passed": False}})
    undecided = {**row, "verifier": {"name": "math", "passed": None}}
    assert not verifier_positive(undecided) and verifier_positive(undecided, undecided="keep")
    bare = {k: v for k, v in row.items() if k != "verifier"}  # reward 1.0 is not a verdict
    assert not verifier_positive(bare) and verifier_positive(bare, unverified="keep")


# -- client ----------------------------------------------------------------------------------

def _ask(c, rid, **kw):
    return c.ask([{"role": "system", "content": ""}, {"role": "user", "content": f"Rollout id: {rid}\n"}],
                 **kw)


def test_client_retries_5xx_then_succeeds_and_400_is_one_clear_error():
    with Reviewer({"a": [(500, {"error": {"message": "overloaded"}}), "fine"],
                   "b": [(400, {"error": {"message": "prompt is too long"}})]}) as srv:
        c = client_mod.ReviewerClient(srv.url, "tiny", backoff_s=0.01)
        assert _ask(c, "a", stage="proposal").text == "fine"
        assert srv.stages() == ["?", "?"] and c.stats["proposal"]["retries"] == 1
        with pytest.raises(client_mod.ReviewerError) as e:
            _ask(c, "b")
    msg = str(e.value)
    assert e.value.status == 400 and srv.url + "/chat/completions" in msg
    assert "HTTP 400" in msg and "prompt is too long" in msg and "\n" not in msg


def test_client_malformed_response_is_a_clear_error():
    with Reviewer({"a": [(200, {"choices": []})]}) as srv:
        c = client_mod.ReviewerClient(srv.url, "tiny", backoff_s=0.01)
        with pytest.raises(client_mod.ReviewerError, match="not a chat completion") as e:
            _ask(c, "a")
    assert srv.url in str(e.value)


def test_client_env_key_url_extra_body_keepalive_and_cache(tmp_path, monkeypatch):
    with Reviewer(default=lambda rid, body: "ok " + rid) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
        extra = '{"seed": 7, "top_p": 0.9, "chat_template_kwargs": {"enable_thinking": false}}'
        c = client_mod.ReviewerClient(model="tiny", extra_body=extra, cache_dir=str(tmp_path))
        fmt = prompts.response_format("audit", "json_schema")
        replies = [_ask(c, f"r{k}", stage="audit", response_format=fmt) for k in range(5)]
        assert [r.text for r in replies] == [f"ok r{k}" for k in range(5)]
        assert len(srv.ports) == 1 and c.connections == 1  # one kept-alive connection
        body, headers = srv.requests[0][2], srv.requests[0][3]
        assert headers["Authorization"] == "Bearer sk-test-123"
        assert body["seed"] == 7 and body["top_p"] == 0.9
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["response_format"]["json_schema"]["schema"] == prompts.SCHEMAS["audit"]
        assert c.stats["audit"]["requests"] == 5 and c.stats["audit"]["completion_tokens"] > 0
        again = _ask(c, "r0", stage="audit", response_format=fmt)
        assert again.cached and again.text == "ok r0" and len(srv.requests) == 5
        entry = json.load(open(os.path.join(str(tmp_path), again.key[:2], again.key + ".json")))
        assert entry["request"] == body and entry["response"]["choices"][0]["message"]["content"] == "ok r0"
    with pytest.raises(ValueError, match="extra_body may not set model"):
        client_mod.ReviewerClient("http://x/v1", "tiny", extra_body={"model": "other"})


# -- single-turn procedure -------------------------------------------------------------------

def _run(tmp_path, rows, script, name="out", **kw):
    inp = write(tmp_path / f"{name}.jsonl", rows)
    with Reviewer(script) as srv:
        rep = run(config(inp, srv.url, **kw), str(tmp_path / name))
    return srv, rep


def test_accept_proposal_then_clean_audit(tmp_path):
    srv, rep = _run(tmp_path, [math_row("ok")], {"ok": [SPANS, CLEAN]})
    assert srv.stages() == ["proposal", "audit"]
    _, by = reviewed(tmp_path / "out")
    assert by["ok"]["annotation"] == {"status": "revise", "keep": [SPAN_A, SPAN_B]}
    info = by["ok"]["review"]
    assert info["procedure"] == "single_turn" and info["answers"] == 2 and info["repair_rounds"] == 0
    # the audit judges the exact selected text in order, not the proposal's summary
    audit = srv.bodies("ok", "audit")[0]["messages"][-1]["content"]
    assert "Since 7!/5! = 7 \\cdot 6 = 42.\n[...]\nThe answer is \\boxed{42}." in audit
    assert "wrong but harmless" not in audit and "skip the bad check" not in audit
    assert rep["stages"]["proposal"]["requests"] == 1 and rep["stages"]["audit"]["requests"] == 1
    assert rep["stages"]["audit"]["prompt_tokens"] > 0
    assert rep["requests"]["requests"] == 2 and rep["procedures"] == {"single_turn": 1}


def test_audit_finds_error_then_repair_succeeds(tmp_path):
    srv, rep = _run(tmp_path, [math_row("fix")], {"fix": [WHOLE, AUDIT_ERR, SPANS, CLEAN]})
    assert srv.stages() == ["proposal", "audit", "repair", "audit"]
    repair = srv.bodies("fix", "repair")[0]["messages"]
    assert repair[-2] == {"role": "assistant", "content": WHOLE}
    assert "an irrelevant wrong check" in repair[-1]["content"]
    assert "6 + 7 = 13, wrong but harmless" in repair[-1]["content"]
    # the first audit saw the whole response, the second only the repaired selection
    a1, a2 = (b["messages"][-1]["content"] for b in srv.bodies("fix", "audit"))
    assert "wrong but harmless" in a1 and "wrong but harmless" not in a2
    _, by = reviewed(tmp_path / "out")
    assert by["fix"]["annotation"]["keep"] == [SPAN_A, SPAN_B]
    assert by["fix"]["review"]["repair_rounds"] == 1
    assert rep["stages"]["repair"]["requests"] == 1


BAD_SPANS = propose("spans", [{"message": 2, "start": "Nope", "end": "x"}])
REPAIR_FAILS = {
    "errors": ([WHOLE, AUDIT_ERR, SPANS, AUDIT_ERR], "still finds errors after 1 repair round"),
    "reject": ([WHOLE, AUDIT_ERR, propose("reject", reason="no clean part")],
               "no clean part"),
    "unfixable": ([WHOLE, AUDIT_ERR, BAD_SPANS, BAD_SPANS], "'Nope' does not occur in message 2"),
}


@pytest.mark.parametrize("ending", sorted(REPAIR_FAILS))
def test_repair_fails_row_is_dropped(tmp_path, ending):
    script, why = REPAIR_FAILS[ending]
    srv, rep = _run(tmp_path, [math_row("d")], {"d": script}, max_repair_rounds=1,
                    max_step_retries=1)
    assert rep["buckets"] == {"kept": 0, "withheld": 1, "invalid": 0}
    assert rep["reasons"]["withheld"] == {"annotation_drop": 1}
    assert rep["stages"]["repair"]["withheld"] == {"annotation_drop": 1}
    assert len(srv.requests) == len(script)  # bounded: nothing asked after the last round
    assert why in withheld(tmp_path / "out")["d"]["detail"]



def test_audit_outcomes_accept_revise_drop_are_counted_and_a_drop_withholds(tmp_path):
    """The paper's three audit outcomes: accept keeps, revise goes to repair, drop ends the row
    as withheld with the audit's reason, asking nothing more; report.json counts each."""
    drop = as_json({"verdict": "drop", "errors": [], "reason": "the answer is right by luck"})
    srv, rep = _run(tmp_path, [math_row("ok"), math_row("fix"), math_row("d")],
                    {"ok": [SPANS, CLEAN], "fix": [WHOLE, AUDIT_ERR, SPANS, CLEAN],
                     "d": [WHOLE, drop]})
    assert rep["buckets"] == {"kept": 2, "withheld": 1, "invalid": 0}
    assert rep["reasons"]["withheld"] == {"audit_drop": 1}
    assert rep["stages"]["audit"]["withheld"] == {"audit_drop": 1}
    assert rep["outcomes"]["audit"] == {"accept": 2, "revise": 1, "drop": 1}
    assert rep["outcomes"]["localization"] == {"located": 0, "unresolved": 0}
    assert len(srv.bodies("d")) == 2  # proposal and audit: nothing asked after the drop
    w = withheld(tmp_path / "out")["d"]
    assert w["reason"] == "audit_drop" and "right by luck" in w["detail"]
    prompt = srv.bodies("d", "audit")[0]["messages"][-1]["content"]
    assert '"accept" | "revise" | "drop"' in prompt


def test_an_audit_of_a_repair_may_drop_and_a_drop_must_say_why(tmp_path):
    """revise -> repair -> drop: the repaired selection's audit drops the row (`audit_drop`,
    counted against the audit stage, its reason in withheld.jsonl, the errors it quotes kept as
    evidence only), with repair rounds left; a drop without a reason is asked again first."""
    late = as_json({"verdict": "drop", "reason": "the kept steps never derive 7 * 6",
                    "errors": [{"kind": "derivation", "quote": "7 \\cdot 6 = 42",
                                "problem": "no step shows where 7 * 6 comes from"}]})
    bare = as_json({"verdict": "drop", "errors": []})
    srv, rep = _run(tmp_path, [math_row("late"), math_row("bare")],
                    {"late": [WHOLE, AUDIT_ERR, SPANS, late],
                     "bare": [WHOLE, bare, as_json({"verdict": "drop", "errors": [],
                                                    "reason": "right by luck"})]},
                    max_repair_rounds=3)
    assert rep["buckets"] == {"kept": 0, "withheld": 2, "invalid": 0}
    assert rep["reasons"]["withheld"] == {"audit_drop": 2}
    assert rep["stages"]["audit"]["withheld"] == {"audit_drop": 2}
    assert rep["stages"]["repair"]["withheld"] == {}
    assert rep["outcomes"]["audit"] == {"accept": 0, "revise": 1, "drop": 2}
    assert srv.stages("late") == ["proposal", "audit", "repair", "audit"]  # 2 rounds unused
    assert srv.stages("bare") == ["proposal", "audit", "retry"]
    assert "is empty but verdict is drop" in srv.bodies("bare")[-1]["messages"][-1]["content"]
    assert rep["stages"]["audit"]["failed_checks"] == {"reviewer_malformed": 1}
    w = withheld(tmp_path / "out")
    assert w["late"]["reason"] == "audit_drop" and "never derive 7 * 6" in w["late"]["detail"]
    assert "right by luck" in w["bare"]["detail"]

def test_out_of_order_spans_and_missing_final_answer_are_asked_again(tmp_path):
    swapped = propose("spans", [SPAN_B, SPAN_A])
    no_answer = propose("spans", [SPAN_A])
    srv, rep = _run(tmp_path, [math_row("order"), math_row("final")],
                    {"order": [swapped, SPANS, CLEAN], "final": [no_answer, SPANS, CLEAN]})
    assert rep["buckets"]["kept"] == 2
    assert srv.stages("order") == srv.stages("final") == ["proposal", "retry", "audit"]
    retry = srv.bodies("order")[1]["messages"]
    assert retry[-2]["content"] == swapped
    assert "keep[1] starts before keep[0] ends" in retry[-1]["content"]
    retry = srv.bodies("final")[1]["messages"][-1]["content"]
    assert "does not contain the complete final answer '\\\\boxed{42}'" in retry
    assert rep["stages"]["proposal"]["failed_checks"] == {"anchor_order": 1,
                                                          "final_answer_missing": 1}


@pytest.mark.parametrize("answer,code", [
    ("I think this rollout is fine!", "reviewer_unparseable"),
    ({"content": '{"decision": "spans", "keep": [{"mess', "finish_reason": "length"},
     "reviewer_truncated"),
    (as_json({"decision": "spans", "keep": [{"message": "2", "start": 1, "end": None}]}),
     "reviewer_malformed"),
    (as_json({"decision": "maybe"}), "reviewer_malformed"),
    (as_json({"decision": "spans", "keep": "all of it"}), "reviewer_malformed"),
    ("{" + "x" * 60_000, "reviewer_oversized"),
    ({"content": None}, "reviewer_unparseable"),
])
def test_bad_answers_are_withheld_never_a_crash(tmp_path, answer, code):
    srv, rep = _run(tmp_path, [math_row("bad"), math_row("good")],
                    {"bad": [answer, answer], "good": [SPANS, CLEAN]}, max_step_retries=1)
    assert rep["buckets"] == {"kept": 1, "withheld": 1, "invalid": 0}
    assert rep["reasons"]["withheld"] == {code: 1}
    assert srv.stages("bad") == ["proposal", "retry"]
    assert "after 2 proposal answer(s)" in withheld(tmp_path / "out")["bad"]["detail"]


def test_rows_gating_bypass_and_pass_through(tmp_path):
    pre = {"status": "revise", "keep": [SPAN_A]}
    rows = [math_row("pre", annotation=pre),
            math_row("failed", verifier={"name": "math", "passed": False}),
            {k: v for k, v in math_row("reward_only").items() if k != "verifier"},
            math_row("if1", task={"id": "if", "domain": "ifeval", "prompt": "Answer in caps."})]
    srv, rep = _run(tmp_path, rows, {})  # if_bypass=True is the default (the paper's IF rule)
    assert srv.requests == []
    assert rep["kept_by"] == {"reviewed": 0, "passed_through": 1, "bypassed": 1}
    assert rep["reasons"]["withheld"] == {"unverified": 1, "verifier_failed": 1}
    _, by = reviewed(tmp_path / "out")
    assert by["pre"]["annotation"] == pre
    assert by["if1"]["annotation"] == {"status": "accept"}
    assert by["if1"]["review"]["bypass"] == "instruction_following"
    # without the IF rule the instruction-following row is reviewed like any other
    srv, rep = _run(tmp_path, rows[3:], {"if1": [WHOLE, CLEAN]}, name="b", if_bypass=False)
    assert srv.stages() == ["proposal", "audit"] and rep["kept_by"]["reviewed"] == 1


def test_setup_refusal_stops_the_run_and_one_refused_row_is_withheld(tmp_path):
    inp = write(tmp_path / "in.jsonl", [math_row("a")])
    with Reviewer({"a": [(404, {"error": {"message": "model tiny-reviewer not found"}})]}) as srv:
        with pytest.raises(ValueError, match=r"refused the request with HTTP 404: model"):
            run(config(inp, srv.url), str(tmp_path / "out"))
    srv, rep = _run(tmp_path, [math_row("long"), math_row("ok")],
                    {"long": [(400, {"error": {"message": "maximum context length exceeded"}})],
                     "ok": [SPANS, CLEAN]}, name="b", **{"endpoint.concurrency": 1})
    assert rep["buckets"] == {"kept": 1, "withheld": 1, "invalid": 0}
    detail = withheld(tmp_path / "b")["long"]["detail"]
    assert "HTTP 400" in detail and "maximum context length" in detail


def test_review_imports_without_jax():
    code = ("import sys, importlib, pkgutil, rossjax.review as r\n"
            "for m in pkgutil.iter_modules(r.__path__): importlib.import_module('rossjax.review.' + m.name)\n"
            "[getattr(r, n) for n in r.__all__]\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'flax')]\n"
            "assert not bad, bad\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# -- the paper's reviewer rules --------------------------------------------------------------

def test_prompts_state_the_papers_rules():
    tok = load_tokenizer("qwen")
    rec = math_row()
    r = render_chat(rec["messages"], "chatml", tok)
    prop = prompts.proposal(rec, r, "\\boxed{42}")[1]["content"]
    assert "Redundancy alone is not an error: a correct second check" in prop
    assert "self-contained" in prop and "dependencies present" in prop
    assert "derivation present" in prop and "needlessly repeated" not in prop
    for field in ('"whole_clean"', '"clean_solution"', '"left_out"', '"risk"', '"reason"'):
        assert field in prop
    assert ", ".join(prompts.RISKS) in prop
    audit = prompts.audit(rec, "selected")[1]["content"]
    assert '"dependency"' in audit and '"derivation"' in audit
    assert "Redundancy alone is not an error" in audit and "Do not judge what was left out" not in audit
    schema = prompts.SCHEMAS["proposal"]
    assert {"whole_clean", "clean_solution", "risk"} <= set(schema["required"])
    assert schema["properties"]["keep"]["items"]["required"] == ["message", "start", "end",
                                                                 "reason"]


@pytest.mark.parametrize("answer, detail", [
    (propose("spans", [SPAN_A, SPAN_B], whole_clean=None), "answer.whole_clean must be true or false"),
    (propose("whole", whole_clean=False),
     "answer.whole_clean is false but decision is whole"),
    (propose("reject", clean_solution=True),
     "answer.clean_solution is true but decision is reject"),
    (propose("spans", [SPAN_A, SPAN_B], left_out=""), "answer.left_out is empty but decision is spans"),
    (propose("spans", [SPAN_A, {**SPAN_B, "reason": ""}]), "keep[1].reason must be a non-empty"),
    (propose("spans", [SPAN_A, SPAN_B], risk=["sloppy"]), "answer.risk must be a list of tags"),
])
def test_proposal_outputs_are_checked_and_asked_again(tmp_path, answer, detail):
    srv, rep = _run(tmp_path, [math_row("p")], {"p": [answer, SPANS, CLEAN]})
    assert srv.stages() == ["proposal", "retry", "audit"] and rep["buckets"]["kept"] == 1
    assert detail in srv.bodies("p")[1]["messages"][-1]["content"]


def test_proposal_outputs_are_recorded_with_the_row(tmp_path):
    risky = propose("spans", [{**SPAN_A, "reason": "the derivation"}, SPAN_B],
                    left_out="the check 6 + 7 = 13 line, which is wrong",
                    risk=["unjustified_step", "calculation_error", "unjustified_step"])
    srv, rep = _run(tmp_path, [math_row("p"), math_row("w")],
                    {"p": [risky, CLEAN], "w": [WHOLE, CLEAN]})
    _, by = reviewed(tmp_path / "out")
    out = by["p"]["review"]["proposal"]
    assert out["whole_clean"] is False and out["clean_solution"] is True
    assert [sp["reason"] for sp in out["spans"]] == ["the derivation", "kept part 1"]
    assert out["left_out"] == "the check 6 + 7 = 13 line, which is wrong"
    assert out["risk"] == ["calculation_error", "unjustified_step"]
    assert by["p"]["annotation"] == {"status": "revise", "keep": [SPAN_A, SPAN_B]}  # curate's form
    assert by["w"]["review"]["proposal"]["whole_clean"] is True
    assert rep["risk_tags"] == {"calculation_error": 1, "unjustified_step": 1}


WRONG_KEPT = propose("spans", [{"message": 2, "start": "Since 7!/5!", "end": "\\boxed{42}."}])


def test_acceptance_check_refuses_a_revision_that_keeps_an_audited_error(tmp_path):
    srv, rep = _run(tmp_path, [math_row("a")],
                    {"a": [WHOLE, AUDIT_ERR, WRONG_KEPT, WHOLE, SPANS, CLEAN]})
    # the two revisions that still keep the audited line are refused without an audit
    assert srv.stages() == ["proposal", "audit", "repair", "retry", "retry", "audit"]
    msgs = [b["messages"][-1]["content"] for b in srv.bodies("a")]
    assert ("the selection still keeps '6 + 7 = 13, wrong but harmless', which the audit found "
            "wrong (an irrelevant wrong check): leave it out") in msgs[3]
    assert rep["stages"]["repair"]["failed_checks"] == {"audit_error_kept": 2}
    _, by = reviewed(tmp_path / "out")
    assert by["a"]["annotation"]["keep"] == [SPAN_A, SPAN_B]
    assert by["a"]["review"]["excluded_errors"] == ["6 + 7 = 13, wrong but harmless"]


@pytest.mark.parametrize("audit, kept", [
    # a missing dependency is fixed by keeping more, not by leaving text out
    ({"kind": "dependency", "quote": "The answer is", "problem": "uses 7!/5! unexplained"}, True),
    # an error quoted from text the audit was not shown (SPANS leaves the check line out) is not
    # confirmed: nothing to keep out, so the revision may keep that line
    ({"kind": "error", "quote": "6 + 7 = 13", "problem": "wrong"}, True),
    ({"kind": "error", "quote": "The answer is", "problem": "wrong"}, False),
])
def test_only_errors_found_in_the_audited_text_are_kept_out(tmp_path, audit, kept):
    err = as_json({"verdict": "revise", "errors": [audit]})
    srv, rep = _run(tmp_path, [math_row("d")], {"d": [SPANS, err, WHOLE, CLEAN]},
                    max_step_retries=0)
    assert rep["buckets"]["kept"] == int(kept)
    if not kept:
        assert srv.stages() == ["proposal", "audit", "repair"]
        assert rep["reasons"]["withheld"] == {"annotation_drop": 1}


@pytest.mark.parametrize("audit, detail", [
    ({"verdict": "revise", "errors": [{"quote": "x", "problem": "y"}]},
     "errors[0].kind must be one of error, dependency, derivation"),
    ({"verdict": "accept", "errors": [{"kind": "error", "problem": "y"}]},
     "lists problems but verdict is accept"),
    ({"verdict": "revise", "errors": []}, "is empty but verdict is revise"),
    ({"verdict": "drop", "errors": []}, "is empty but verdict is drop"),
    ({"verdict": "clean", "errors": []}, "must be one of accept, revise, drop"),
])
def test_audit_answers_are_checked(tmp_path, audit, detail):
    srv, rep = _run(tmp_path, [math_row("c")], {"c": [WHOLE, as_json(audit), CLEAN]})
    assert srv.stages() == ["proposal", "audit", "retry"] and rep["buckets"]["kept"] == 1
    assert detail in srv.bodies("c")[2]["messages"][-1]["content"]
