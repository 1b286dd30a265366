"""The pre-RL mixed-outcome diagnostic of `rossjax eval-generator` (policy mode): shares of
mixed, all-pass and all-fail prompts, and the paper's 64 x 8 at T = 1 variant."""

import numpy as np

from rossjax import cli
from rossjax.train.propel import eval_generator as ev
from rossjax.verify.verdict import Verdict


def test_outcome_shares():
    correct = np.array([[1, 1, 1], [0, 0, 0], [1, 0, 0], [0, 0, 1], [0, 0, 0]], bool)
    out = ev.outcome_shares(correct)
    assert out["counts"] == {"all_pass": 1, "all_fail": 2, "mixed": 2}
    assert (out["mixed"], out["all_pass"], out["all_fail"]) == (0.4, 0.2, 0.4)
    assert out["prompts"] == 5 and out["samples_per_prompt"] == 3
    assert ev.outcome_shares(np.zeros((0, 8), bool))["mixed"] == 0.0


def test_mixed_outcome_variant_is_the_papers_and_runs_through_policy_mode(tmp_path, monkeypatch):
    c = cli.parse_config(["--config=configs/eval_generator.py:mixed_outcome"])[0]
    assert (c.mode, c.num_tasks, c.k, c.temperature) == ("policy", 64, 8, 1.0)
    # the policy pass with a scripted sampler and verifier: prompt i passes (i % 3) of 8 answers
    # (prompt 0 all fail), undecided answers count as not passed
    c.solver.preset, c.tokenizer, c.workers = "tiny_qwen2", "ascii", 0
    monkeypatch.setattr(ev, "_model", lambda *a, **k: (None, None))
    monkeypatch.setattr(ev, "_sample", lambda mc, p, tok, msgs, n, c, seed: [
        f"{i}:{j}" for i in range(len(msgs)) for j in range(n)])

    def verify_many(records, workers=0):
        out = []
        for r in records:
            i, j = map(int, r["messages"][-1]["content"].split(":"))
            passed = None if (i, j) == (1, 7) else (True if i == 2 else j < i % 3)
            out.append(Verdict(passed=passed, evidence="scripted"))
        return out

    monkeypatch.setattr("rossjax.verify.verify_many", verify_many)
    out = ev.run(c, str(tmp_path))
    o = out["outcomes"]
    want_pass = sum(i == 2 for i in range(64))
    want_fail = sum(i != 2 and i % 3 == 0 for i in range(64))
    assert o["counts"] == {"all_pass": want_pass, "all_fail": want_fail,
                           "mixed": 64 - want_pass - want_fail}
    assert abs(o["mixed"] + o["all_pass"] + o["all_fail"] - 1.0) < 1e-12
    assert out["undecided_samples"] == 1 and out["temperature"] == 1.0
