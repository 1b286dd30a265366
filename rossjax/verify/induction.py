"""`induction` verifier: function-induction tasks in the Absolute Zero style.

A task is a Python function `f` (`task.program`), visible inputs with their outputs
(`task.inputs`), a message (`task.message`), and hidden inputs (`task.hidden_inputs`, required
and disjoint from the visible ones: a solver scored on the inputs it was shown could pass with a
lookup table). The solver sees the message and visible pairs and must write its own `f` (the
last ```python block of its last assistant message); it passes when its `f` reproduces the
reference `f` on every hidden input. rossjax.verify.induction_task builds such tasks from a
generator's output (AZR protocol: 10 inputs, 5 shown, 5 hidden). Each input is a string of
Python literal arguments, e.g. "[1, 2], 'a'" (parsed with ast.literal_eval — never eval).

Outputs are compared through a canonical form (sets and dicts sorted, types named), computed in
the sandbox's checker process from plain values (sandbox.run_checked: the program's f is called
through a proxy and only exact builtin values come back, so an object with a lying `__eq__` or a
builtin subclass is refused, and exiting, printing fake lines or patching anything in the
program's process changes nothing). Reference and solver run in separate sandboxes.
`task.hidden_outputs` (canonical strings) may be stored to save the reference run.

`task_valid(task)` screens generated tasks: the program parses, defines `f`, imports nothing
banned, runs deterministically (two separate runs, different hash seeds), every input succeeds
and yields a distinct output, and all of it finishes in 2 s. Banned names are full dotted module
paths compared on whole components: `os` bans `os` and `os.path`; `os.path` bans `os.path`,
`os.path.join`, `from os import path` and the attribute `os.path` — not `osmosis`.
"""

from __future__ import annotations

import ast

from rossjax.verify import pysource, sandbox
from rossjax.verify.answers import extract_code, last_assistant_content
from rossjax.verify.sandbox_wire import WireRefused, wire_enc
from rossjax.verify.verdict import Verdict

BANNED_MODULES = ("os", "sys", "subprocess", "shutil", "socket", "ctypes", "multiprocessing",
                  "threading", "signal", "importlib", "builtins", "pathlib", "io", "pickle",
                  "marshal", "random", "secrets", "time", "datetime", "inspect", "gc", "resource",
                  "asyncio", "tempfile", "glob", "uuid")
BANNED_CALLS = ("__import__", "eval", "exec", "compile", "open", "input", "globals", "locals",
                "vars", "breakpoint", "getattr", "setattr", "delattr")
TIME_LIMIT_S = 2.0

# Runs in the sandbox's checker process (sandbox.run_checked): `f` is a proxy of the program's
# f, so every value here is a plain builtin rebuilt from the wire, canonicalised by trusted code.
_CHECKER = '''
def _rj_canon(x, depth=0):
    if depth > 50:
        raise RecursionError("output nested too deeply")
    t = type(x)
    if t in (int, bool, str, bytes, float, complex, type(None)):
        return repr(x)
    if t in (list, tuple):
        return t.__name__ + "(" + ",".join(_rj_canon(v, depth + 1) for v in x) + ")"
    if t in (set, frozenset):
        return t.__name__ + "{" + ",".join(sorted(_rj_canon(v, depth + 1) for v in x)) + "}"
    if t is dict:
        return "dict{" + ",".join(sorted(_rj_canon(k, depth + 1) + ":" + _rj_canon(v, depth + 1)
                                         for k, v in x.items())) + "}"
    raise TypeError("not a plain value: " + t.__name__)


for _rj_args in _rj_decode(bytes.fromhex(_RJ_INPUTS)):
    if type(_rj_args) is str:  # the input did not parse (host side)
        _rj_report(repr([False, _rj_args, ""]))
        continue
    try:
        _rj_v = f(*_rj_args)
        _rj_res = [True, _rj_canon(_rj_v), repr(_rj_v)[:400]]
    except Exception as _rj_e:
        _rj_res = [False, getattr(_rj_e, "rj_name", type(_rj_e).__name__) + ": "
                   + str(_rj_e)[:200], ""]
    _rj_report(repr(_rj_res))
'''


def _run_f(program: str, inputs: list[str], timeout_s: float, shown: bool = False):
    """Canonical outputs of `f` on inputs in one sandboxed run: list of (ok, value) — with
    `shown`, (ok, value, repr) where repr is what a solver is shown — or (None, reason)."""
    args = []
    for s in inputs:
        try:
            args.append(_parse("(" + s + ",)", literal=True))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
            args.append(f"{type(e).__name__}: {str(e)[:200]}")
    try:
        blob = wire_enc(args)
    except WireRefused as e:
        return None, f"an input cannot be passed to f: {e}"
    checker = f"_RJ_INPUTS = {blob.hex()!r}\n{_CHECKER}"
    res, reports = sandbox.run_checked(program, checker, "f", timeout_s)
    if not res.ok:
        return None, res.reason
    if len(reports) != len(inputs):
        return None, f"the run reported {len(reports)} of {len(inputs)} outputs"
    rows = [pysource.literal_eval(r) for r in reports]
    return [tuple(r) if shown else tuple(r[:2]) for r in rows], None


