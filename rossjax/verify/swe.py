"""PROPEL's SWE domain, CPU half: a repository's pytest suite run in the sandbox, the verifier
of a bug-writing task, and the check of a solver's fix.

The generator's artifact is a unified diff against the clean repository (rossjax.verify.repo.
unified_diff writes it from a bash episode's final scratch copy; a diff from elsewhere works
the same). `verify_bug(base, patch)` passes iff, in order:
  1. the patch applies: `git apply --recount -p1`, as PROPEL, inside the sandbox over a fresh
     copy (all hunks or nothing);
  2. it changes only existing non-test Python files: no test file (under tests/ or test/,
     test_*.py, *_test.py, conftest.py), no pytest or packaging config, no file added or
     deleted, no link (an added conftest.py, pytest.py or sitecustomize.py could steer the run);
  3. the suite still runs: pytest returns 0 or 1 within the time limit with an outcome for
     every test the clean suite collected (a collection error, a hang, a missing or skipped
     test is `suite_broken`), and the package's process answered every call (below);
  4. at least one test that passes on the clean repository now fails (FAILED or ERROR).
Each failure is one reason, "<code>: <detail>". `check_fix` passes iff a solver's copy changes
only such files against the buggy tree and every clean test passes.

How a suite runs (`run_suite`, sandbox.run_pytest): the repository's non-test files are the
program, imported only in the sandbox's program process, which serves its functions; pytest
runs the CLEAN repository's test files (never the patched or solver copy's) in the checker
process, where `import <package>` is a proxy module whose functions forward each call over a
pipe. Arguments and results cross as exact builtin values (a value of the package's own class
or a builtin subclass is refused); an exception crosses as its nearest builtin class with the
message, so `pytest.raises(ValueError)` works. Outcomes come from the checker's own pytest
hooks over a descriptor only it holds, so nothing the package does — `os._exit(0)` or
`sys.exit` at import or in a call, patching `_pytest` (pytest is not even importable there),
fake result lines on any descriptor, killing its parent, an always-equal return value — turns
into a pass. What it does instead is named: a package whose process exits, is refused by the
sandbox, garbles its reply pipe or returns what cannot cross fails every call from then on,
which is `suite_broken` for a bug (a bug that kills the process on import or returns objects
is not a failing test) and a failed fix. Consequences for repositories: the package runs on
the stdlib alone (`python -I -S`); tests reach it through functions and plain values (no
classes or instances across the boundary, no in-place mutation of arguments seen by the test,
no `tmp_path`: the checker writes nothing); data/swe/ holds such repositories.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import re
import shutil
import tempfile
from dataclasses import dataclass

from rossjax.errors import InputError
from rossjax.verify import sandbox
from rossjax.verify.repo import (
    RepoError,
    changed,
    default_read_roots,
    read_tree,
    write_tree,
)
from rossjax.verify.verdict import Verdict

# As PROPEL applies patches: `git apply --recount` (hunk line counts are re-read from the body,
# so a hand-edited diff with wrong @@ counts still applies; no fuzz, no half-applied patch).
# The scratch copy is no repository: discovery stops at its parent, no user or system config.
APPLY = ('GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" GIT_CONFIG_NOSYSTEM=1 '
         'GIT_CONFIG_GLOBAL=/dev/null git apply --recount -p1 --whitespace=nowarn')
CONFIG = frozenset({"pyproject.toml", "setup.cfg", "setup.py", "pytest.ini", "tox.ini"})
MAX_PATCH = 1 << 20
_FAILS = ("FAILED", "ERROR")
_RAN = ("PASSED", "FAILED", "ERROR", "XFAIL", "XPASS")  # SKIPPED: the test no longer runs


def is_test_path(rel: str) -> bool:
    parts = rel.replace(os.sep, "/").split("/")
    name = parts[-1]
    return (any(p in ("tests", "test") for p in parts[:-1]) or name == "conftest.py"
            or name.startswith("test_") or name.endswith("_test.py"))


def may_change(rel: str) -> bool:
    """Only existing non-test Python source files may change, by a bug or by a fix."""
    return rel.endswith(".py") and not is_test_path(rel) and rel not in CONFIG


def trusted_files(files: dict) -> dict:
    """What the checker runs: the test files and pytest/packaging config."""
    return {p: t for p, t in files.items() if is_test_path(p) or p in CONFIG}


def package_modules(files: dict) -> list[str]:
    """The top-level module names the repository's own code defines (what a test imports)."""
    tops = set()
    for rel in files:
        parts = rel.replace(os.sep, "/").split("/")
        if not rel.endswith(".py") or is_test_path(rel) or rel in CONFIG:
            continue
        name = parts[0][:-3] if len(parts) == 1 else parts[0]
        if name.isidentifier():
            tops.add(name)
    return sorted(tops)


