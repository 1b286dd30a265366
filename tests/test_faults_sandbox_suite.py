"""Issue 36: a suite run's test files and verdict channel (sandbox.run_pytest, the SWE verdicts)
are out of the program's reach in every mode: root, Landlock (the host side as uid 65534) and
rlimits only (uid 65534, Landlock forced off), each with the audit hook on and off (off: what
a bypass of the hook would leave), with and without namespaces.

The package process tries to read the clean test files (a token in them must never show),
rewrite them or swap their folder (the honest test fails, so a PASSED is a forgery), and to
write a fake report into every pipe it can open through /proc and then kill every process it
can signal (but the test's worker: killing the host is no forgery). A mode that cannot keep the files from the program refuses the suite run
(sandbox_error); it never runs it with files the program could reach.
"""

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_faults_sandbox import MODES, ROOT, run_in_mode  # noqa: E402

TESTS = {"tests/test_x.py": "from rjpkg import one\n# {TOKEN}\n\n\ndef test_one():\n"
                            "    assert one() == 2\n"}
NODE = "tests/test_x.py::test_one"
SERVE = ("def one():\n    return 1\n\n\ndef __rj_import__(name):\n"
         "    globals()['rjpkg.one'] = one\n    return {'one': ('f', None)}\n")
_PATHS = ("import os\nPATHS = ['/checker/tests/test_x.py', '../checker/tests/test_x.py',"
          " os.path.join(os.path.dirname(os.getcwd()), 'checker', 'tests', 'test_x.py')]\n")
READ = _PATHS + ("for p in PATHS:\n    try:\n        print(open(p).read())\n"
                 "    except OSError as e:\n        print('no', p, e)\n")
WRITE = _PATHS + ("for p in PATHS:\n    try:\n        with open(p, 'w') as f:\n"
                  "            f.write('def test_one():\\n    pass\\n')\n        print('wrote', p)\n"
                  "    except OSError as e:\n        print('no', p, e)\n")
SWAP = ("import os\nfor d in ('/checker', '../checker'):\n    try:\n"
        "        os.rename(d, d + '.old')\n        os.makedirs(d + '/tests')\n"
        "        with open(d + '/tests/test_x.py', 'w') as f:\n"
        "            f.write('def test_one():\\n    pass\\n')\n        print('swapped', d)\n"
        "    except OSError as e:\n        print('no', d, e)\n")
FAKE = ("import os, signal\nfake = b'r t PASSED " + NODE.encode().decode() + "\\t\\nr exit 0\\ndone\\n'\n"
        "me = os.getpid()\nn = 0\nfor pid in os.listdir('/proc'):\n    if not pid.isdigit():\n"
        "        continue\n    try:\n        fds = os.listdir(f'/proc/{pid}/fd')\n"
        "    except OSError:\n        continue\n    for fd in fds:\n        p = f'/proc/{pid}/fd/{fd}'\n"
        "        try:\n            if not os.readlink(p).startswith(('pipe:', 'socket:')):\n"
        "                continue\n            w = os.open(p, os.O_WRONLY | os.O_NONBLOCK)\n"
        "            os.write(w, fake)\n            n += 1\n        except OSError:\n"
        "            pass\nprint('faked', n)\nfor pid in os.listdir('/proc'):\n"
        "    if pid.isdigit() and int(pid) not in (me, {HOST_PID}):\n        try:\n"
        "            os.kill(int(pid), signal.SIGKILL)\n        except OSError:\n            pass\n")
ATTACKS = {}
for _name, _src in (("read", READ), ("write", WRITE), ("swap", SWAP), ("fake_report", FAKE)):
    for _walls, _lim in (("", {}), ("_no_hook", {"audit": False}),
                         ("_no_ns", {"namespaces": False}),
                         ("_no_ns_no_hook", {"namespaces": False, "audit": False})):
        ATTACKS[_name + _walls] = {"kind": "pytest", "program": _src + SERVE, "tests": TESTS,
                                   "limits": _lim}
ATTACKS["honest"] = {"kind": "pytest", "program": SERVE, "tests": TESTS, "limits": {}}


@pytest.fixture(scope="module", params=MODES)
def results(request):
    mode = request.param
    if mode != "root" and ROOT and not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("unshare/setpriv (util-linux) are needed to run the host side unprivileged")
    attacks = ATTACKS
    if mode == "rlimits":
        attacks = {k: {**a, "limits": {**a["limits"], "landlock": False}}
                   for k, a in attacks.items()}
    return mode, run_in_mode(attacks, mode)[0]


def test_an_honest_suite_runs(results):
    """The suite runs wherever a kernel wall keeps its files from the program: as root (its own
    root; a private uid without namespaces) and with Landlock. Rlimits only, as uid 65534 (the
    program of the host's own uid), it is refused, whatever namespaces there are."""
    mode, res = results
    r = res["honest"]
    if mode == "rlimits":
        assert r["reason"].startswith("sandbox_error") and "kernel file wall" in r["reason"], r
        return
    assert r["ok"] and f"t FAILED {NODE}\t" in "\n".join(r["reports"]), (mode, r)


@pytest.mark.parametrize("name", sorted(k for k in ATTACKS if k != "honest"))
def test_the_program_never_reaches_the_tests_or_the_report(results, name):
    mode, res = results
    r = res[name]
    assert not r["token_seen"], (mode, name, r)
    reports = "\n".join(r["reports"])
    assert f"t PASSED {NODE}" not in reports, (mode, name, r)
    if r["ok"]:  # the suite ran: the honest test failed, or the package broke its own calls
        assert f"t FAILED {NODE}\t" in reports or "broken " in reports, (mode, name, r)
    else:  # a mode that cannot wall the files off refuses the suite run; nothing else
        assert r["reason"].startswith(("sandbox_error", "check_failed", "sandbox_violation")), (
            mode, name, r)
