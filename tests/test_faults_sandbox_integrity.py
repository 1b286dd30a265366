"""Issue 36, items 1-3 and the first two of 8: what a sandboxed program writes is never trusted
later, the audit hook resolves dir_fd and descriptors like the kernel, the kernel refuses
process creation in every mode, and the outcome names what really happened.

Each attack runs in every mode this machine offers: root, Landlock (the host side as uid 65534)
and rlimits only (uid 65534, Landlock forced off), through tests/sandbox_worker.py and the
harness of tests/test_faults_sandbox.py.
"""

import os
import shutil
import sys
import warnings

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_faults_sandbox import GOOD, MODES, ROOT, WRONG as WRONG_ADD, run_in_mode  # noqa: E402

from rossjax.verify import sandbox  # noqa: E402
from rossjax.verify.sandbox import Limits  # noqa: E402

NO_HOOK = {"audit": False}
_BASE = "import os\nbase = os.path.dirname(os.path.dirname(os.getcwd()))\n"
# Item 1: a run whose walls are the hook alone (here switched off, as a bypass would) rewrites
# every bootstrap cache it can reach, or the program files of other runs as they start.
POISON = _BASE + (
    "import sys, marshal, importlib.util\n"
    "evil = ('import os, sys\\nP = eval(sys.argv[-1], {\"__builtins__\": {}})\\n'\n"
    "        'os.write(P[\"status_fd\"], b\"layers rlimits\\\\nprogram 0\\\\nchecker 0\\\\n\")\\n'\n"
    "        'os.write(P[\"report_fd\"], b\"done\\\\n\")\\n')\n"
    "pyc = importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(compile(evil, 'x', 'exec'))\n"
    "n = 0\nfor d, _, files in os.walk(base):\n    for f in files:\n"
    "        if f.endswith('.pyc'):\n            try:\n"
    "                open(os.path.join(d, f), 'wb').write(pyc)\n                n += 1\n"
    "            except OSError:\n                pass\nprint('poisoned', n)\n")
RACE = _BASE + (
    "import time\nmine = os.path.dirname(os.getcwd())\nend, hits = time.monotonic() + 4, 0\n"
    "while time.monotonic() < end:\n    try:\n        names = os.listdir(base)\n"
    "    except OSError:\n        break\n    for n in names:\n"
    "        d = os.path.join(base, n)\n        if n.startswith('run-') and d != mine:\n"
    "            try:\n                with open(os.path.join(d, 'main.py'), 'w') as f:\n"
    f"                    f.write({GOOD!r})\n                hits += 1\n"
    "            except OSError:\n                pass\nprint(hits)\n")
# Item 2: paths relative to a descriptor of the scratch dir, from a cwd 16 levels below it.
_FD = ("import os\ntop = os.getcwd()\nfd = os.open(top, os.O_RDONLY)\n"
       "os.makedirs(os.path.join(*['d'] * 16))\nos.chdir(os.path.join(*['d'] * 16))\n"
       "sec, vic = os.path.relpath('{SECRET}', top), os.path.relpath('{VICTIM}', top)\n")
# Item 3: forks the audit hook never sees (no hook; a loaded-by-hand _posixsubprocess).
_FORK = ("import os, time\nn = 0\nfor i in range(40):\n    try:\n        pid = os.fork()\n"
         "    except OSError as e:\n        print('refused', e)\n        break\n"
         "    if pid == 0:\n        time.sleep(20)\n        os._exit(0)\n    n += 1\n"
         "print('forked', n)\n")