@dataclass(frozen=True)
class Suite:
    outcomes: dict  # test id -> PASSED / FAILED / ERROR / SKIPPED / XFAIL / XPASS
    exit_code: int | None
    reason: str | None  # why the suite did not run as a suite (None when it did)
    tail: str = ""  # the first failure's detail, from the checker's report


# The program process's side of a suite run: the package's files written into the scratch
# dir and imported on the checker's request, each function served by name (sandbox_pytest.py).
# It runs with the package, so it is no more trusted than the package: the checker takes
# nothing from it but plain values.
_DRIVER = """\
import builtins as _builtins
import importlib as _importlib
import os as _os
import sys as _sys

_sys.dont_write_bytecode = True
for _rel, _text in {files!r}.items():
    _path = _os.path.join("pkg", _rel)
    _os.makedirs(_os.path.dirname(_path), exist_ok=True)
    with open(_path, "w", encoding="utf-8") as _f:
        _f.write(_text)
_sys.path.insert(0, _os.path.abspath("pkg"))
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _plain(v, d=0):
    t = type(v)
    if t in _PLAIN:
        return True
    if d > 50 or t not in (list, tuple, set, frozenset, dict):
        return False
    items = [x for kv in v.items() for x in kv] if t is dict else list(v)
    return all(_plain(x, d + 1) for x in items)


def _serve(module, attr):
    def call(*args, **kwargs):
        try:
            return getattr(module, attr)(*args, **kwargs)
        except Exception as e:  # the nearest builtin class crosses (its name is all that does)
            base = next(k for k in type(e).__mro__ if getattr(_builtins, k.__name__, 0) is k)
            if base is type(e):
                raise
            raise base(f"{{type(e).__name__}}: {{e}}") from None
    return call


def __rj_import__(name):
    module = _importlib.import_module(name)
    table = {{}}
    for attr, value in list(vars(module).items()):
        if attr.startswith("__") and attr != "__all__":
            continue
        if isinstance(value, type(_sys)):
            table[attr] = ("m", getattr(value, "__name__", ""))
        elif callable(value):
            table[attr] = ("f", None)
            globals()[name + "." + attr] = _serve(module, attr)
        elif _plain(value):
            table[attr] = ("v", value)
    return table
"""


def suite_program(files: dict) -> str:
    """The program of a suite run over `files` (the repository's non-test files)."""
    return _DRIVER.format(files={p: t for p, t in sorted(files.items()) if not is_test_path(p)})


def run_suite(files: dict[str, str], *, tests: dict | None = None, timeout_s: float = 30.0,
              limits: sandbox.Limits | None = None, read_roots=None) -> Suite:
    """The suite of `tests` (default: the test files of `files`; pass the clean repository's)
    against the package of `files`, in the sandbox: the package in the program process, pytest
    in the checker (sandbox.run_pytest). A program that exits, hangs up or sends what cannot
    cross is `reason` "the package's process ...": its calls failed, nothing was judged."""
    roots = default_read_roots() if read_roots is None else tuple(read_roots)
    tests = trusted_files(files) if tests is None else trusted_files(tests)
    res, lines = sandbox.run_pytest(suite_program(files), tests, package_modules(files),
                                    timeout_s, limits=limits or _LIMITS, site=_site(roots))
    outcomes, broken, code, first = {}, None, None, ""
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "t":
            outcome, _, rest = rest.partition(" ")
            nodeid, _, detail = rest.partition("\t")
            outcomes[nodeid] = outcome
            if outcome in _FAILS and not first:
                first = f"{nodeid}: {detail}" if detail else nodeid
        elif kind == "broken" and broken is None:
            broken = rest
        elif kind == "exit" and rest.lstrip("-").isdigit():
            code = int(rest)
    tail = first[-300:]
    if not res.ok:
        return Suite(outcomes, code, res.reason, tail)
    if broken is not None:
        if broken.startswith("checker_error"):  # the tests pass what cannot cross
            return Suite(outcomes, code, broken[:300], tail)
        status = "" if res.returncode is None else f"; its exit status {res.returncode}"
        return Suite(outcomes, code, f"the package's process failed the checker's calls: "
                                     f"{broken[:300]}{status}", tail)
    if code not in (0, 1):
        return Suite(outcomes, code, f"pytest exited {code} ({tail or 'no test ran'})", tail)
    return Suite(outcomes, code, None, tail)


