"""Which names a task's tests call that the task itself does not define (issue 36 item 4).

A HumanEval-style check runs in the sandbox's checker with only the entry point bound to the
program (sandbox_harness.harness_check); every other name the tests use must come from the
tests, the trusted prefix (the task's prompt or code_prefix) or the builtins. `unbound` names
those that come from nowhere, so a caller can call the task invalid instead of letting the
program's own copy of a helper (HumanEval's `encode_cyclic`, `poly`) judge it.
"""

from __future__ import annotations

import ast
import builtins

from rossjax.verify import pysource

HARNESS = frozenset({"__name__", "_rj_report", "_rj_decode"})  # what the checker binds itself


def parses(text) -> ast.Module | None:
    """The module `text` parses to, or None (not a str, or not Python)."""
    if not isinstance(text, str):
        return None
    try:
        return pysource.parse(text)
    except (SyntaxError, ValueError):
        return None


def loaded(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def bound(tree: ast.AST) -> set[str]:
    """Every name a source binds anywhere (scopes merged: a coarse but safe over-approximation
    of what its calls can find; "*" for a star import)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {a.asname or a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            out.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            out.add(n.rest)
    return out


def unbound(tests: ast.AST, prefix: ast.AST | None, entry: str) -> list[str]:
    """The names `tests` load that neither they, `prefix`, the builtins, the checker nor the
    entry point bind (sorted); [] when a star import makes the answer unknown (the checker
    then decides)."""
    known = bound(tests) | (bound(prefix) if prefix is not None else set()) | {entry}
    if "*" in known:
        return []
    return sorted(n for n in loaded(tests) - known
                  if not hasattr(builtins, n) and n not in HARNESS)
