"""Python source to an AST, under one process-wide lock.

CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state, so two
threads parsing at once can fail with a spurious `SystemError: AST constructor recursion depth
mismatch` (cpython gh-106905; seen here when two threads ran `sandbox.run_tests` over
HumanEval). Verifiers and agent tools parse from thread pools, so every parse of theirs goes
through here. SyntaxWarnings of model-written code ("invalid decimal literal" for `1if`) are
silenced: a verdict reports what matters, the log stays quiet.
"""

from __future__ import annotations

import ast
import threading
import warnings

_LOCK = threading.RLock()  # re-entrant: a finalizer run inside a parse may parse too


def parse(source: str, mode: str = "exec") -> ast.AST:
    with _LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(source, mode=mode)


def literal_eval(source: str):
    with _LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.literal_eval(source)