_SPAWN = ("import _imp, importlib.machinery, os, time, glob\n"
          "so = glob.glob(os.path.join(os.path.dirname(os.__file__), 'lib-dynload',"
          " '_posixsubprocess*.so'))[0]\n"
          "ps = _imp.create_dynamic(importlib.machinery.ModuleSpec('_posixsubprocess', None,"
          " origin=so))\nn = 0\nfor i in range(40):\n    r, w = os.pipe()\n    try:\n"
          "        ps.fork_exec([b'/nonexistent'], [b'/nonexistent'], True, (w,), None, None,"
          " -1, -1, -1, -1, -1, -1, r, w, True, SETSID, -1, None, None, None, -1,"
          " lambda: time.sleep(20), False)\n"
          "    except OSError as e:\n        print('refused', e)\n        break\n    n += 1\n"
          "print('forked', n)\n")
ATTACKS = {
    "poison_boot_cache": {"kind": "poison", "program": POISON, "limits": NO_HOOK},
    "rewrite_other_runs": {"kind": "race", "program": RACE, "limits": NO_HOOK},
    "dirfd_read": {"program": _FD + "print(os.read(os.open(sec, os.O_RDONLY, dir_fd=fd), 99))\n"},
    "dirfd_write": {"program": _FD + "os.close(os.open(vic, os.O_CREAT | os.O_WRONLY, 0o644,"
                                     " dir_fd=fd))\n"},
    "dirfd_listdir": {"program": _FD + "up = os.open(os.path.dirname(sec), os.O_RDONLY,"
                                       " dir_fd=fd)\nprint(os.listdir(up))\n"},
    "dirfd_mkdir": {"program": _FD + "os.mkdir(vic, dir_fd=fd)\n"},
    "dirfd_rename": {"program": _FD + "open(top + '/x', 'w').close()\n"
                                      "os.rename('x', vic, src_dir_fd=fd, dst_dir_fd=fd)\n",
                     "limits": {"namespaces": False}},  # no tmpfs: the rename stays on one fs
    "dirfd_symlink_read": {"program": _FD + "os.symlink(sec, 'l', dir_fd=fd)\n"
                                            "print(os.read(os.open('l', os.O_RDONLY, dir_fd=fd),"
                                            " 99))\n"},
    "dirfd_mkfifo": {"program": _FD + "os.mkfifo(vic, dir_fd=fd)\n"},
    "fork_no_hook": {"kind": "orphans", "program": _FORK, "limits": NO_HOOK},
    "posixsubprocess_spawn": {"kind": "orphans", "program": _SPAWN.replace("SETSID", "False")},
    "posixsubprocess_no_hook": {"kind": "orphans", "program": _SPAWN.replace("SETSID", "False"),
                                "limits": NO_HOOK},
    "setsid_no_namespaces": {"kind": "orphans", "program": _SPAWN.replace("SETSID", "True"),
                             "limits": {"namespaces": False, "audit": False}},
    # Item 8: no final report, and a SIGKILL that is not the CPU limit's.
    "silent_checker": {"kind": "checked", "program": GOOD, "checker": "import os\nos._exit(0)\n"},
    "self_sigkill": {"program": "import signal\nsignal.raise_signal(signal.SIGKILL)\n"},
    "cpu_hard_limit": {"program": "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
                                  "while True:\n    pass\n", "limits": {"cpu_s": 1}, "timeout": 8},
    "hook_only_mode": {"program": "print(1)\n", "limits": {"namespaces": False, "landlock": False}},
}
# Item 4: a helper the tests call is the task's (the trusted prefix), never the program's.
_SHIFT = "def shift(s):\n    return s[1:] + s[:1]\n"  # the task's helper
_SHIFT_TESTS = ("def check(candidate):\n    for s in ('abc', 'hello', 'xy'):\n"
                "        assert candidate(shift(s)) == s\n")