def _site(roots) -> list[str]:
    """The site-packages dirs below `roots` (where pytest is installed)."""
    import glob
    out = []
    for r in roots:
        out += sorted(glob.glob(os.path.join(r, "lib", "python*", "site-packages")))
    if not out:
        import pytest  # noqa: F401 (its location is the site dir)
        out = [os.path.dirname(os.path.dirname(os.path.abspath(pytest.__file__)))]
    return out


_LIMITS = sandbox.Limits(procs=64, memory_mb=2048, output_bytes=4 << 20)


@dataclass(frozen=True)
class Baseline:
    """A clean repository: its files and its suite, every test passing."""

    name: str
    files: dict
    tests: tuple  # the test ids, all PASSED on the clean tree


_CACHE: dict = {}


def baseline(repo_dir: str, *, timeout_s: float = 30.0) -> Baseline:
    """The clean repository at `repo_dir`; refused unless its suite runs and every test passes
    (a task must start from a green suite). Cached per content."""
    files = read_tree(repo_dir)
    if not any(is_test_path(p) and p.endswith(".py") for p in files):
        raise InputError(f"{repo_dir}: no test file (tests/*.py, test_*.py)")
    key = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()
    if key not in _CACHE:
        s = run_suite(files, timeout_s=timeout_s)
        if s.reason:
            raise InputError(f"{repo_dir}: the clean suite does not run: {s.reason}")
        bad = sorted(t for t, o in s.outcomes.items() if o != "PASSED")
        if bad or not s.outcomes:
            raise InputError(f"{repo_dir}: the clean suite must pass whole; "
                             + (f"{bad[0]} is {s.outcomes[bad[0]]}" if bad else "no test ran"))
        _CACHE[key] = Baseline(os.path.basename(os.path.normpath(repo_dir)), files,
                               tuple(sorted(s.outcomes)))
    return _CACHE[key]


def apply_patch(files: dict[str, str], patch: str) -> tuple[dict | None, str | None]:
    """(the patched files, None) or (None, why): `git apply --recount` inside the sandbox."""
    if not isinstance(patch, str) or not patch.strip():
        return None, "invalid_patch: the patch is empty or not text"
    if len(patch) > MAX_PATCH:
        return None, f"invalid_patch: the patch is over {MAX_PATCH} characters"
    tmp = tempfile.mkdtemp(prefix="rossjax-swe-")
    try:
        os.chmod(tmp, 0o711)
        work = os.path.join(tmp, "repo")
        write_tree(files, work)
        r = sandbox.run_shell(APPLY, work, 20.0, limits=_LIMITS, stdin=patch)
        if r.reason and r.reason.startswith("sandbox_error"):
            return None, r.reason
        if not r.ok:
            said = (r.stdout + r.stderr).strip().splitlines()
            return None, f"patch_does_not_apply: {(said[-1] if said else r.reason)[:200]}"
        try:
            return read_tree(work), None
        except RepoError as e:
            return None, f"forbidden_change: {str(e).split(': ', 1)[-1]}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def change_fault(before: dict, after: dict) -> str | None:
    """Why `after` is not an allowed change of `before` (None when it is)."""
    diff = changed(before, after)
    if not diff:
        return "no_change: the patch changes no file"
    for rel, how in diff.items():
        if how != "modified":
            return (f"forbidden_change: {rel} is {how} (only existing non-test .py files "
                    "may change)")
        if not may_change(rel):
            kind = "a test file" if is_test_path(rel) else "not Python source"
            return (f"forbidden_change: {rel} is {kind} (only existing non-test .py files "
                    "may change)")
    return None


