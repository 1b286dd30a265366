"""rossjax.review's agentic procedure against the scripted server: discovery over step groups on
four axes, boundary localization per finding, consistency checks with retries, unresolved (in
discovery or from the localizer) -> withheld, omissions recorded without a mask effect."""

import copy

import numpy as np
from review_server import as_json
from test_review import _run, reviewed, withheld

from rossjax.curate.masks import compile_rollout
from rossjax.tokenizers import load_tokenizer

AGENT = {
    "id": "fib", "task": {"id": "code-fib", "domain": "code", "prompt": "Write fib(n)."},
    "verifier": {"name": "code", "passed": True, "evidence": "4/4 tests"}, "reward": 1.0,
    "messages": [
        {"role": "system", "content": "You are a coding agent with a bash tool."},
        {"role": "user", "content": "Write fib(n) in sol.py so the tests pass."},
        {"role": "assistant", "reasoning": "Write it, then test.",
         "content": "First I'll write the file.\nrm -rf /tmp/work && mkdir /tmp/work  # clean slate\n"
                    "Then I run a check.",
         "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {
             "cmd": "printf 'def fib(n):\\n    a, b = 0, 1\\n' > sol.py"}}},
                        {"type": "function", "function": {"name": "bash", "arguments": {
                            "cmd": "python -c 'import sol'"}}}]},
        {"role": "tool", "name": "bash", "content": ""},
        {"role": "tool", "name": "bash", "content": "ok"},
        {"role": "assistant", "content": "It imports. I am sure it is correct, no tests needed.\n"
                                         "Here is the solution: fib is done."},
        {"role": "user", "content": "Thanks. Anything else?"},
        {"role": "assistant", "content": "No, that is all."}],
}
OK = {"contract": "ok", "operation": "ok", "environment": "ok", "execution": "ok",
      "narrative": "ok", "causal": "ok"}


def judge(message, call, **axes):
    return {"message": message, "call": call, **OK, **axes}


def account(record, messages, findings):
    """`lines` covering every line of each message's text parts once: a message with an error
    finding is judged fail, one with an unresolved finding unresolved, the rest ok."""
    from rossjax.review.agentic_checks import step_lines
    from rossjax.templates import render_chat

    r = render_chat(record["messages"], "chatml", None, tools=record.get("tools"))
    out = []
    for m in sorted(set(messages)):
        kinds = {f["kind"] for f in findings if f["message"] == m}
        v = "fail" if "error" in kinds else "unresolved" if "unresolved" in kinds else "ok"
        out += [{"message": m, "part": part, "from": 1, "to": n, "verdict": v}
                for part, n in step_lines(r, m).items()]
    return out


def discovery(calls, findings, lines=None, record=None):
    if lines is None:
        lines = account(record or AGENT, [c["message"] for c in calls], findings)
    return as_json({"calls": calls, "lines": lines, "findings": findings})


ALL_OK = [judge(2, 0), judge(2, 1), judge(5, 0)]
ERR_RM = {"kind": "error", "message": 2, "call": 0, "axes": ["operation"],
          "what": "deletes a directory it does not own"}
OMIT = {"kind": "omission", "message": 5, "call": 0, "axes": ["execution"],
        "what": "never ran the tests"}
LOC_RM = as_json({"exclude": [{"message": 2, "line": 2, "quote": "rm -rf /tmp/work"}],
                  "protect": [{"message": 5, "line": 2, "quote": "Here is the solution:"}]})
LOC_OMIT = as_json({"after": {"message": 5, "line": 1, "quote": "It imports."},
                    "note": "should have run the unit tests"})
GROUP2 = discovery([judge(7, 0)], [])  # the second step group: message 7 only


def test_steps_are_judged_in_bounded_groups_then_localized(tmp_path):
    first = discovery([judge(2, 0, operation="fail"), judge(2, 1), judge(5, 0, execution="fail")],
                      [ERR_RM, OMIT])
    srv, rep = _run(tmp_path, [AGENT], {"fib": [first, GROUP2, LOC_RM, LOC_OMIT]}, step_group=2)
    assert srv.stages() == ["discovery", "discovery", "localization", "localization"]
    d1, d2 = (b["messages"][-1]["content"] for b in srv.bodies("fib", "discovery"))
    assert "message 2 (2 calls), message 5 (1 call)." in d1 and "message 7 (1 call)." in d2
    assert "contract" in d1 and "environment" in d1 and "Do not give text boundaries yet" in d1
    loc = srv.bodies("fib", "localization")[0]["messages"][-1]["content"]
    assert "an error in message 2 call 0 (operation): deletes a directory" in loc
    _, by = reviewed(tmp_path / "out")
    ann = by["fib"]["annotation"]
    assert ann == {"status": "revise",
                   "exclude": [{"message": 2, "line": 2, "quote": "rm -rf /tmp/work"}],
                   "protect": [{"message": 5, "line": 2, "quote": "Here is the solution:"}],
                   "omissions": [{"message": 5, "after": "It imports.", "line": 1,
                                  "note": "should have run the unit tests"}]}
    assert by["fib"]["review"]["procedure"] == "agentic"
    assert [f["kind"] for f in by["fib"]["review"]["findings"]] == ["error", "omission"]
    assert rep["stages"]["discovery"]["requests"] == 2
    assert rep["stages"]["localization"]["requests"] == 2


