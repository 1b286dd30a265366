"""rossjax.review's agentic procedure against the scripted server: discovery over step groups on
four axes, boundary localization per finding, consistency checks with retries, unresolved ->
withheld, omissions recorded without a mask effect."""

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
OK = {"contract": "ok", "operation": "ok", "environment": "ok", "execution": "ok"}


def judge(message, call, **axes):
    return {"message": message, "call": call, **OK, **axes}


def discovery(calls, findings):
    return as_json({"calls": calls, "findings": findings})


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
