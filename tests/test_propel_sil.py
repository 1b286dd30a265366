"""PROPEL's solver-in-the-loop baseline (configs/propel_sil.py, train/propel/rewards.py): each
valid candidate is tried K times by a live solver and paid the realized U_S; invalid candidates
get the invalid reward; trials, tasks tried and peak memory are counted in the GRPO metrics."""

import json
import os

import numpy as np
import pytest

from rossjax.cli import parse_config
from rossjax.configs import propel_sil
from rossjax.probes import labels
from rossjax.train.propel import rewards as propel_rewards, solvers
from rossjax.train.rl.grpo_config import check_config
from rossjax.verify import rewards

INPUTS = "\n".join(str(i) for i in range(10))


def _task(program, inputs=INPUTS, message="a linear map"):
    return f"```python\n{program}\n```\n```inputs\n{inputs}\n```\n```message\n{message}\n```"


def _record(rid, content):
    return {"id": rid, "task": {"id": rid, "prompt": "write a task"},
            "messages": [{"role": "user", "content": "write a task"},
                         {"role": "assistant", "content": content}]}


class Scripted:
    """A Solver whose k answers to a task are `right[task id]` copies of f, then wrong ones."""

    def __init__(self, right):
        self.right, self.asked = right, []

    def answers(self, tasks, k, seed):
        self.asked += [t["id"] for t in tasks]
        ok = lambda t: f"```python\n{t['program']}\n```"
        bad = "```python\ndef f(x):\n    return -12345\n```"
        return [[ok(t)] * self.right[t["id"]] + [bad] * (k - self.right[t["id"]]) for t in tasks]


def test_solver_reward_pays_realized_utility_in_the_band():
    section = propel_sil.solver_section()
    section.k = 8
    recs = [_record("in_band", _task("def f(x):\n    return 3 * x + 1")),
            _record("too_easy", _task("def f(x):\n    return x * x")),
            _record("never", _task("def f(x):\n    return x - 7")),
            _record("invalid", _task("def f(x):\n    return x", inputs="1\n2"))]
    cpu = rewards.score_batch(("validity",), recs)
    valid = np.asarray([c["validity"][0] for c in cpu])
    assert valid.tolist() == [1, 1, 1, 0]   # W: the 2-input task is invalid
    solver = Scripted({"in_band": 2, "too_easy": 5, "never": 0})
    sil = propel_rewards.SolverReward(section, solver, seed=0)
    out = sil(recs, valid)
    assert solver.asked == ["in_band", "too_easy", "never"]   # invalid tasks are never tried
    # each trial is the real judge on the hidden inputs: 2 / 5 / 0 of 8 solved
    solved = [sum(bool(x) for x in t) for t in sil.last_trials[:3]]
    assert solved == [2, 5, 0] and sil.last_trials[3] == []
    want = labels.utility_labels(sil.last_trials[:3], lo=1 / 8, hi=3 / 8, min_valid=2).y
    np.testing.assert_array_equal(out["solver"], [*want, -0.2])
    np.testing.assert_array_equal(out["solver"], [1.0, 0.0, 0.0, -0.2])
    assert sil.counts() == {"solver_trials": 24, "solver_tasks": 3}
    assert sil.counts() == {"solver_trials": 0, "solver_tasks": 0}  # reset per step
    # the open band (K = 3): at least one success and one failure
    section.band = "open"
    out = propel_rewards.SolverReward(section, solver)(recs, valid)
    np.testing.assert_array_equal(out["solver"], [1.0, 1.0, 0.0, -0.2])


class Texts:
    """A Solver whose answers to a task are given per task id (cycled to k)."""

    def __init__(self, by_id):
        self.by_id, self.asked = by_id, []

    def answers(self, tasks, k, seed):
        self.asked += [t["id"] for t in tasks]
        return [[self.by_id[t["id"]][j % len(self.by_id[t["id"]])] for j in range(k)] for t in tasks]


