"""Answers cut off at max_tokens (finish_reason 'length'): never an oracle's reference (the last
\\boxed{} of a cut-off solution may be an intermediate result) and never a solved trial, for
endpoint and checkpoint solvers alike."""

import numpy as np
from review_server import Reviewer
from test_propel_math import SYSTEM, _cfg, _section

from rossjax.train.propel import solvers
from rossjax.verify import math_oracle, math_task
from rossjax.verify.answers import Truncated

CUT = {"content": "First 2 + 3 = \\boxed{5}, then we multiply", "finish_reason": "length"}


def test_a_cut_off_oracle_answer_is_an_oracle_failure_naming_the_attempt():
    # oracle a attempt 2 (seed 0 + 7919 + 1) is cut off after an intermediate \boxed{5}
    def answer(rid, body):
        return CUT if body["seed"] == 7920 else "\\boxed{5}"

    task = math_task.solver_task("What is 2 + 3?", "t0")
    with Reviewer(default=answer) as srv:
        o = solvers.Solver(_section(e_base_url=srv.url, e_model="a", system=SYSTEM), None, _cfg())
        (lab,) = solvers.oracle_labels([o, o], [task], seed=0)
    assert lab.status == "failure" and lab.reference is None
    assert lab.reason == "oracle failure: oracle a attempt 2's answer was cut off at max_tokens"
    assert lab.answers == (("5", None), ("5", "5"))
    assert o.report()["cut_off"] == 1


def test_agree_on_a_truncated_text():
    lab = math_oracle.agree([["\\boxed{5}", Truncated("\\boxed{5} and")], ["\\boxed{5}"] * 2],
                            names=("x", "y"))
    assert lab.status == "failure" and "oracle x attempt 2's answer was cut off" in lab.reason
    assert math_oracle.agree([["\\boxed{5}"] * 2] * 2).status == "agreed"


def test_a_cut_off_solver_trial_is_failed():
    def answer(rid, body):
        return CUT if body["seed"] % 2 else "\\boxed{5}"

    task = math_task.solver_task("What is 2 + 3?", "t0", "5")
    with Reviewer(default=answer) as srv:
        s = solvers.Solver(_section(e_base_url=srv.url, e_model="s", system=SYSTEM), None, _cfg())
        assert solvers.trials(s, [task], 4, seed=0) == [[True, False, True, False]]
    rep = s.report()
    assert rep["cut_off"] == 2 and rep["no_answer"] == 0
    assert solvers.judge(task, Truncated("\\boxed{5}")) is False
    assert solvers.judge(task, "\\boxed{5}") is True


def test_a_checkpoint_answer_at_max_new_tokens_is_truncated(tmp_path, monkeypatch):
    from rossjax import sample

    tok = solvers.load_tokenizer("ascii", str(tmp_path))
    done, cut = tok.encode("\\boxed{5}") + [tok.eos_id], tok.encode("\\boxed{5} then")

    def generate(mc, params, prompts, t, **kw):
        rows = [done, cut] * len(prompts)
        toks = np.zeros((len(rows), 32), np.int32)
        for i, r in enumerate(rows):
            toks[i, :len(r)] = r
        return sample.GenerationResult(toks, np.zeros_like(toks, np.float32),
                                       np.array([len(r) for r in rows]), ["stop", "length"] * len(prompts))

    monkeypatch.setattr(sample, "generate", generate)
    texts = solvers.sample_texts(None, None, tok, [[{"role": "user", "content": "2 + 3?"}]], 2,
                                 _cfg(), 0)
    assert texts == ["\\boxed{5}", "\\boxed{5} then"]
    assert [isinstance(t, Truncated) for t in texts] == [False, True]


def test_an_answer_with_a_lone_surrogate_is_no_answer_and_never_cached(tmp_path):
    # the client refuses it (no UTF-8 cache file can hold it): that trial has no answer
    def answer(rid, body):
        return "\\boxed{5} half \ud800" if body["seed"] == 1 else "\\boxed{5}"

    task = math_task.solver_task("What is 2 + 3?", "t0", "5")
    with Reviewer(default=answer) as srv:
        s = solvers.Solver(_section(e_base_url=srv.url, e_model="s", system=SYSTEM,
                                    e_cache_dir=str(tmp_path / "c"), e_max_retries=0),
                           None, _cfg())
        assert solvers.trials(s, [task], 2, seed=0) == [[True, None]]
    assert s.report()["no_answer"] == 1 and "lone UTF-16 surrogate" in s.errors[0]
