"""Verifiers: math, code, induction, gym, registry and the parallel runner."""

import ast
import threading
import time

import pytest

from rossjax import verify as verifiers
from rossjax.verify import Verdict
from rossjax.verify.answers import extract_boxed, extract_code, extract_tag
from rossjax.verify.induction import banned_uses, task_valid


def rec(answer, task, name=None, reasoning=None):
    msg = {"role": "assistant", "content": answer}
    if reasoning:
        msg["reasoning"] = reasoning
    r = {"id": "r", "task": task, "messages": [{"role": "user", "content": "q"}, msg]}
    if name:
        r["verifier"] = {"name": name}
    return r


def test_answer_extraction():
    assert extract_boxed(r"so \boxed{\frac{1}{2}} or rather \boxed{\frac{1}{3}}") == r"\frac{1}{3}"
    assert extract_boxed(r"\boxed{a{b}c}") == "a{b}c" and extract_boxed("none") is None
    assert extract_code("x\n```python\nprint(1)\n```\nand\n```\nprint(2)\n```") == "print(1)\n"
    assert extract_code("```\nprint(2)\n```") == "print(2)\n" and extract_code("print(1)") is None
    assert extract_tag("<answer> 4 </answer> <answer>5</answer>") == "5"


def test_math_gold_first_and_equivalence():
    v = verifiers.get("math")
    task = {"domain": "math", "reference": r"\frac{1}{2}"}
    assert v(rec(r"It is \boxed{0.5}.", task)).passed is True
    assert v(rec(r"It is \boxed{1/3}.", task)).passed is False
    assert v(rec("It is one half.", task)).passed is False  # no boxed answer
    # The answer is read from content, never from the reasoning.
    assert v(rec("I give up", task, reasoning=r"\boxed{1/2}")).passed is False
    assert v(rec(r"\boxed{1+x^2}", {"reference": "x^2+1"})).passed is True


def test_math_unparseable_gold_is_undecided():
    v = verifiers.get("math")
    assert v(rec(r"\boxed{1}", {"reference": "{{{"})).passed is None
    assert v(rec(r"\boxed{1}", {})).passed is None


def test_math_off_main_thread_runs_without_signals():
    out = []
    t = threading.Thread(target=lambda: out.append(
        verifiers.get("math")(rec(r"\boxed{2}", {"reference": "2"}))))
    t.start()
    t.join()
    assert out[0].passed is True and "not on a main thread" in out[0].evidence


HE_TESTS = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
HE_TASK = {"domain": "code", "tests": HE_TESTS, "entry_point": "add",
           "code_prefix": "def add(a: int, b: int) -> int:\n    \"\"\"Add.\"\"\"\n"}


def test_code_humaneval_style():
    v = verifiers.get("code")
    assert v(rec("```python\ndef add(a, b):\n    return a + b\n```", HE_TASK)).passed is True
    assert v(rec("```python\n    return a + b\n```", HE_TASK)).passed is True  # body continuation
    bad = v(rec("```python\ndef add(a, b):\n    return a - b\n```", HE_TASK))
    assert bad.passed is False and "AssertionError" in bad.evidence
    assert v(rec("no code here", HE_TASK)).passed is False
    evil = v(rec("```python\nimport os\nos.kill(os.getppid(), 9)\n```", HE_TASK))
    assert evil.passed is False and evil.evidence.startswith("sandbox_violation")


def test_code_prefix_is_code_or_the_task_is_invalid():
    v = verifiers.get("code")
    stub = {**HE_TASK, "code_prefix": "def add(a, b):\n"}  # a signature without a body
    assert v(rec("```python\n    return a + b\n```", stub)).passed is True
    broken = v(rec("```python\ndef add(a, b):\n    return a + b\n```",
                   {**HE_TASK, "code_prefix": "Add two numbers: def add(a, b)"}))
    assert broken.passed is None and "code_prefix is not Python" in broken.evidence


def test_code_stdin_stdout_cases():
    v = verifiers.get("code")
    task = {"domain": "code", "cases": [{"input": "1 2\n", "output": "3\n"},
                                         {"input": "5 5\n", "output": "10"}]}
    good = "```python\na, b = map(int, input().split())\nprint(a + b)   \n```"
    assert v(rec(good, task)).passed is True
    wrong = v(rec("```python\nprint(3)\n```", task))
    assert wrong.passed is False and wrong.evidence.startswith("case 1")
    assert v(rec(good, {"domain": "code"})).passed is None  # no tests at all