def test_math_sil_takes_the_reference_from_two_agreeing_oracles():
    section = propel_sil.solver_section(math=True)
    recs = [{**_record(i, f"```problem\nWhat is {q}?\n```"), "task": {"domain": "math_gen"}}
            for i, q in (("agree", "2 + 3"), ("disagree", "2 + 4"), ("invalid", "1 + 1"))]
    valid = np.asarray([1.0, 1.0, 0.0])
    oracle_a = Texts({"agree": ["\\boxed{5}"], "disagree": ["\\boxed{6}"]})
    oracle_b = Texts({"agree": ["\\boxed{5}"], "disagree": ["\\boxed{7}"]})
    solver = Texts({"agree": ["\\boxed{5}", "\\boxed{5}"] + ["\\boxed{4}"] * 6})
    sil = propel_rewards.SolverReward(section, solver, oracles=[oracle_a, oracle_b])
    out = sil(recs, valid)
    assert oracle_a.asked == oracle_b.asked == ["agree", "disagree"]   # W first
    assert solver.asked == ["agree"]          # the oracles disagree on the other: invalid
    assert [sum(bool(x) for x in t) for t in sil.last_trials] == [2, 0, 0]
    assert len(sil.last_trials[0]) == 8 and sil.last_trials[1:] == [[], []]
    np.testing.assert_array_equal(out["solver"], [1.0, -0.2, -0.2])   # 2 / 8 is in the band
    assert sil.counts() == {"solver_trials": 8, "solver_tasks": 1, "oracle_trials": 8}
    cfg = parse_config(["--config=configs/propel_sil.py:runlocal,math"])[0]
    check_config(cfg)   # the runlocal fn oracles import; the math config is PROPEL Math's
    assert cfg.data.tasks == "gen:math_task" and cfg.reward.solver.validity == "math_validity"
    assert cfg.grpo.beta == 0.1


def test_run_wires_the_real_solver_and_validity(tmp_path):
    """Run.rewards through the worker-scored W and the library's oracle solver: a band that
    holds rate 1 pays 1 to every valid task, the AZR band pays 0 (the oracle always solves)."""
    from rossjax.train.rl.grpo_setup import Run

    cfg = parse_config(["--config=configs/propel_sil.py:runlocal", "--config.reward.solver.k=2",
                        "--config.reward.solver.lo=1.0", "--config.reward.solver.hi=1.0"])[0]
    run = Run(cfg, str(tmp_path))
    try:
        assert run.cpu_kinds == ("validity",) and isinstance(run.solver_reward.solver, solvers.Solver)
        recs = [_record("a", _task("def f(x):\n    return x + 2")), _record("b", "no task here")]
        total, per = run.rewards(recs, rewards.score_batch(run.cpu_kinds, recs))
        np.testing.assert_array_equal(total, [1.0, -0.2])
        np.testing.assert_array_equal(per["validity"], [1.0, 0.0])
        m = run.cost_metrics()
        assert m["solver_trials"] == 2 and m["solver_tasks"] == 1 and m["peak_rss_mb"] > 0
        run.solver_reward.s.lo, run.solver_reward.s.hi = 1 / 8, 3 / 8
        assert run.rewards(recs, rewards.score_batch(run.cpu_kinds, recs))[0].tolist() == [0.0, -0.2]
    finally:
        run.workers.close()


