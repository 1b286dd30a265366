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


def test_swe_and_solver_paper_settings():
    """PROPEL's SWE RL sizes and its solver sampling are the shipped defaults (issue 39 item 2);
    :runlocal keeps its small sizes."""
    swe = parse_config(["--config=configs/propel_swe.py"])[0]
    assert swe.grpo.steps == 30 and swe.grpo.contexts * swe.grpo.group_size == 256
    assert (swe.agent.max_turns, swe.agent.max_tokens) == (35, 32768)
    local = parse_config(["--config=configs/propel_swe.py:runlocal"])[0]
    assert local.grpo.steps == 2 and local.agent.max_turns == 3
    sil = parse_config(["--config=configs/propel_sil.py"])[0].reward.solver
    lab = parse_config(["--config=configs/label_corpus.py"])[0]
    for s in (sil, lab.solver, lab.oracles.a):
        assert (s.temperature, s.top_p, s.top_k) == (0.6, 0.95, 20)
        e = s.endpoint
        assert (e.temperature, e.top_p, e.top_k) == (0.6, 0.95, 20)


def test_solver_sampling_reaches_the_sampler_and_the_request(monkeypatch):
    import ml_collections

    from rossjax import sample
    from rossjax.train.propel import solvers

    seen = {}

    class Gen:
        finish_reason = ["stop"]

        def sequences(self):
            return [[5]]

    def fake(mc, params, prompts, n_new, **kw):
        seen.update(kw)
        return Gen()

    monkeypatch.setattr(sample, "generate", fake)
    lab = parse_config(["--config=configs/label_corpus.py"])[0]

    class Tok:
        eos_id = 0

        def encode(self, s):
            return [1]

        def decode(self, ids):
            return "x"

    c = ml_collections.ConfigDict({"max_new_tokens": 4, "temperature": 1.0})
    solvers.sample_texts(None, None, Tok(), [[{"role": "user", "content": "q"}]], 1, c, 0,
                         sampling=solvers.section_sampling(lab.solver, c))
    assert (seen["temperature"], seen["top_p"], seen["top_k"]) == (0.6, 0.95, 20)
    assert solvers.endpoint_filters(lab.solver.endpoint) == {"top_p": 0.95, "top_k": 20}
    assert solvers.endpoint_filters({"top_p": 1.0, "top_k": 0}) == {}


def test_generator_prompts_carry_the_papers_instructions():
    """App. 18's prompts, in rossjax's words: Math asks for a "## Problem" section and a
    different area each time; AZR states input and message requirements (issue 39 item 2)."""
    from rossjax.verify import induction_task, math_task

    m = math_task.generator_prompt([{"problem": "What is 1 + 1?"}])
    assert "## Problem" in m and "different area of mathematics each time" in m
    assert "do not solve it" in m and m.index("## Examples") < m.index("## Task")
    # the "## Problem" section is read with or without its block; a later answer is ignored
    assert math_task.parse_generated_problem("## Problem\nFind x: 2x = 4.\n\n## Answer\n"
                                             "\\boxed{2}") == {"problem": "Find x: 2x = 4."}
    assert math_task.check_problem(math_task.parse_generated_problem(
        "## Problem\n```problem\nFind x: 2x = 4.\n```\n\\boxed{2}")).passed
    a = induction_task.generator_prompt(induction_task.Protocol(), [
        {"program": "def f(a):\n    return a + 1", "inputs": ["1"] * 10, "message": "adds"}])
    assert "### Input requirements" in a and "### Message requirements" in a
    assert "### Output format" in a and "### Seed function" in a


def test_one_model_as_both_math_oracles_is_refused_unless_allowed(tmp_path, capsys):
    """PROPEL's two oracles are two different models (issue 39 item 4)."""
    from rossjax.cli import main
    from rossjax.train.propel import solvers

    lab = parse_config(["--config=configs/label_corpus.py"])[0]
    for n in "ab":
        lab.oracles[n].kind, lab.oracles[n].endpoint.model = "endpoint", "same-model"
    with pytest.raises(ValueError, match="config.oracles.a and config.oracles.b are the same model"):
        solvers.check_oracles(lab.oracles)
    lab.oracles.b.endpoint.model = "other-model"
    solvers.check_oracles(lab.oracles)
    lab.oracles.b.endpoint.model, lab.oracles.allow_same = "same-model", True
    solvers.check_oracles(lab.oracles)
    pool = tmp_path / "pool.jsonl"
    pool.write_text(json.dumps({"id": "a", "problem": "What is 1 + 2?"}) + "\n")
    argv = ["label-corpus", "--config=configs/label_corpus.py", "--config.domain=math",
            f"--config.pool={pool}", f"--config.output={tmp_path / 'o'}",
            "--config.tokenizer=ascii", "--config.solver.kind=oracle",
            "--config.oracles.a.kind=model", "--config.oracles.a.preset=tiny_qwen2",
            "--config.oracles.b.kind=model", "--config.oracles.b.preset=tiny_qwen2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "same model" in err and "allow_same" in err and "Traceback" not in err
    # the SIL reward's oracles are checked the same way; :runlocal,math's stand-in says so
    from rossjax.train.propel import rewards as propel_rewards

    sil = parse_config(["--config=configs/propel_sil.py:runlocal,math"])[0]
    assert sil.reward.solver.oracles.allow_same
    sil.reward.solver.oracles.allow_same = False
    with pytest.raises(ValueError, match="reward.solver.oracles.a and .*same model"):
        propel_rewards.check_solver_config(sil.reward)