_IDENTITY = "def shift(s):\n    return s\n\ndef unshift(s):\n    return s\n"
HELPERS = {
    "helper_identity_no_prefix": {"program": _IDENTITY, "passed": None, "word": "shift"},
    "helper_identity_prefix": {"program": _IDENTITY, "prefix": _SHIFT, "passed": False},
    "helper_correct_prefix": {"program": "def unshift(s):\n    return s[-1:] + s[:-1]\n",
                              "prefix": _SHIFT, "passed": True},
    "helper_correct_uses_task_helper": {
        "program": _SHIFT + "def unshift(s):\n    return shift(shift(s)) if len(s) == 3 else "
                            "s[-1:] + s[:-1]\n", "prefix": _SHIFT, "passed": True},
    "helper_private_name": {"program": "def _peek(s):\n    return s\ndef unshift(s):\n"
                                       "    return s\n",
                            "tests": "def check(candidate):\n    assert candidate('ab') == "
                                     "_peek('ba')\n", "passed": None, "word": "_peek"},
}
# The verdict channel and other processes, with no namespaces and the hook off (a bypass):
# write a final `done` into every pipe of an ancestor up to the host through /proc/PID/fd (the
# host's report channel was a pipe: as root a wrong program passed), ptrace the host
# (PTRACE_SEIZE, which does not stop it; an ATTACH left the root host stopped), signal its
# processes. The walk stops at the host ({HOST_PID}, the process that called sandbox.run):
# above it sit pytest-xdist's worker and controller, whose channel pipes the spam corrupted
# (both hung, waiting on a garbage message header).
_FAKE_DONE = WRONG_ADD + (
    "import os, threading\nws, pid = [], os.getpid()\nfor _ in range(6):\n    try:\n"
    "        pid = int(open(f'/proc/{pid}/status').read().split('PPid:')[1].split()[0])\n"
    "        fds = os.listdir(f'/proc/{pid}/fd')\n    except (OSError, IndexError):\n        break\n"
    "    for fd in fds:\n        p = f'/proc/{pid}/fd/{fd}'\n        try:\n"
    "            if os.readlink(p).startswith(('pipe:', 'socket:')):\n"
    "                ws.append(os.open(p, os.O_WRONLY | os.O_NONBLOCK))\n        except OSError:\n"
    "            pass\n    if pid == {HOST_PID}:\n        break\ndef spam():\n    for _ in range(300):\n        for w in ws:\n"
    "            try:\n                os.write(w, b'checker 0 0\\nprogram 0 0\\ndone\\n')\n"
    "            except OSError:\n                pass\n"
    "threading.Thread(target=spam, daemon=True).start()\n")
BYPASS_NO_NS = {"audit": False, "namespaces": False, "landlock": False}  # (Landlock scopes both)
ATTACKS.update({
    "fake_done_proc_fds": {"kind": "tests", "program": _FAKE_DONE, "limits": BYPASS_NO_NS,
                           "tests": "def check(candidate):\n    assert candidate(2, 3) == 5\n"},
    "ptrace_host": {"program": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                               "print('ptrace', libc.ptrace(0x4206, {HOST_PID}, 0, 0), "
                               "ctypes.get_errno())\n", "limits": BYPASS_NO_NS},
    "signal_host_processes": {"program": "import os\nos.kill({VICTIM_PID}, 9)\n",
                              "limits": BYPASS_NO_NS},
})
for _k, _a in HELPERS.items():
    ATTACKS[_k] = {"kind": "tests", "entry": "unshift", "tests": _SHIFT_TESTS, **_a}


@pytest.fixture(scope="module", params=MODES)
def results(request):
    mode = request.param
    if mode != "root" and ROOT and not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("unshare/setpriv (util-linux) are needed to run the host side unprivileged")
    attacks = {k: {"kind": "run", **a} for k, a in ATTACKS.items()}
    if mode == "rlimits":
        attacks = {k: {**a, "limits": {**a.get("limits", {}), "landlock": False}}
                   for k, a in attacks.items()}
    res, err = run_in_mode(attacks, mode)
    return mode, res, err


def test_nothing_a_program_writes_is_trusted_later(results):
    mode, res, _ = results
    r = res["poison_boot_cache"]
    assert r["wrong_passes"] is False and r["wrong_passes_new_process"] is False, (mode, r)
    assert not any(res["rewrite_other_runs"]["verdicts"]), (mode, res["rewrite_other_runs"])


