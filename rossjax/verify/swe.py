"""PROPEL's SWE domain, CPU half: a repository's pytest suite run in the sandbox, the verifier
of a bug-writing task, and the check of a solver's fix.

The generator's artifact is a unified diff against the clean repository (rossjax.verify.repo.
unified_diff writes it from a bash episode's final scratch copy; a diff from elsewhere works
the same). `verify_bug(base, patch)` passes iff, in order:
  1. the patch applies: GNU `patch -p1 --forward`, run inside the sandbox over a fresh copy;
  2. it changes only existing non-test Python files: no test file (under tests/ or test/,
     test_*.py, *_test.py, conftest.py), no pytest or packaging config, no file added or
     deleted, no link (an added conftest.py, pytest.py or sitecustomize.py could steer the run);
  3. the suite still runs: pytest exits 0 or 1 within the time limit and reports exactly one
     outcome for every test the clean suite collected (a collection error, a crash, a hang, a
     missing or a repeated test id is `suite_broken`);
  4. at least one test that passes on the clean repository now fails (FAILED or ERROR).
Each failure is one reason, "<code>: <detail>". The suite always runs on a tree written afresh
from the repository's text files (no bytecode or cache of an agent's making is carried in).
Code under test runs inside pytest's process, so it could in principle forge pytest's report;
the kernel sandbox bounds what it can reach, not what it prints (as for any in-process runner).
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
    shell_env,
    write_tree,
)
from rossjax.verify.verdict import Verdict

PYTEST = "python -m pytest -q -rA --color=no -p no:cacheprovider"
APPLY = "patch -p1 --batch --forward --no-backup-if-mismatch --reject-file=- --silent"
CONFIG = frozenset({"pyproject.toml", "setup.cfg", "setup.py", "pytest.ini", "tox.ini"})
MAX_PATCH = 1 << 20
_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S.*?)(?: - .*)?$")
_FAILS = ("FAILED", "ERROR")


def is_test_path(rel: str) -> bool:
    parts = rel.replace(os.sep, "/").split("/")
    name = parts[-1]
    return (any(p in ("tests", "test") for p in parts[:-1]) or name == "conftest.py"
            or name.startswith("test_") or name.endswith("_test.py"))


def may_change(rel: str) -> bool:
    """Only existing non-test Python source files may change, by a bug or by a fix."""
    return rel.endswith(".py") and not is_test_path(rel) and rel not in CONFIG


@dataclass(frozen=True)
class Suite:
    outcomes: dict  # test id -> PASSED / FAILED / ERROR / SKIPPED / XFAIL / XPASS
    exit_code: int | None
    reason: str | None  # why the suite did not run as a suite (None when it did)
    tail: str = ""  # the last lines of pytest's output, for a reason's detail


def _parse(stdout: str) -> tuple[dict, str | None]:
    out, twice = {}, None
    for line in stdout.splitlines():
        m = _LINE.match(line)
        if not m or "::" not in m.group(2) and m.group(1) in ("PASSED", "FAILED"):
            continue
        if m.group(2) in out:
            twice = m.group(2)
        out[m.group(2)] = m.group(1)
    return out, twice


def run_suite(files: dict[str, str], *, timeout_s: float = 30.0,
              limits: sandbox.Limits | None = None, read_roots=None) -> Suite:
    """pytest over a fresh tree written from `files`, in the sandbox."""
    roots = default_read_roots() if read_roots is None else tuple(read_roots)
    tmp = tempfile.mkdtemp(prefix="rossjax-swe-")
    try:
        os.chmod(tmp, 0o711)
        work = os.path.join(tmp, "repo")
        write_tree(files, work)
        r = sandbox.run_shell(PYTEST, work, timeout_s, limits=limits or _LIMITS,
                              read_roots=roots, env=shell_env(roots))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tail = " | ".join(ln for ln in r.stdout.strip().splitlines()[-3:])[-300:]
    outcomes, twice = _parse(r.stdout)
    if r.reason and not r.reason.startswith("exit_code"):
        return Suite(outcomes, r.returncode, r.reason, tail)
    if r.returncode not in (0, 1):
        said = tail or r.stderr[-200:]
        return Suite(outcomes, r.returncode, f"pytest exited {r.returncode} ({said})", tail)
    if twice:
        return Suite(outcomes, r.returncode, f"test {twice} is reported twice", tail)
    return Suite(outcomes, r.returncode, None, tail)


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
    """(the patched files, None) or (None, why): `patch -p1` inside the sandbox."""
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
    missing = [t for t in base.tests if t not in suite.outcomes]
    if missing:
        return [], (f"suite_broken: {len(missing)} of {len(base.tests)} tests no longer run "
                    f"(first {missing[0]}; {suite.tail})")
    return [t for t in base.tests if suite.outcomes[t] in _FAILS], None


def verify_bug(base: Baseline, patch: str, *, timeout_s: float = 30.0) -> Verdict:
    """The bug-writing verifier (module doc): True, False with the first reason, or None when
    the sandbox itself failed."""
    after, why = apply_patch(base.files, patch)
    if after is None:
        return Verdict(None if why.startswith("sandbox_error") else False, why)
    why = change_fault(base.files, after)
    if why:
        return Verdict(False, why)
    suite = run_suite(after, timeout_s=timeout_s)
    if suite.reason and suite.reason.startswith("sandbox_error"):
        return Verdict(None, suite.reason)
    fails, why = _failing(base, suite)
    if why:
        return Verdict(False, why)
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
    suite = run_suite(after, timeout_s=timeout_s)
    if suite.reason and suite.reason.startswith("sandbox_error"):
        return Verdict(None, suite.reason)
    fails, why = _failing(base, suite)
    if why:
        return Verdict(False, why)
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
