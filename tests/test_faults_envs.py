"""Environments an episode cannot game (issue 36 item 5), attacked as a policy would.

  - the python/calculator envs' final answer: integers compare exactly (1000000000 is not
    1000000001), floats within the stated tolerance (rossjax/agents/builtin.py);
  - the bash env (and the SWE solver episode over it): the package's clean SWE sources are never
    readable from inside an episode, neither by `cp` nor by python, in a wheel-style install (the
    package inside the venv) nor in this editable one, as root and as uid 65534 (Landlock).
"""

import pytest

from rossjax.agents import make_env


@pytest.mark.parametrize("env_name", ["python", "calculator"])
def test_integers_compare_exactly_floats_with_the_stated_tolerance(env_name):
    env = make_env(env_name)
    env.reset({"prompt": "p", "answer": "1000000001"})
    assert env.finish("Answer: 1000000000").passed is False  # isclose(rel 1e-9) said equal
    assert env.finish("Answer: 1000000002").passed is False
    assert env.finish("Answer: 1000000001").passed is True
    assert env.finish("Answer: 1000000001.0").passed is True  # the same number, exactly
    assert env.finish("Answer: 1000000001.0000001").passed is False
    env.reset({"prompt": "p", "answer": 10 ** 18 + 1})  # past float precision
    assert env.finish(f"Answer: {10 ** 18}").passed is False
    assert env.finish(f"Answer: {10 ** 18 + 1}").passed is True
    assert env.finish("Answer: 1e18").passed is False
    env.reset({"prompt": "p", "answer": "0.1"})  # a float: within rel 1e-9 / abs 1e-9
    assert env.finish("Answer: 0.1000000000001").passed is True
    assert env.finish("Answer: 0.1001").passed is False
    env.reset({"prompt": "p", "answer": 2.5, "tolerance": 0.01})  # a task's own, stated
    assert env.finish("Answer: 2.509").passed is True
    assert env.finish("Answer: 2.52").passed is False
    env.reset({"prompt": "p", "answer": "Seine"})
    assert env.finish("Answer: seine").passed is True and env.finish("nan").passed is False


def test_answers_that_are_no_number_or_a_huge_one():
    env = make_env("python")
    env.reset({"prompt": "p", "answer": "5"})
    assert env.finish("Answer: 1e999999999").passed is False  # text, never 10**999999999
    assert env.finish("Answer: 5e0").passed is True and env.finish("Answer: inf").passed is False
    env.reset({"prompt": "p", "answer": 5, "tolerance": "wide"})
    assert env.finish("Answer: 5").passed is None