@pytest.mark.parametrize("name", [k for k in ATTACKS if k.startswith("dirfd_")])
def test_dir_fd_paths_resolve_like_the_kernel(results, name):
    mode, res, _ = results
    r = res[name]
    assert r["ok"] is False and not r["token_seen"] and not r["victim_created"], (mode, r)
    assert "secret.txt" not in r["stdout"], (mode, r)


@pytest.mark.parametrize("name", ["fork_no_hook", "posixsubprocess_spawn",
                                  "posixsubprocess_no_hook", "setsid_no_namespaces"])
def test_the_kernel_refuses_forks(results, name):
    """Not one child: seccomp refuses fork, vfork and clone without CLONE_THREAD (the hook may
    refuse the import first, where _posixsubprocess is not a builtin)."""
    mode, res, _ = results
    r = res[name]
    hook = "refused import _posixsubprocess" in (r["reason"] or "")
    assert hook or ("forked 0" in r["stdout"] and "refused" in r["stdout"]), (mode, r)
    assert r["left"] == 0, (mode, r)


def test_a_checker_without_a_final_report_fails(results):
    mode, res, _ = results
    r = res["silent_checker"]
    assert r["ok"] is False and "did not finish" in r["reason"], (mode, r)


def test_sigkill_is_reported_as_killed(results):
    mode, res, _ = results
    assert res["self_sigkill"]["reason"].startswith("signal: killed by SIGKILL"), (mode, res)
    assert res["cpu_hard_limit"]["reason"].startswith("cpu_limit"), (mode, res)


def test_hook_only_mode_says_so(results):
    mode, res, stderr = results
    r = res["hook_only_mode"]
    assert r["ok"] and "hook-only" in r["isolation"].split(","), (mode, r)
    assert "hook-only" in stderr and "neither Landlock nor namespaces" in stderr, (mode, stderr)
    layers = res["dirfd_read"]["isolation"].split(",")
    if mode == "root" or any(x.startswith("landlock") for x in layers):
        assert "hook-only" not in layers, (mode, layers)
    else:  # no kernel file wall: files are the hook's alone, and the run says so
        assert "hook-only" in layers, (mode, layers)


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_helpers_come_from_the_task(results, name):
    """Tests with helpers and no prefix are invalid, naming the helper; with the task's prefix
    a program that redefines the helper is judged on the task's version."""
    mode, res, _ = results
    r, want = res[name], HELPERS[name]
    assert r["passed"] is want["passed"], (mode, name, r)
    assert want.get("word", "") in r["reason"], (mode, name, r)


def test_no_channel_or_process_outside_the_run(results):
    """Without namespaces and with the hook off: a fake `done` through /proc/PID/fd changes no
    verdict (the host's status and report channels are sockets, which cannot be opened there),
    and seccomp refuses ptrace and signals to any process but the program itself."""
    mode, res, _ = results
    assert res["fake_done_proc_fds"]["passed"] is False, (mode, res["fake_done_proc_fds"])
    r = res["ptrace_host"]
    assert "ptrace -1 " in r["stdout"], (mode, r)
    r = res["signal_host_processes"]
    assert r["victim_alive"] and not r["ok"] and "PermissionError" in r["reason"], (mode, r)


def test_require_refuses_a_weaker_mode():
    weak = Limits(landlock=False, namespaces=False, require="namespaces")
    with pytest.raises(sandbox.SandboxUnavailable, match="requires namespaces"):
        sandbox.run("print(1)", limits=weak)
    with pytest.raises(sandbox.SandboxUnavailable, match="requires landlock"):
        sandbox.run("print(1)", limits=Limits(landlock=False, namespaces=False,
                                              require="landlock"))
    with pytest.raises(ValueError, match="sandbox require"):
        Limits(require="chroot")
    if ROOT:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert sandbox.run("print(1)", limits=Limits(require="namespaces")).ok
