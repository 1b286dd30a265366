"""Generator/policy evaluation metrics against hand-computed values, and both CLI modes."""

import json
import math

import pytest

from rossjax.train import eval_generator as ev


def test_metrics():
    assert ev.distinct_n(["a b c d", "a b c e"]) == pytest.approx(3 / 4)
    assert ev.self_bleu(["a b c d", "a b c d"]) == pytest.approx(1.0)
    assert ev.self_bleu(["a b c d", "w x y z"]) == 0.0
    # 1-gram 3/4, 2-gram 2/3, 3-gram 1/2; equal lengths: no brevity penalty
    assert ev.bleu("a b c x".split(), ["a b c d".split()]) == pytest.approx(
        math.exp((math.log(3 / 4) + math.log(2 / 3) + math.log(1 / 2)) / 3))
    assert ev.pass_at_k(8, 0, 1) == 0 and ev.pass_at_k(8, 8, 4) == 1
    assert ev.pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))
    assert ev.utility_rate([1, 3, 4, 2, 0], [True, True, True, False, True], 8, 1 / 8, 3 / 8) == 0.4
    assert ev.top_topic_rate(["a", "b", "a", "a"]) == 0.75
    assert ev.topic("def f(s):\n    return s[::-1]") == "string"
    assert ev.topic("def f(x):\n    return x * 2") == "arithmetic"


def test_cli_runlocal(tmp_path):
    from rossjax import cli

    rc = cli.main(["eval-generator", "--config=configs/eval_generator.py:runlocal",
                   f"--workdir={tmp_path}", "--config.num_tasks=4", "--config.max_new_tokens=16"])
    assert rc == 0
    out = json.load(open(tmp_path / "eval_generator.json"))
    assert out["tasks"] == 4 and 0 <= out["validity_rate"] <= 1 and "self_bleu3" in out
    rc = cli.main(["eval-generator", "--config=configs/eval_generator.py:runlocal", "--config.mode=policy",
                   f"--workdir={tmp_path}", "--config.num_tasks=2", "--config.k=4",
                   "--config.ks=(1,4)", "--config.max_new_tokens=8", "--config.workers=0"])
    assert rc == 0
    out = json.load(open(tmp_path / "eval_generator.json"))
    assert out["pass@1"] == 0.0 and out["coverage"] == 0.0  # a random tiny model never adds


def test_generator_mode_with_programmatic_solvers(tmp_path, monkeypatch):
    import importlib.util
    import os

    from rossjax.train.eval_generator import evaluate_generator

    path = os.path.join(os.path.dirname(__file__), "..", "configs", "eval_generator.py")
    spec = importlib.util.spec_from_file_location("eval_generator_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    get_config = mod.get_config

    texts = ["```python\ndef f(x):\n    return x * 3 + 1\n```\n```inputs\n1\n2\n```",
             "```python\ndef f(s):\n    return s[::-1]\n```\n```inputs\n'ab'\n'xyz'\n```",
             "no task here"]
    monkeypatch.setattr(ev, "_sample", lambda *a, **k: texts)
    c = get_config("runlocal")
    c.workdir, c.k, c.lo, c.hi = str(tmp_path), 2, 1.0, 1.0
    out = evaluate_generator(c)
    assert out["validity_rate"] == pytest.approx(2 / 3)
    assert out["solve_counts"] == [2, 2, 0] and out["utility_rate"] == pytest.approx(2 / 3)
    c.solver.kind = "identity"
    out = evaluate_generator(c)
    assert out["solve_counts"] == [0, 0, 0] and out["utility_rate"] == 0.0
    assert out["top_topic_rate"] == 0.5
