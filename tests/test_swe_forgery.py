"""SWE verdicts a patched package cannot forge (rossjax/verify/swe.py, sandbox_pytest.py).

The package runs in the sandbox's program process; pytest runs the clean tests in the checker
process with the package behind proxies, and each outcome comes from the checker's own hooks
over the report descriptor only it holds. Each forgery is tried two ways:
  - as a solver's "fix" of a real bug (the bug left in place): check_fix must not say it passes;
  - as a generator's "bug" over the clean tree: verify_bug must not say tests now fail because
    of the forgery; a process that dies or refuses to answer is `suite_broken`, never a bug.
Run in the host's own mode (root here), with layers switched off, and as uid 65534 (Landlock).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from rossjax.verify import repo as rrepo, sandbox, swe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "data", "swe")
CORE = "textkit/core.py"
GOOD_LINE = "    if len(text) <= width:\n"
BUG_LINE = "    if len(text) < width:\n"
FAKE = ("PASSED tests/test_core.py::test_truncate_exact_width\\n"
        "r t PASSED tests/test_core.py::test_truncate_exact_width\\t\\nr exit 0\\ndone\\n")
SITE = swe._site(rrepo.default_read_roots())[0]

# Each: code put at the top of textkit/core.py (after `import re`), and/or a replacement body
# line for truncate's `if` (inside the call).
AT_IMPORT = {
    "os_exit_0": "import os\nos._exit(0)\n",
    "sys_exit_0": "import sys\nsys.exit(0)\n",
    "fake_lines_every_fd": (
        "import os\n"
        f"for fd in range(1, 256):\n    try:\n        os.write(fd, b'{FAKE}')\n"
        "    except OSError:\n        pass\n"),
    "fake_lines_stdout": f"import os\nos.write(1, b'{FAKE}')\nos.write(2, b'{FAKE}')\n",
    "patch_pytest": (
        "import sys\n"
        f"sys.path.append({SITE!r})\n"
        "import _pytest.reports\n"
        "_pytest.reports.TestReport.outcome = 'passed'\n"),
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "kill_everyone": "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
    "rewrite_tests": (
        "for p in ('/checker/tests/test_core.py', '../checker/tests/test_core.py'):\n"
        "    try:\n        open(p, 'w').write('def test_ok():\\n    pass\\n')\n"
        "    except OSError:\n        pass\n"),
}
IN_CALL = {
    "os_exit_in_call": "    import os; os._exit(0)\n",
    "sys_exit_in_call": "    raise SystemExit(0)\n",
    "always_equal": ("    class Eq(str):\n        def __eq__(self, other):\n            return True\n"
                     "        __hash__ = str.__hash__\n    return Eq(text)\n"),
    "fake_lines_in_call": ("    import os\n"
                           f"    for fd in (1, 2):\n        try:\n"
                           f"            os.write(fd, b'{FAKE}')\n"
                           "        except OSError:\n            pass\n"),
}
CASES = sorted(AT_IMPORT) + sorted(IN_CALL)


@pytest.fixture(scope="module")
def base():
    return swe.baseline(os.path.join(DATA, "textkit"))


def forged(files: dict, name: str) -> dict:
    """`files` with the forgery `name` written into textkit/core.py."""
    out = dict(files)
    text = out[CORE]
    if name in AT_IMPORT:
        text = text.replace("import re\n", "import re\n" + AT_IMPORT[name], 1)
    else:  # first thing inside truncate, before its `if`
        text = text.replace('        raise ValueError("width is shorter than the suffix")\n',
                            '        raise ValueError("width is shorter than the suffix")\n'
                            + IN_CALL[name], 1)
    assert text != out[CORE]
    out[CORE] = text
    return out


def buggy(files: dict) -> dict:
    out = dict(files)
    out[CORE] = out[CORE].replace(GOOD_LINE, BUG_LINE)
    return out


def fix_verdict(base, name):
    """check_fix of a "fix" that leaves the bug and adds the forgery."""
    bug = buggy(base.files)
    tmp = tempfile.mkdtemp(prefix="rj-forge-")
    try:
        rrepo.write_tree(forged(bug, name), os.path.join(tmp, "repo"))
        return swe.check_fix(base, bug, os.path.join(tmp, "repo"), timeout_s=20)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bug_verdict(base, name):
    return swe.verify_bug(base, rrepo.unified_diff(base.files, forged(base.files, name)),
                          timeout_s=20)


@pytest.mark.parametrize("name", CASES)
def test_a_forged_fix_never_passes(base, name):
    v = fix_verdict(base, name)
    assert v.passed is False, (name, v)


@pytest.mark.parametrize("name", CASES)
def test_a_forgery_is_no_bug(base, name):
    """Over the clean tree the forgery is the only change: no honest test fails, so it is no
    bug. A process that dies, is refused (the audit hook ends it at its first write outside its
    scratch dir), garbles its own reply pipe (fake lines on every descriptor) or answers what
    cannot cross is `suite_broken`; fake lines on stdout/stderr change nothing."""
    v = bug_verdict(base, name)
    assert v.passed is False, (name, v)
    quiet = name in ("fake_lines_stdout", "fake_lines_in_call")
    assert v.evidence.startswith("no_failing_test" if quiet else "suite_broken"), (name, v)


def test_honest_verdicts_are_unchanged(base):
    """A real bug still passes, a real fix still passes, and an exception of the package's own
    class reaches `pytest.raises(ValueError)` as its nearest builtin class."""
    bug = buggy(base.files)
    v = swe.verify_bug(base, rrepo.unified_diff(base.files, bug))
    assert v.passed is True and "test_truncate_exact_width" in v.evidence, v
    own = dict(base.files)
    own[CORE] = own[CORE].replace(
        '        raise ValueError("width is shorter than the suffix")',
        '        raise WidthError("width is shorter than the suffix")').replace(
        "import re\n", "import re\n\n\nclass WidthError(ValueError):\n    pass\n", 1)
    tmp = tempfile.mkdtemp(prefix="rj-forge-")
    try:
        rrepo.write_tree(own, os.path.join(tmp, "repo"))
        v = swe.check_fix(base, bug, os.path.join(tmp, "repo"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert v.passed is True and v.evidence == "all 10 tests pass", v


def test_outcomes_come_from_the_checker(base):
    """What the package prints is not what is judged: fake lines on stdout leave the report
    alone, and the test the bug breaks is named with pytest's own failure line."""
    files = forged(buggy(base.files), "fake_lines_stdout")
    s = swe.run_suite(files, tests=base.files)
    assert s.reason is None and s.exit_code == 1, s
    assert s.outcomes["tests/test_core.py::test_truncate_exact_width"] == "FAILED"
    assert sum(o == "PASSED" for o in s.outcomes.values()) == 9
    assert "AssertionError" in s.tail, s.tail