def _failing(base: Baseline, suite: Suite) -> tuple[list, str | None]:
    """The baseline tests that fail now, or why the suite did not run."""
    if suite.reason:
        return [], f"suite_broken: {suite.reason}"
    missing = [t for t in base.tests if suite.outcomes.get(t) not in _RAN]
    if missing:
        return [], (f"suite_broken: {len(missing)} of {len(base.tests)} tests no longer run "
                    f"(first {missing[0]}; {suite.tail})")
    return [t for t in base.tests if suite.outcomes[t] in _FAILS], None


def _graded(base: Baseline, after: dict, timeout_s: float):
    """(failing test ids, None), or (None, the Verdict that ends grading): the clean suite over
    `after`, a sandbox or checker failure undecided, a broken suite False."""
    suite = run_suite(after, tests=base.files, timeout_s=timeout_s)
    if suite.reason and suite.reason.startswith(("sandbox_error", "checker_error")):
        return None, Verdict(None, suite.reason)
    fails, why = _failing(base, suite)
    return (None, Verdict(False, why)) if why else (fails, None)


def verify_bug(base: Baseline, patch: str, *, timeout_s: float = 30.0) -> Verdict:
    """The bug-writing verifier (module doc): True, False with the first reason, or None when
    the sandbox itself failed."""
    after, why = apply_patch(base.files, patch)
    if after is None:
        return Verdict(None if why.startswith("sandbox_error") else False, why)
    why = change_fault(base.files, after)
    if why:
        return Verdict(False, why)
    fails, ended = _graded(base, after, timeout_s)
    if ended:
        return ended
    if not fails:
        return Verdict(False, f"no_failing_test: all {len(base.tests)} tests still pass")
    return Verdict(True, f"{len(fails)} of {len(base.tests)} tests now fail: "
                         + ", ".join(fails[:5]) + (" ..." if len(fails) > 5 else ""))


def check_fix(base: Baseline, buggy: dict, workdir: str, *, timeout_s: float = 30.0) -> Verdict:
    """A solver's fix, the final state of `workdir` (a scratch copy of the buggy repository):
    only non-test .py files changed against the buggy tree, and every test of the clean suite
    passes."""
    try:
        after = read_tree(workdir)
    except RepoError as e:
        return Verdict(False, f"forbidden_change: {str(e).split(': ', 1)[-1]}")
    why = change_fault(buggy, after)
    if why and not why.startswith("no_change"):
        return Verdict(False, why)
    fails, ended = _graded(base, after, timeout_s)
    if ended:
        return ended
    if fails:
        return Verdict(False, f"tests_fail: {len(fails)} of {len(base.tests)} still fail "
                              f"(first {fails[0]})")
    return Verdict(True, f"all {len(base.tests)} tests pass")


def repo_dir(repo: str) -> str:
    """A repository directory, or the name of one shipped in data/swe/ (e.g. "textkit")."""
    if os.path.isdir(repo):
        return repo
    if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", repo or ""):
        shipped = importlib.resources.files("rossjax") / "data" / "swe" / repo
        if shipped.is_dir():
            return os.path.realpath(str(shipped))
    raise InputError(f"SWE repository {repo!r} is neither a directory nor one shipped in "
                     "data/swe/")


def verify(record: dict) -> Verdict:
    """Registry entry "swe": the row's `patch` against the clean repository `task.repo` (a
    directory or a shipped name), as verify_bug judges it; a row without either is undecided."""
    repo = (record.get("task") or {}).get("repo")
    if not isinstance(repo, str):
        return Verdict(None, "swe: the record has no task.repo")
    if "patch" not in record:
        return Verdict(None, "swe: the record has no patch")
    try:
        base = baseline(repo_dir(repo))
    except InputError as e:
        return Verdict(None, f"swe: {e}")
    return verify_bug(base, record["patch"])