def test_sil_is_one_config_away_from_propel():
    sil = parse_config(["--config=configs/propel_sil.py"])[0].to_dict()
    azr = parse_config(["--config=configs/propel_azr.py"])[0].to_dict()
    assert sil["reward"].pop("functions") == ("solver",) and azr["reward"].pop("functions") == ("probe",)
    solver = sil["reward"].pop("solver")
    assert solver["kind"] == "model" and solver["k"] == 8 and solver["invalid_reward"] == -0.2
    assert sil.pop("run_name") != azr.pop("run_name")
    assert sil == azr   # task, gate, GRPO, KL, LoRA: everything else is PROPEL's
    sil = parse_config(["--config=configs/propel_sil.py:math"])[0].to_dict()
    pm = parse_config(["--config=configs/propel_math.py"])[0].to_dict()
    assert sil["reward"].pop("solver")["oracles"]["attempts"] == 2
    for d in (sil, pm):
        d["reward"].pop("functions"), d.pop("run_name")
    assert sil == pm


@pytest.mark.parametrize("flags, says", [
    (["--config.reward.solver.kind=psychic"], "config.reward.solver.kind 'psychic' is not one of"),
    ([], "config.reward.solver.path and config.reward.solver.preset are both empty"),  # model
    (["--config.reward.solver.kind=oracle", "--config.reward.solver.k=0"], "solver.k is 0"),
    (["--config.reward.solver.kind=oracle", "--config.reward.solver.validity=verifier"],
     "validity 'verifier' is not one of validity, math_validity"),
    (["--config.reward.solver.kind=oracle", "--config.reward.solver.validity=math_validity"],
     "has no oracles section"),
    (["--config.reward.solver.kind=endpoint"], "solver.endpoint.model is empty"),
    (["--config.reward.solver.kind=oracle", "--config.reward.solver.band=ajar"], "band 'ajar'"),
])
def test_bad_solver_sections_are_one_sentence(flags, says):
    cfg = parse_config(["--config=configs/propel_sil.py", *flags])[0]
    with pytest.raises(ValueError, match=says):
        check_config(cfg)


def test_solver_reward_needs_its_section():
    cfg = parse_config(["--config=configs/grpo_verifier.py", "--config.reward.functions=('solver',)"])[0]
    with pytest.raises(ValueError, match="no config.reward.solver section; start from configs/propel_sil.py"):
        check_config(cfg)


def test_propel_sil_runlocal_cli(tmp_path):
    from rossjax import cli

    work = str(tmp_path / "w")
    assert cli.main(["grpo", "--config=configs/propel_sil.py:runlocal", f"--workdir={work}",
                     "--config.grpo.steps=1", "--config.grpo.max_new_tokens=8"]) == 0
    rows = [json.loads(x) for x in open(os.path.join(work, "history.jsonl"))]
    assert len(rows) == 16
    for r in rows:  # a random tiny model writes no valid task: every one gets the invalid reward
        assert r["rewards"]["validity"] == 0 and r["reward"] == pytest.approx(-0.2)
    m = [json.loads(x) for x in open(os.path.join(work, "metrics.jsonl"))][-1]
    assert m["solver_trials"] == 0 and m["solver_tasks"] == 0
    assert m["peak_rss_mb"] > 50 and "peak_rss_children_mb" in m


def test_trials_judge_a_repeated_answer_once_and_keep_cut_offs_apart(monkeypatch):
    from rossjax.verify.answers import Truncated

    st = {"id": "t", "domain": "induction", "program": "def f(x):\n    return x + 1",
          "inputs": ["0", "1", "2", "3", "4"], "hidden_inputs": ["5", "6", "7", "8", "9"],
          "message": "m", "prompt": "solve"}
    good = "```python\ndef f(x):\n    return x + 1\n```"
    bad = "```python\ndef f(x):\n    return x\n```"
    answers = [good, good, bad, Truncated(good), good, None, bad, good]
    judged = []
    real = solvers.judge
    monkeypatch.setattr(solvers, "judge", lambda t, a: judged.append(a) or real(t, a))
    got = solvers.trials(Texts({"t": answers}), [st, None], 8)
    assert got == [[True, True, False, False, True, None, False, True], []]
    # one sandboxed judgment per distinct answer: good, bad, the cut-off good, no answer
    assert len(judged) == 4 and isinstance(judged[2], Truncated)