def test_omission_has_no_mask_effect(tmp_path):
    first = discovery([judge(2, 0), judge(2, 1), judge(5, 0, execution="fail")], [OMIT])
    srv, rep = _run(tmp_path, [AGENT], {"fib": [first, GROUP2, LOC_OMIT]}, step_group=2)
    _, by = reviewed(tmp_path / "out")
    ann = by["fib"]["annotation"]
    assert ann["status"] == "accept" and "exclude" not in ann and len(ann["omissions"]) == 1
    tok = load_tokenizer("qwen")
    ex = compile_rollout(by["fib"], tok)
    bare = compile_rollout({**copy.deepcopy(AGENT), "annotation": {"status": "accept"}}, tok)
    assert ex.status == "kept" and ex.n_supervised == ex.n_eligible > 0
    np.testing.assert_array_equal(ex.loss_mask, bare.loss_mask)
    np.testing.assert_array_equal(ex.loss_mask, ex.eligible_mask)


def test_unresolved_finding_withholds_the_row_without_asking_boundaries(tmp_path):
    unresolved = discovery(
        [judge(2, 0), judge(2, 1, environment="unresolved"), judge(5, 0)],
        [{"kind": "unresolved", "message": 2, "call": 1, "axes": ["environment"],
          "what": "the empty tool output may hide a failed write"}])
    srv, rep = _run(tmp_path, [AGENT], {"fib": [unresolved]}, step_group=2)
    assert srv.stages() == ["discovery"]  # no second group, no localization
    assert rep["reasons"]["withheld"] == {"review_unresolved": 1}
    assert rep["stages"]["discovery"]["withheld"] == {"review_unresolved": 1}
    assert "may hide a failed write" in withheld(tmp_path / "out")["fib"]["detail"]



def test_the_localizer_may_answer_unresolved_which_withholds_the_row(tmp_path):
    """The paper's localizer answer for a finding it cannot point to: the row is withheld
    (`localization_unresolved`), nothing is asked after it, and report.json counts it; an
    answer that gives selectors and says unresolved is asked again."""
    first = discovery([judge(2, 0, operation="fail"), judge(2, 1), judge(5, 0, execution="fail")],
                      [ERR_RM, OMIT])
    both = as_json({"unresolved": "not sure", "exclude": [{"message": 2, "line": 2}]})
    gone = as_json({"unresolved": "the missing test run has no place in the transcript"})
    srv, rep = _run(tmp_path, [AGENT], {"fib": [first, GROUP2, LOC_RM, both, gone]},
                    step_group=2)
    assert srv.stages() == ["discovery", "discovery", "localization", "localization", "retry"]
    assert "also says unresolved" in srv.bodies("fib")[-1]["messages"][-1]["content"]
    loc = srv.bodies("fib", "localization")[1]["messages"][-1]["content"]
    assert '{"unresolved": "why it cannot be located"}' in loc
    assert rep["reasons"]["withheld"] == {"localization_unresolved": 1}
    assert rep["stages"]["localization"]["withheld"] == {"localization_unresolved": 1}
    assert rep["outcomes"]["localization"] == {"located": 1, "unresolved": 1}
    assert "has no place in the transcript" in withheld(tmp_path / "out")["fib"]["detail"]


def test_an_unresolved_first_finding_asks_no_boundary_after_it(tmp_path):
    """The localizer's unresolved on the first finding (an error) withholds the row before the
    omission after it is localized; the omission's prompt offers the same answer; a row whose
    findings are all located is kept beside it and counted as located."""
    first = discovery([judge(2, 0, operation="fail"), judge(2, 1), judge(5, 0, execution="fail")],
                      [ERR_RM, OMIT])
    gone = as_json({"unresolved": "the deletion is described, never quoted"})
    other = {**copy.deepcopy(AGENT), "id": "fib2"}
    srv, rep = _run(tmp_path, [AGENT, other], {"fib": [first, GROUP2, gone],
                                               "fib2": [first, GROUP2, LOC_RM, LOC_OMIT]},
                    step_group=2)
    assert srv.stages("fib") == ["discovery", "discovery", "localization"]
    omission = srv.bodies("fib2", "localization")[1]["messages"][-1]["content"]
    assert "an omission in message 5" in omission and '{"unresolved": "' in omission
    assert rep["buckets"] == {"kept": 1, "withheld": 1, "invalid": 0}
    assert rep["reasons"]["withheld"] == {"localization_unresolved": 1}
    assert rep["outcomes"]["localization"] == {"located": 2, "unresolved": 1}
    assert rep["outcomes"]["audit"] == {"accept": 0, "revise": 0, "drop": 0}
    w = withheld(tmp_path / "out")["fib"]
    assert w["reason"] == "localization_unresolved"
    assert "could not locate the error of message 2 call 0" in w["detail"]

