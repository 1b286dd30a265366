"""`code` verifier: run the rollout's program in the sandbox against the task's tests.

The program is the last ```python block of the last assistant message (answers.py). The task
carries one of two test styles:
  - HumanEval: `task.tests` (source defining `check(candidate)`), `task.entry_point`, and an
    optional `task.code_prefix` (e.g. the HumanEval prompt with imports and signature; when absent,
    `task.prompt` is used if it is code: it parses and defines `<entry_point>` at top level, the
    HumanEval stub shape; a prose prompt that mentions `def add(` is never a prefix). The
    program is `code_prefix + program` — joined directly when the program is an indented body
    continuation, on a new line when it is a full definition (which then replaces the stub);
  - stdin/stdout: `task.cases = [{"input": str, "output": str}, ...]`; each case is a separate
    sandboxed run, and outputs compare line by line with trailing whitespace ignored, here in
    the host (the program's exit status alone proves nothing).
The HumanEval tests run in the sandbox's checker process (sandbox.py): the program cannot end,
fake or override the verdict. The prefix runs there too, and only the entry point is the
program's: the tests' helpers (HumanEval's `poly`, `encode_cyclic`) are the task's, so a program
that redefines one is judged on the task's version. Tests that call a name neither they, the
prefix, the builtins nor the entry point define make the task invalid (Verdict None, naming it):
the program's own copy of a helper would judge it. Optional `task.timeout_s` (default
10) bounds each run, capped at `MAX_TIMEOUT_S` (a longer one runs with the cap, and says so).
"""

from __future__ import annotations

import ast
import math

from rossjax.verify import sandbox
from rossjax.verify.answers import extract_code, last_assistant_content
from rossjax.verify.helper_names import parses as _parses, unbound
from rossjax.verify.verdict import Verdict

MAX_TIMEOUT_S = sandbox.Limits().max_timeout_s  # a row's task.timeout_s is capped here


def _norm(out: str) -> list[str]:
    lines = [ln.rstrip() for ln in out.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def program_of(record: dict) -> str | None:
    content = last_assistant_content(record)
    return None if content is None else extract_code(content)


def verify(record: dict) -> Verdict:
    task = record.get("task") or {}
    code = program_of(record)
    if code is None:
        return Verdict(False, "no ```python block in the last assistant message")
    timeout, note = _timeout(task.get("timeout_s"))
    if timeout is None:
        return Verdict(None, note)
    if task.get("tests") and task.get("entry_point"):
        entry = task["entry_point"]
        if not str(entry).isidentifier():
            return Verdict(None, f"task.entry_point {entry!r} is not a Python name")
        prefix, trusted, why = _prefix(task, entry)
        if why:
            return Verdict(None, why)
        program = prefix + code if code[:1] in (" ", "\t") else f"{prefix}\n{code}"
        v = sandbox.run_tests(program, task["tests"], entry, timeout_s=timeout,
                              prefix=trusted or None)
        return Verdict(v.passed, v.evidence + note)
    cases = task.get("cases")
    if not cases:
        return Verdict(None, "task has neither tests+entry_point nor stdin/stdout cases")
    for i, case in enumerate(cases):
        res = sandbox.run(code, stdin=str(case.get("input", "")), timeout_s=timeout)
        if not res.ok:
            return Verdict(False, f"case {i}: {res.reason}{note}")
        if _norm(res.stdout) != _norm(str(case.get("output", ""))):
            got = res.stdout.strip().splitlines()[:1]
            return Verdict(False, f"case {i}: wrong output (first line {got[0][:60]!r} )"
                           if got else f"case {i}: no output")
    return Verdict(True, f"{len(cases)}/{len(cases)} stdin/stdout cases passed{note}")


def _timeout(value) -> tuple[float | None, str]:
    """(seconds per run, a note for the evidence) from task.timeout_s; (None, why) if unusable."""
    if value is None or value == "":
        return 10.0, ""
    try:
        t = float(value)
    except (TypeError, ValueError):
        return None, f"task.timeout_s {value!r} is not a number of seconds"
    if not (t > 0 and math.isfinite(t)):
        return None, f"task.timeout_s {value!r} must be a positive number of seconds"
    if t > MAX_TIMEOUT_S:
        return MAX_TIMEOUT_S, (f" (task.timeout_s {t:g} capped at {MAX_TIMEOUT_S:g} s, "
                               "sandbox.Limits.max_timeout_s)")
    return t, ""


def _prefix(task: dict, entry: str) -> tuple[str, str, str | None]:
    """(the program's prefix, the checker's trusted prefix, None) or ("", "", why the task is
    invalid). `code_prefix` is code by contract (a signature without a body is completed with
    `pass` for the checker); `prompt` only when it is code defining the entry point."""
    tests = _parses(str(task["tests"]))
    if tests is None:
        return "", "", "task.tests is not Python (it does not parse)"
    prefix, tree = task.get("code_prefix"), None
    if prefix is not None:
        prefix = str(prefix)
        trusted = next((t for t in (prefix, prefix.rstrip() + "\n    pass\n")
                        if (tree := _parses(t)) is not None), None)
        if trusted is None:
            return "", "", "task.code_prefix is not Python (it does not parse)"
    else:
        prompt = task.get("prompt")
        tree = _parses(prompt)
        if tree is not None and any(
                isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry
                for n in tree.body):
            prefix = trusted = prompt
        else:
            prefix, trusted, tree = "", "", None
    missing = unbound(tests, tree, entry)
    if missing:
        where = ("task.code_prefix" if task.get("code_prefix") is not None else "task.prompt"
                 if trusted else f"no code_prefix, and task.prompt is no code defining {entry}()")
        return "", "", (f"task.tests call {', '.join(missing[:5])}, which the task does not "
                        f"define ({where}): only the entry point may come from the program")
    return prefix, trusted, None