def test_banned_imports_compare_dotted_names():
    def uses(src, banned):
        return banned_uses(ast.parse(src), banned)

    assert uses("import os.path", ("os.path",)) == ["os.path"]
    assert uses("from os import path", ("os.path",)) == ["os.path"]
    assert uses("import os\nos.path.join('a')", ("os.path",)) == ["os.path", "os.path.join"]
    assert uses("import os as o\no.path", ("os.path",)) == ["os.path"]
    assert uses("from os.path import join", ("os.path",)) == ["os.path.join"]
    assert uses("import os\nos.getcwd()", ("os.path",)) == []
    assert uses("import osmosis\nimport collections.abc", ("os", "collections.abc.x")) == []
    assert uses("from . import x", ()) == ["."]
    assert banned_uses(ast.parse("__import__('os')"), (), ()) == []
    assert banned_uses(ast.parse("__import__('os')")) == ["__import__()"]


F_MUL = "def f(a, b):\n    return a * b + 1\n"


def test_task_valid():
    assert task_valid({"program": F_MUL, "inputs": ["1, 2", "3, 4", "True, 5"]}).passed is True
    cases = {
        "parse": {"program": "def f(:", "inputs": ["1"]},
        "define f": {"program": "def g(a):\n    return a", "inputs": ["1"]},
        "banned": {"program": "import random\ndef f(a):\n    return random.random() + a", "inputs": ["1"]},
        "deterministic": {"program": "def f(s):\n    return list(set(s))",
                          "inputs": ["'abcdefghijklmnop'", "'qrstuvwxyz012345'"]},
        "same output": {"program": "def f(a):\n    return a % 2", "inputs": ["1", "3"]},
        "raises": {"program": "def f(a):\n    return 1 / a", "inputs": ["0", "1"]},
        "timeout": {"program": "def f(a):\n    while True:\n        pass", "inputs": ["1"]},
        "literals": {"program": F_MUL, "inputs": ["__import__('os'), 1"]},
    }
    for what, task in cases.items():
        v = task_valid(task)
        assert v.passed is False, (what, v)
    assert "deterministic" in task_valid(cases["deterministic"]).evidence
    assert "2 s" in task_valid(cases["timeout"]).evidence


def test_induction_verify():
    v = verifiers.get("induction")
    task = {"domain": "induction", "program": F_MUL, "inputs": ["1, 2", "2, 2"],
            "hidden_inputs": ["3, 4", "0, 9", "10, 10"], "message": "multiply and add one"}
    assert v(rec("```python\ndef f(x, y):\n    return 1 + x * y\n```", task)).passed is True
    miss = v(rec("```python\ndef f(x, y):\n    return x * y + 1 + (x == 3)\n```", task))
    assert miss.passed is False and miss.evidence.startswith("2/3")
    # An object whose __eq__ always says yes does not fool the canonical comparison.
    liar = ("```python\nclass Y:\n    def __eq__(self, o):\n        return True\n"
            "    __hash__ = object.__hash__\ndef f(x, y):\n    return Y()\n```")
    assert v(rec(liar, task)).passed is False
    assert v(rec("def f(x, y): return 1", task)).passed is False  # no fenced block


def test_gym_uses_reasoning_gym_score_answer():
    import reasoning_gym

    entry = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=3)[0]
    v = verifiers.get("gym:basic_arithmetic")
    task = {"domain": "gym", "entry": entry}
    assert v(rec(f"<answer>{entry['answer']}</answer>", task)).passed is True
    assert v(rec("<answer>not a number</answer>", task)).passed is False
    with pytest.raises(ValueError, match="no dataset"):
        verifiers.get("gym:no_such_dataset_xyz")


def test_registry_and_verify_many_parallel():
    @verifiers.register("always_yes_test")
    def _yes(record):
        return Verdict(True, "yes")

    assert verifiers.get("always_yes_test")(rec("x", {})).passed is True
    with pytest.raises(ValueError, match="not registered"):
        verifiers.get("nope")

    records = []
    for i in range(24):
        good = i % 2 == 0
        body = "return a + b" if good else "return a - b"
        records.append(rec(f"```python\ndef add(a, b):\n    {body}\n```", HE_TASK, "code"))
    records.append(rec(r"\boxed{7}", {"reference": "7"}, "math"))
    records.append(rec("x", {"domain": "unknown"}))
    t = time.perf_counter()
    verdicts = verifiers.verify_many(records, workers=2)
    dt = time.perf_counter() - t
    assert [v.passed for v in verdicts[:24]] == [i % 2 == 0 for i in range(24)]
    assert verdicts[24].passed is True and verdicts[25].passed is None
    inline = verifiers.verify_many(records, workers=0)
    assert [v.passed for v in inline] == [v.passed for v in verdicts]  # same answers inline
    print(f"verify_many: {len(records) / dt:.1f} records/s incl. worker start")