def test_consistency_violations_are_asked_again_with_the_failing_check(tmp_path):
    # a failed dimension with no finding naming it; then a call left unjudged
    no_finding = discovery([judge(2, 0, operation="fail"), judge(2, 1), judge(5, 0), judge(7, 0)],
                           [])
    unjudged = discovery([judge(2, 0, operation="fail"), judge(5, 0), judge(7, 0)], [ERR_RM])
    good = discovery([judge(2, 0, operation="fail"), judge(2, 1), judge(5, 0), judge(7, 0)],
                     [ERR_RM])
    # a localization whose exclusion touches its own protected region
    clash = as_json({"exclude": [{"message": 2, "line": 2}],
                     "protect": [{"message": 2, "line": 2, "quote": "clean slate"}]})
    wrong_msg = as_json({"exclude": [{"message": 5, "line": 1, "quote": "It imports."}]})
    srv, rep = _run(tmp_path, [AGENT], {"fib": [no_finding, unjudged, good, clash, wrong_msg,
                                                LOC_RM]}, step_group=4, max_step_retries=2)
    assert srv.stages() == ["discovery", "retry", "retry", "localization", "retry", "retry"]
    msgs = [b["messages"][-1]["content"] for b in srv.bodies("fib")]
    assert "message 2 call 0 is judged fail on operation, but no error or omission finding" in msgs[1]
    assert "message 2 call 1 has no judgment" in msgs[2]
    assert "exclude[0] (message 2 line 2) overlaps the protected 'clean slate'" in msgs[4]
    assert "exclude[0] is in message 5, but the finding is about message 2" in msgs[5]
    assert rep["buckets"]["kept"] == 1
    assert rep["stages"]["discovery"]["failed_checks"] == {"review_inconsistent": 2}
    assert rep["stages"]["localization"]["failed_checks"] == {"exclude_protected": 1,
                                                              "review_inconsistent": 1}
    # retries are bounded: a group that never becomes consistent withholds the row
    srv, rep = _run(tmp_path, [AGENT], {"fib": [no_finding] * 3}, name="b", max_step_retries=1)
    assert len(srv.requests) == 2 and rep["reasons"]["withheld"] == {"review_inconsistent": 1}


def test_every_line_of_every_step_is_accounted_and_narrative_causal_are_judged(tmp_path):
    """Discovery judges the narrative and causal checks and gives every line of every step one
    verdict; a gap, a line judged twice, an error with no failing line or a failing line with no
    finding is asked again with the failing check quoted."""
    from rossjax.review import prompts

    calls = [judge(2, 0), judge(2, 1), judge(5, 0, narrative="fail"), judge(7, 0)]
    claim = {"kind": "error", "message": 5, "call": 0, "axes": ["narrative"],
             "what": "claims correctness it never checked"}
    full = account(AGENT, [2, 5, 7], [claim])
    assert {(x["message"], x["part"]) for x in full} == {
        (2, "reasoning"), (2, "content"), (2, "tool_calls"), (5, "content"), (7, "content")}
    gap = [dict(x, **{"from": 2}) if x["message"] == 2 and x["part"] == "content" else x
           for x in full]
    twice = full + [{"message": 7, "part": "content", "from": 1, "to": 1, "verdict": "ok"}]
    no_fail = [dict(x, verdict="ok") for x in full]
    loose = [dict(x, verdict="fail") if x["message"] == 7 else x for x in full]
    loc = as_json({"exclude": [{"message": 5, "line": 1, "quote": "I am sure it is correct"}]})
    script = [discovery(calls, [claim], lines=ln) for ln in (gap, twice, no_fail, loose, full)]
    srv, rep = _run(tmp_path, [AGENT], {"fib": [*script, loc]}, step_group=4, max_step_retries=4)
    assert srv.stages() == ["discovery", "retry", "retry", "retry", "retry", "localization"]
    msgs = [b["messages"][-1]["content"] for b in srv.bodies("fib")]
    assert "message 2 content: line 1 has no verdict" in msgs[1]
    assert "message 7 content: line 1 is judged twice" in msgs[2]
    assert "message 5 has an error finding but no line judged fail" in msgs[3]
    assert "message 7 has lines judged fail but no error or omission finding" in msgs[4]
    assert rep["buckets"]["kept"] == 1
    body = srv.bodies("fib")[0]["messages"][-1]["content"]
    assert "narrative:" in body and "causal:" in body and "every line of every step" in body
    assert prompts.PROMPT_VERSION == "ross-review-v5"
    # a call judged on causal without a finding naming causal is inconsistent too
    bad = discovery([judge(2, 0, causal="fail"), judge(2, 1), judge(5, 0), judge(7, 0)], [])
    srv, rep = _run(tmp_path, [AGENT], {"fib": [bad] * 2}, name="b", max_step_retries=1)
    assert "judged fail on causal, but no error or omission finding" in \
        srv.bodies("fib")[1]["messages"][-1]["content"]
