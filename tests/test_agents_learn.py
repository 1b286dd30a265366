"""The calculator demo's SFT warm-up data (data/agents/calculator_sft.jsonl): it is what the
generator writes, every episode is one the real environment judges correct, none is an
evaluation task, and curate keeps every row with loss only on the assistant's turns."""

import os

import numpy as np

from rossjax.agents.builtin import CalculatorEnv, calculator_demonstrations, evaluate
from rossjax.curate import compile_rollout, load_tokenizer
from rossjax.curate.files import read_objects
from rossjax.tokenizers.ascii import write_ascii_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data", "agents")


def _jsonl(name):
    return [obj for _, obj in read_objects(os.path.join(DATA, name), id_field=None)]


def test_shipped_demonstrations_are_the_generator_output():
    tasks = _jsonl("calculator.jsonl")
    rows = _jsonl("calculator_sft.jsonl")
    assert rows == calculator_demonstrations(600, seed=0, exclude=[t["prompt"] for t in tasks],
                                             system="")
    assert not {r["task"]["prompt"] for r in rows} & {t["prompt"] for t in tasks}
    assert len({r["task"]["prompt"] for r in rows}) == len(rows)


def test_every_demonstration_is_judged_correct_by_the_environment():
    env = CalculatorEnv(system="")
    for r in _jsonl("calculator_sft.jsonl"):
        user, call, tool, final = r["messages"]
        assert env.reset(r["task"]) == [user]
        expr = call["tool_calls"][0]["function"]["arguments"]["expression"]
        assert str(evaluate(expr)) == tool["content"] == r["task"]["answer"]
        assert env.finish(final["content"]).passed is True and r["verifier"]["passed"] is True
    # the verdict is exact: an answer one off fails
    assert env.finish(f"Answer: {int(r['task']['answer']) + 1}").passed is False


def test_demonstrations_curate_with_loss_on_the_assistant_turns_only(tmp_path):
    tok = load_tokenizer(write_ascii_tokenizer(str(tmp_path / "tok")))
    for r in _jsonl("calculator_sft.jsonl")[:50]:
        ex = compile_rollout(r, tok)
        assert ex.status == "kept", ex
        text = tok.decode([int(t) for t, m in zip(ex.input_ids, ex.loss_mask) if m])
        call = r["messages"][1]["tool_calls"][0]["function"]["arguments"]["expression"]
        assert call in text and r["messages"][3]["content"] in text
        assert r["task"]["prompt"] not in text and "<tool_response>" not in text
        assert np.asarray(ex.loss_mask).sum() < len(ex.input_ids)
