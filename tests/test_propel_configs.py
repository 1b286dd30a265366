"""PROPEL's paper settings in the shipped configs (AZR: 30 steps, GRPO advantages, KL 0.05;
Math: KL 0.1) and the Math domain's generator task and validity gate."""

import json
import os

import pytest

from rossjax.cli import parse_config
from rossjax.train.rl import rollout
from rossjax.verify import rewards


def test_paper_settings():
    azr = parse_config(["--config=configs/propel_azr.py"])[0]
    math = parse_config(["--config=configs/propel_math.py"])[0]
    for c in (azr, math):
        assert c.grpo.steps == 30 and c.grpo.advantages == "grpo"
        assert c.reward.functions == ("probe",) and c.reward.probe.gate == "hard_gate"
    assert azr.grpo.beta == 0.05 and math.grpo.beta == 0.1
    assert azr.data.tasks == "gen:induction" and (azr.data.induction.n_inputs, azr.data.induction.n_visible) == (10, 5)
    assert math.data.tasks == "gen:math_task" and math.reward.probe.validity == "math_validity"
    sweep = parse_config(["--config=configs/probe_sweep.py"])[0]
    # PROPEL: an 80/10/10 split for Math and AZR (over whole groups), grouped 5-fold for SWE
    from rossjax.probes.sweep import split_kind
    assert sweep.split == "" and split_kind(sweep) == "group_random" and sweep.fold == -1 and sweep.folds == 5
    sweep.domain = "swe"
    assert split_kind(sweep) == "group_kfold"
    assert tuple(sweep.seeds) == (0, 1, 2) and sweep.rvp_n == 512


def _math(content):
    return {"task": {}, "messages": [{"role": "assistant", "content": content}]}


def test_math_generator_task_and_validity():
    t = rollout.TaskSource("gen:math_task").next(1)[0]
    assert "```problem" in t["prompt"] and t["domain"] == "math_gen"
    # the generator writes the problem only; an answer after the block is ignored (the
    # reference comes from the two oracles), so both of these are valid
    for good in ("```problem\nWhat is the sum of the first 10 odd numbers?\n```",
                 "```problem\nWhat is the sum of the first 10 odd numbers?\n```\n\\boxed{100}"):
        assert rewards.score("math_validity", _math(good))[0] == 1.0
    for bad in ("What is 2+2? \\boxed{4}",                                   # no problem block
                "```problem\n  \n```",                                        # empty problem
                "```problem\nShow that \\boxed{4} is 2+2.\n```\n\\boxed{4}"):  # answer given away
        r, v = rewards.score("math_validity", _math(bad))
        assert r == 0.0 and v["name"] == "math_problem_valid", v


@pytest.mark.slow
def test_propel_math_runlocal(tmp_path):
    from rossjax import cli

    work = str(tmp_path / "w")
    assert cli.main(["grpo", "--config=configs/propel_math.py:runlocal", f"--workdir={work}",
                     "--config.grpo.steps=1", "--config.grpo.max_new_tokens=16"]) == 0
    rows = [json.loads(x) for x in open(os.path.join(work, "history.jsonl"))]
    assert len(rows) == 2 * 4
    for r in rows:  # a random model writes no valid problem: the hard gate pays -0.2
        assert r["rewards"]["math_validity"] == 0 and r["reward"] == pytest.approx(-0.2)