def _defines_f(tree: ast.Module) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "f"
               for n in tree.body)


def _is_banned(name: str, banned) -> bool:
    return any(name == b or name.startswith(b + ".") for b in banned)


def banned_uses(tree: ast.AST, banned_modules=BANNED_MODULES, banned_calls=BANNED_CALLS) -> list[str]:
    """Full dotted names of banned imports/attributes and banned builtin calls in the tree."""
    found, alias = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:  # `import a.b as x` binds x to a.b
                    alias[a.asname] = a.name
                else:  # `import a.b` binds a
                    alias[a.name.split(".")[0]] = a.name.split(".")[0]
                if _is_banned(a.name, banned_modules):
                    found.append(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append("." * node.level + (node.module or ""))
                continue
            for a in node.names:
                full = f"{node.module}.{a.name}"
                alias[a.asname or a.name] = full
                if _is_banned(node.module, banned_modules) or _is_banned(full, banned_modules):
                    found.append(full)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in banned_calls:
                found.append(node.func.id + "()")
    # `import os` then `os.path.join`: resolve attribute chains through the aliases.
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, cur = [], node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in alias:
                full = ".".join([alias[cur.id], *reversed(chain)])
                if _is_banned(full, banned_modules):
                    found.append(full)
    return sorted(set(found))


def _parse(source: str, literal: bool = False):
    """pysource's parse or literal_eval (one lock, SyntaxWarnings silenced)."""
    return pysource.literal_eval(source) if literal else pysource.parse(source)


def task_valid(task: dict, banned_modules=BANNED_MODULES) -> Verdict:
    """Verdict(True, ...) if a generated task is usable (see module doc), else (False, reason)."""
    program, inputs = task.get("program"), task.get("inputs")
    if not isinstance(program, str):
        return Verdict(False, "task.program must be Python source defining f")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(s, str) for s in inputs):
        return Verdict(False, "task.inputs must be a non-empty list of argument strings")
    try:
        tree = _parse(program)
    except SyntaxError as e:
        return Verdict(False, f"program does not parse: {e.msg} (line {e.lineno})")
    if not _defines_f(tree):
        return Verdict(False, "program does not define a top-level function f")
    bad = banned_uses(tree, banned_modules)
    if bad:
        return Verdict(False, f"program uses banned names: {', '.join(bad)}")
    for s in inputs:
        try:
            _parse("(" + s + ",)", literal=True)
        except (ValueError, SyntaxError):
            return Verdict(False, f"input {s[:60]!r} is not a list of Python literals")
    runs = []
    for _ in range(2):
        outs, why = _run_f(program, inputs, TIME_LIMIT_S)
        if outs is None:
            return Verdict(False, f"reference run failed: {why}")
        runs.append(outs)
    for s, (ok, val) in zip(inputs, runs[0]):
        if not ok:
            return Verdict(False, f"f raises on input {s[:60]!r}: {val}")
    if runs[0] != runs[1]:
        return Verdict(False, "f is not deterministic: two runs gave different outputs")
    values = [v for _, v in runs[0]]
    if len(set(values)) != len(values):
        return Verdict(False, "two inputs give the same output; each input must be informative")
    return Verdict(True, f"valid: {len(inputs)} inputs, deterministic, distinct outputs")


def verify(record: dict) -> Verdict:
    task = record.get("task") or {}
    program = task.get("program")
    hidden = task.get("hidden_inputs")
    if not isinstance(program, str) or not hidden:
        return Verdict(None, "task.program and task.hidden_inputs are required (the solver is "
                             "scored on inputs it was not shown)")
    if set(hidden) & set(task.get("inputs") or ()):
        return Verdict(None, "task.hidden_inputs repeat visible inputs; a lookup table would pass")
    content = last_assistant_content(record)
    code = extract_code(content) if content else None
    if code is None:
        return Verdict(False, "no ```python block in the last assistant message")
    try:
        if not _defines_f(_parse(code)):
            return Verdict(False, "the answer does not define a top-level function f")
    except SyntaxError as e:
        return Verdict(False, f"the answer does not parse: {e.msg} (line {e.lineno})")
    want = task.get("hidden_outputs")
    if want is None:
        ref, why = _run_f(program, hidden, TIME_LIMIT_S * 2)
        if ref is None:
            return Verdict(None, f"reference f failed: {why}")
        want = [v for _, v in ref]
    got, why = _run_f(code, hidden, TIME_LIMIT_S * 2)
    if got is None:
        return Verdict(False, f"solver f failed: {why}")
    wrong = [i for i, ((ok, v), w) in enumerate(zip(got, want)) if not ok or v != w]
    n = len(hidden)
    if wrong:
        return Verdict(False, f"{n - len(wrong)}/{n} hidden inputs reproduced; first miss: input "
                              f"{hidden[wrong[0]][:60]!r}")
    return Verdict(True, f"{n}/{n} hidden inputs reproduced")