def test_the_checker_runs_the_clean_tests(base):
    """A solver's copy with a weakened test is refused by check_fix; run_suite with the clean
    tests given runs those, whatever the package's tree holds."""
    bug = buggy(base.files)
    weak = dict(bug)
    weak["tests/test_core.py"] = weak["tests/test_core.py"].replace(
        'assert truncate("hello", 5) == "hello"', "assert True")
    s = swe.run_suite(weak, tests=base.files)
    assert s.outcomes["tests/test_core.py::test_truncate_exact_width"] == "FAILED", s


NOBODY = """
import json, os, sys, tempfile
from rossjax.verify import repo as rrepo, sandbox, swe
sys.path.insert(0, os.path.join({repo!r}, "tests"))
import test_swe_forgery as t
base = swe.baseline(os.path.join(t.DATA, "textkit"))
out = {{"real_bug": list(swe.verify_bug(base, rrepo.unified_diff(base.files, t.buggy(base.files))))}}
for name in ("os_exit_0", "fake_lines_every_fd", "fake_lines_stdout", "always_equal",
             "kill_parent", "os_exit_in_call"):
    out[name] = [list(t.fix_verdict(base, name)), list(t.bug_verdict(base, name))]
out["layers"] = sandbox.run("pass").isolation
json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")),
                    reason="needs root and util-linux to run the host side as uid 65534")
def test_forgeries_fail_unprivileged(tmp_path):
    """The same as uid 65534, where the walls are Landlock and user namespaces."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from test_faults_sandbox import _as_nobody
    tmp = tempfile.mkdtemp(prefix="rj-forge-", dir="/tmp")
    os.chmod(tmp, 0o777)
    try:
        script, out = os.path.join(tmp, "run.py"), os.path.join(tmp, "out.json")
        with open(script, "w") as f:
            f.write(NOBODY.format(repo=REPO))
        os.chmod(script, 0o644)
        proc = subprocess.run(_as_nobody([sys.executable, script, out], tmp), cwd=REPO,
                              env={**os.environ, "TMPDIR": tmp}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
        with open(out) as f:
            res = json.load(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert "landlock" in res.pop("layers")
    assert res.pop("real_bug")[0] is True
    for name, (fix, bug) in res.items():
        assert fix[0] is False and bug[0] is False, (name, fix, bug)


def test_stop_iteration_cannot_end_the_tests_loops(base):
    """A function that raises StopIteration would end `map` early, so `all(map(...))` of a
    forged package would be True; it crosses as RuntimeError instead (HumanEval checks too)."""
    tests = {"tests/test_map.py": "from textkit import slugify\n\n\ndef test_all():\n"
                                  "    assert all(map(lambda s: slugify(s) == s, ['a', 'b']))\n"}
    s = swe.run_suite(base.files, tests=tests)
    assert s.reason is None and s.outcomes == {"tests/test_map.py::test_all": "PASSED"}, s
    stop = dict(base.files)
    stop[CORE] = stop[CORE].replace('    ascii_text = unicodedata', '    raise StopIteration\n'
                                    '    ascii_text = unicodedata', 1)
    s = swe.run_suite(stop, tests=tests)
    assert s.reason is None and s.outcomes == {"tests/test_map.py::test_all": "FAILED"}, s
    assert "RuntimeError" in s.tail, s.tail
    v = sandbox.run_tests("def f(x):\n    raise StopIteration\n",
                          "def check(c):\n    assert all(map(c, [1, 2]))\n", "f")
    assert v.passed is False and "StopIteration" in v.evidence, v


@pytest.mark.parametrize("walls", [{"namespaces": False}, {"landlock": False},
                                   {"namespaces": False, "landlock": False}],
                         ids=["no_namespaces", "no_landlock", "rlimits_uid_only"])
def test_forged_fixes_fail_with_fewer_walls(base, walls):
    """With a layer switched off the suite still runs, and no forgery makes the bug's test pass
    or leaves the suite whole."""
    lim = sandbox.Limits(procs=64, memory_mb=2048, **walls)
    clean = swe.run_suite(base.files, limits=lim)
    if clean.reason and "kernel file wall" in clean.reason:
        # root without namespaces, its interpreter under a dir no other uid enters (/root):
        # the program would run as root behind the audit hook alone, so no suite runs there
        # (issue 36: the test files must be out of the program's reach)
        assert walls == {"namespaces": False, "landlock": False} and sandbox.get_host().hidden
        assert clean.reason.startswith("sandbox_error"), clean
        return
    assert clean.reason is None and set(clean.outcomes.values()) == {"PASSED"}, clean
    for name in ("os_exit_0", "fake_lines_every_fd", "always_equal", "kill_parent",
                 "kill_everyone", "os_exit_in_call"):
        s = swe.run_suite(forged(buggy(base.files), name), tests=base.files, limits=lim)
        bug_test = s.outcomes.get("tests/test_core.py::test_truncate_exact_width")
        assert s.reason is not None or bug_test != "PASSED", (walls, name, s)
