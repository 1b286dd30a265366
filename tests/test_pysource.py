"""Every parse of model-written Python in verify/ and agents/ holds pysource's lock: CPython 3.11
can fail two threads parsing at once with a spurious SystemError (cpython gh-106905), which made
test_sandbox's HumanEval check (two threads of run_tests) fail once on an AMD EPYC."""

import ast
import concurrent.futures as cf

from rossjax.agents import builtin
from rossjax.verify import helper_names, induction, pysource


def test_parses_of_verifiers_and_tools_hold_the_lock(monkeypatch):
    real, seen = ast.parse, []

    def checked(*a, **kw):
        seen.append(pysource._LOCK._is_owned())
        return real(*a, **kw)

    monkeypatch.setattr(ast, "parse", checked)
    assert helper_names.parses("def f(x):\n    return x\n") is not None
    assert helper_names.parses("def f(:") is None
    assert induction.task_valid({"program": "def f(x):\n    return x + 1\n",
                                 "inputs": ["1", "2"]}).passed
    assert pysource.literal_eval("[1, (2, 'a')]") == [1, (2, "a")]
    assert builtin.evaluate("2 * (3 + 4)") == 14
    assert len(seen) >= 5 and all(seen), seen
    assert not pysource._LOCK._is_owned()  # released after each parse


def test_parses_from_many_threads_at_once():
    deep = "x = " + "(" * 60 + "1" + ")" * 60 + "\n" + "def g():\n    return [i for i in range(3)]\n"
    with cf.ThreadPoolExecutor(8) as ex:
        trees = list(ex.map(lambda _: pysource.parse(deep), range(400)))
    assert all(isinstance(t, ast.Module) for t in trees)
