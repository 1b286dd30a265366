"""Issue 22, parts 1 and 2: verdicts a program cannot forge, and confinement by the kernel.

Part 1 runs each forgery class through run_tests, stdin/stdout cases, the induction verifier and
GRPO's code reward: each must fail. Part 2 runs the attacks (relative symlink + chdir reads of a
host file and of /proc, host-file writes, signals and pidfd_send_signal to host processes, fork
bomb, disk fill, a sleeping process outliving a SIGKILLed host) in every mode this machine
offers: root, Landlock (the host side as uid 65534) and rlimits only (uid 65534, Landlock forced
off), through tests/sandbox_worker.py. The kernel-layer cases run with the audit hook off.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from rossjax.verify import rewards, sandbox
from rossjax.verify.base import verify_one
from rossjax.verify.sandbox import Limits

ROOT = os.geteuid() == 0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
WRONG = "def add(a, b):\n    return 0\n"
GOOD = "def add(a, b):\n    return a + b\n"

FORGERIES = {
    "sys_exit_0": WRONG + "import sys\nsys.exit(0)\n",
    "sys_exit_in_call": "import sys\ndef add(a, b):\n    sys.exit(0)\n",
    "os_exit_0": WRONG + "import os\nos._exit(0)\n",
    "os_exit_in_call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "atexit": WRONG + "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "excepthook": WRONG + "import sys\nsys.excepthook = lambda *a: None\n",
    "eq_always_true": "class Y:\n    def __eq__(self, o):\n        return True\n"
                      "def add(a, b):\n    return Y()\n",
    "int_subclass": "class I(int):\n    def __eq__(self, o):\n        return True\n"
                    "def add(a, b):\n    return I(0)\n",
    "str_subclass": "class S(str):\n    def __eq__(self, o):\n        return True\n"
                    "def add(a, b):\n    return S('x')\n",
    "generator": "def add(a, b):\n    return (x for x in [a + b])\n",
    "patched_builtins": WRONG + "import builtins\nbuiltins.AssertionError = type('E', (BaseException,), {})\n",
    "fake_lines_everywhere": WRONG + "import os, sys\nprint('done')\nprint('done', file=sys.stderr)\n"
                             "for fd in range(3, 256):\n    try:\n        os.write(fd, b'done\\n')\n"
                             "    except OSError:\n        pass\n",
    "close_stderr_hides_refusal": GOOD + "import os\nos.close(2)\ntry:\n    open('/etc/shadow')\n"
                                  "except BaseException:\n    pass\n",
    "redirect_stderr_hides_refusal": GOOD + "import os\nos.dup2(os.open(os.devnull, os.O_WRONLY), 2)\n"
                                     "try:\n    import socket\nexcept BaseException:\n    pass\n",
    "swallowed_refusal_in_call": "def add(a, b):\n    try:\n        import ctypes\n"
                                 "    except BaseException:\n        pass\n    return a + b\n",
    "hang": WRONG + "while True:\n    pass\n",
    "shadow_builtin": "def abs(x):\n    return 0\ndef add(a, b):\n    return 0\n",
}
ABS_TESTS = "def check(candidate):\n    assert abs(candidate(2, 3) - 5) < 1e-9\n"


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forgery_fails(name):
    v = sandbox.run_tests(FORGERIES[name], ABS_TESTS if name == "shadow_builtin" else TESTS, "add",
                          timeout_s=3.0)
    assert v.passed is False, (name, v)


@pytest.mark.parametrize("program", [
    GOOD, "add = lambda a, b: a + b\n",
    "import functools\n@functools.lru_cache(maxsize=None)\ndef add(a, b):\n    return a + b\n",
    "def add(a, b):\n    if a < 0:\n        raise ValueError('x')\n    return a + b\n",
])
def test_correct_programs_pass(program):
    tests = TESTS.replace("    assert candidate(-1, 1) == 0\n", "") + (
        "    try:\n        candidate(-1, 0)\n    except ValueError:\n        pass\n")
    v = sandbox.run_tests(program, tests, "add")
    assert v.passed is True, (program, v)


def test_refusal_reasons_are_named():
    v = sandbox.run_tests(FORGERIES["close_stderr_hides_refusal"], TESTS, "add")
    assert v.evidence.startswith("sandbox_violation") and "hidden" in v.evidence, v
    v = sandbox.run_tests(FORGERIES["swallowed_refusal_in_call"], TESTS, "add")
    assert v.evidence.startswith("sandbox_violation: sandbox refused import ctypes"), v
    v = sandbox.run_tests(FORGERIES["int_subclass"], TESTS, "add")
    assert "__main__.I" in v.evidence and "only exact builtin types" in v.evidence, v


def test_plain_values_cross_exactly():
    prog = ("def f():\n    return [None, True, 2**100, -0.0, float('nan'), float('inf'), 1j, 'a\\udc80',"
            " b'\\x00', (1,), {1: {2}}, frozenset({3}), set()]\n")
    checker = ("v = f()\nimport math\nassert v[2] == 2**100 and type(v[1]) is bool\n"
               "assert math.copysign(1, v[3]) < 0 and math.isnan(v[4]) and v[5] == math.inf\n"
               "assert v[6] == 1j and v[7] == 'a\\udc80' and v[8] == b'\\x00' and v[9] == (1,)\n"
               "assert v[10] == {1: {2}} and type(v[11]) is frozenset and v[12] == set()\n")
    res, _ = sandbox.run_checked(prog, checker, "f")
    assert res.ok, res


def test_tests_are_invisible_to_the_program():
    """The tests reach the checker through a descriptor: the program cannot read them."""
    tests = TESTS + "# SECRET-TEST-TOKEN\n"
    prog = ("import os\nfor p in ('../checker.bin', '../../checker.bin', '/proc/1/fd/3'):\n"
            "    try:\n        print(open(p, 'rb').read())\n    except OSError as e:\n"
            "        print(e)\n" + WRONG)
    res, _ = sandbox.run_checked(prog, tests + "check(add)\n", "add",
                                 limits=Limits(audit=False))
    assert "SECRET-TEST-TOKEN" not in res.stdout + res.stderr


def test_stdin_stdout_forgeries_fail():
    task = {"domain": "code", "cases": [{"input": "1 2\n", "output": "3\n"}]}

    def verdict(code):
        return verify_one({"task": task, "messages": [
            {"role": "assistant", "content": f"```python\n{code}```"}]}, "code")

    assert verdict("a, b = map(int, input().split())\nprint(a + b)\n").passed is True
    for code in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n",
                 "import sys\nsys.excepthook = lambda *a: None\nraise ValueError\n",
                 "import os\nos.close(2)\nprint(3)\ntry:\n    open('/etc/shadow')\nexcept BaseException:\n"
                 "    pass\n"):
        assert verdict(code).passed is False, code


def test_induction_forgeries_fail():
    task = {"domain": "induction", "program": "def f(a):\n    return a * 2\n", "inputs": ["1"],
            "hidden_inputs": ["3", "5"], "message": "double"}

    def verdict(code):
        return verify_one({"task": task, "messages": [
            {"role": "assistant", "content": f"```python\n{code}```"}]}, "induction")

    assert verdict("def f(a):\n    return 2 * a\n").passed is True
    for code in ("class I(int):\n    def __eq__(s, o):\n        return True\n    def __repr__(s):\n"
                 "        return '6'\ndef f(a):\n    return I(0)\n",
                 "def f(a):\n    return 0\nimport sys\nsys.exit(0)\n",
                 "def f(a):\n    return 0\nprint('#rj0000000000000000 [true, \"6\", \"6\"]')\n",
                 "def f(a):\n    import os\n    os._exit(0)\n",
                 # the checker's own helpers and builtins are never the program's
                 "def _rj_decode(b):\n    return [(3,), (3,)]\ndef repr(x):\n    return '6'\n"
                 "def f(a):\n    return 6\n"):
        assert verdict(code).passed is False, code


def test_grpo_code_reward_is_not_fooled():
    task = {"domain": "code", "tests": TESTS, "entry_point": "add"}
    for code, want in ((GOOD, 1.0), (FORGERIES["sys_exit_0"], 0.0), (FORGERIES["atexit"], 0.0),
                       (FORGERIES["eq_always_true"], 0.0)):
        rec = {"task": task, "messages": [{"role": "user", "content": "add"},
                                          {"role": "assistant", "content": f"```python\n{code}```"}]}
        assert rewards.score("verifier", rec)[0] == want, code


def test_timeout_cap():
    with pytest.raises(ValueError, match="over the cap of 60 s"):
        sandbox.run("pass", timeout_s=86400)
    task = {"domain": "code", "tests": TESTS, "entry_point": "add", "timeout_s": 86400}
    v = verify_one({"task": task, "messages": [
        {"role": "assistant", "content": f"```python\n{GOOD}```"}]}, "code")
    assert v.passed is True and "capped at 60 s" in v.evidence, v
    task["timeout_s"] = "soon"
    v = verify_one({"task": task, "messages": [
        {"role": "assistant", "content": f"```python\n{GOOD}```"}]}, "code")
    assert v.passed is None and "not a number" in v.evidence, v


# ---- part 2: the attacks, in every mode --------------------------------------------------------

_DEEP = ("import os\ntop = os.getcwd()\ndeep = os.path.join(*['d'] * 16)\nos.makedirs(deep)\n"
         "os.chdir(deep)\n")
NO_HOOK = {"audit": False}
ATTACKS = {
    # The audit hook used to resolve a relative link against the cwd; the kernel resolves it
    # against the link's folder: 16 levels up from the scratch dir is /.
    "link_read": {"program": _DEEP + "os.symlink('../' * 16 + '{SECRET}'.lstrip('/'), top + '/l')\n"
                                     "print(open(top + '/l').read())\n"},
    "link_read_no_hook": {"program": _DEEP + "os.symlink('../' * 16 + '{SECRET}'.lstrip('/'), top + '/l')\n"
                                             "print(open(top + '/l').read())\n", "limits": NO_HOOK},
    "direct_read_no_hook": {"program": "print(open('{SECRET}').read())\n", "limits": NO_HOOK},
    "link_proc": {"program": _DEEP + "os.symlink('../' * 16 + 'proc', top + '/p')\nout = []\n"
                                     "for pid in os.listdir(top + '/p'):\n    try:\n"
                                     "        out.append(open(top + '/p/' + pid + '/cmdline', 'rb').read())\n"
                                     "    except OSError:\n        pass\nprint(out)\n"},
    "proc_no_hook": {"program": "import os\nout = []\nfor pid in os.listdir('/proc'):\n    try:\n"
                               "        out.append(open('/proc/' + pid + '/cmdline', 'rb').read())\n"
                               "    except OSError:\n        pass\n"
                               "print(out, open('/proc/{VICTIM_PID}/cmdline', 'rb').read())\n",
                     "limits": NO_HOOK},
    "link_write": {"program": _DEEP + "os.symlink('../' * 16 + '{VICTIM}'.lstrip('/'), top + '/w')\n"
                                      "open(top + '/w', 'w').write('pwned')\n"},
    "link_write_no_hook": {"program": _DEEP + "os.symlink('../' * 16 + '{VICTIM}'.lstrip('/'), top + '/w')\n"
                                              "open(top + '/w', 'w').write('pwned')\n", "limits": NO_HOOK},
    "signals_no_hook": {"program": "import os, signal\nfor pid in ({VICTIM_PID}, {HOST_PID}, os.getppid()):\n"
                                   "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n"
                                   "        print('kill', pid, e)\n    try:\n"
                                   "        signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGKILL)\n"
                                   "    except OSError as e:\n        print('pidfd', pid, e)\n",
                        "limits": NO_HOOK},
    # Landlock (ABI 7) and namespaces leave pathname unix sockets of the host user reachable:
    # the seccomp filter refuses socket(AF_UNIX).
    "unix_socket_no_hook": {"program": "import socket\ns = socket.socket(socket.AF_UNIX)\n"
                                       "s.connect('{SOCK}')\n", "limits": NO_HOOK},
    # A nested user namespace would give the program capabilities over new namespaces.
    "nested_userns_no_hook": {"program": "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                                         "if libc.unshare(0x10000000) == 0 or ctypes.get_errno() != 1:\n"
                                         "    sys.exit(3)\n", "limits": NO_HOOK},
    "fork_bomb": {"program": "import os\nwhile True:\n    os.fork()\n", "timeout": 3},
    "disk_fill": {"program": "total = 0\nfor i in range(1000):\n    with open('f%d' % i, 'wb') as f:\n"
                             "        for _ in range(2):\n            f.write(b'x' * (1 << 20))\n"
                             "            f.flush()\n            total += 1 << 20\n"
                             "            print(total, flush=True)\n",
                  "limits": {"disk_mb": 8, "file_mb": 2, "files": 64}},
    "kill_checker_no_hook": {"kind": "tests", "tests": TESTS, "limits": NO_HOOK, "program":
                             "import os, signal\nfor pid in range(1, 64):\n    if pid != os.getpid():\n"
                             "        try:\n            os.kill(pid, signal.SIGKILL)\n"
                             "        except OSError:\n            pass\n" + GOOD},
    "proc_fd_report_no_hook": {"kind": "tests", "tests": TESTS, "limits": NO_HOOK, "program":
                               "import os\ntry:\n    pids = os.listdir('/proc')\nexcept OSError:\n"
                               "    pids = []\nfor pid in pids:\n    try:\n"
                               "        fds = os.listdir('/proc/%s/fd' % pid)\n    except OSError:\n"
                               "        continue\n    for fd in fds:\n        try:\n"
                               "            with open('/proc/%s/fd/%s' % (pid, fd), 'w') as f:\n"
                               "                f.write('done\\n')\n        except OSError:\n"
                               "            pass\n" + WRONG},
    "sleeper_outlives_killed_host": {"kind": "kill_host", "program": "import time\ntime.sleep(60)\n",
                                     "want": 3},
}
FILES_NO_HOOK = ("link_read_no_hook", "direct_read_no_hook", "link_write_no_hook")
ROOT_ONLY = {
    "fork_bomb_fork_allowed": {"program": "import os\nwhile True:\n    os.fork()\n", "timeout": 3,
                               "limits": {"allow_fork": True, "procs": 8, "audit": False}},
    "grandchild_outlives_killed_host": {
        "kind": "kill_host", "want": 4, "limits": {"allow_fork": True, "audit": False},
        "program": "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(60)\n"},
}


def _hidden_ancestor(path):
    cur = "/"
    for part in path.strip("/").split("/"):
        cur = os.path.join(cur, part)
        if not os.stat(cur).st_mode & 0o001:
            return cur
    return None


def _as_nobody(argv, tmp):
    """argv run as uid 65534 in a private mount namespace where the interpreter, the venv and the
    checkout are reachable (a tmpfs over a hidden ancestor such as /root, with them bound back)."""
    need = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, REPO)})
    script, binds = [], []
    for i, p in enumerate(need):
        hidden = _hidden_ancestor(p)
        if hidden:
            stage = os.path.join(tmp, f"stage{i}")
            os.makedirs(stage)
            script.append(f"mount --bind '{p}' '{stage}'")
            binds.append((hidden, p, stage))
    for hidden in sorted({h for h, _, _ in binds}):
        script.append(f"mount -t tmpfs -o mode=755 rj '{hidden}'")
    for _, p, stage in binds:
        script += [f"mkdir -p '{p}'", f"mount --bind '{stage}' '{p}'"]
    env = f"env -i PATH=/usr/bin:/bin TMPDIR='{tmp}' HOME='{tmp}'"
    script.append("exec setpriv --reuid=65534 --regid=65534 --clear-groups " + env + " "
                  + " ".join(f"'{a}'" for a in argv))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", " && ".join(script)]


def run_in_mode(attacks: dict, mode: str) -> tuple[dict, str]:
    """(results by attack name, the worker's stderr): tests/sandbox_worker.py runs `attacks` with
    the host side as this process's user ("root") or as uid 65534 ("landlock", "rlimits")."""
    tmp = tempfile.mkdtemp(prefix="rj-faults-", dir="/tmp")
    os.chmod(tmp, 0o777)
    try:
        spec, out = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec, "w") as f:
            json.dump({"attacks": attacks}, f)
        os.chmod(spec, 0o644)
        argv = [sys.executable, os.path.join(REPO, "tests", "sandbox_worker.py"), spec, out]
        cmd = _as_nobody(argv, tmp) if ROOT and mode != "root" else argv
        proc = subprocess.run(cmd, env={**os.environ, "TMPDIR": tmp}, cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and os.path.exists(out), (proc.stdout[-2000:],
                                                               proc.stderr[-3000:])
        with open(out) as f:
            return json.load(f), proc.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


MODES = ["root", "landlock", "rlimits"] if ROOT else ["landlock", "rlimits"]


@pytest.fixture(scope="module", params=MODES)
def mode_results(request):
    mode = request.param
    if mode in ("landlock", "rlimits") and ROOT and not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("unshare/setpriv (util-linux) are needed to run the host side unprivileged")
    attacks = dict(ATTACKS, **(ROOT_ONLY if mode == "root" else {}))
    if mode == "rlimits":  # files are the audit hook's alone here: no file attack without it
        attacks = {k: {**a, "limits": {**a.get("limits", {}), "landlock": False}}
                   for k, a in attacks.items() if k not in FILES_NO_HOOK}
    attacks = {k: {"kind": "run", **a} for k, a in attacks.items()}
    return mode, run_in_mode(attacks, mode)[0]


def test_mode_layers(mode_results):
    mode, res = mode_results
    layers = set(res["link_read"]["isolation"].split(","))
    if mode == "root":
        assert {"pidns", "mountns", "rootfs", "scratch-tmpfs", "uid", "audit"} <= layers, layers
    elif mode == "landlock":
        if not ROOT and not any(x.startswith("landlock") for x in layers):
            pytest.skip("this kernel has no Landlock")
        assert any(x.startswith("landlock") for x in layers) and "uid" not in layers, layers
        assert "seccomp" in layers, layers
    else:
        assert not any(x.startswith("landlock") for x in layers), layers


@pytest.mark.parametrize("name", sorted(dict(ATTACKS, **ROOT_ONLY)))
def test_attack_is_contained(mode_results, name):
    mode, res = mode_results
    if name not in res:
        pytest.skip(f"{name} needs root" if name in ROOT_ONLY else
                    f"{name}: in this mode only the audit hook confines files")
    r = res[name]
    assert not r.get("token_seen"), (mode, name, r)
    assert not r["victim_created"], (mode, name, r)
    assert r["victim_alive"], (mode, name, r)
    assert not r["socket_reached"], (mode, name, r)
    if name.startswith(("link_", "direct_read", "fork_bomb", "disk_fill", "unix_socket")):
        assert r["ok"] is False, (mode, name, r)
    if name == "disk_fill":
        written = int(r["stdout"].split()[-1]) if r["stdout"].split() else 0
        cap = 8 << 20 if "scratch-tmpfs" in r["isolation"] else 64 * (2 << 20)
        assert written <= cap, (mode, r)
    if name == "nested_userns_no_hook":
        assert r["ok"], (mode, r)  # unshare(CLONE_NEWUSER) answered EPERM
    if name == "proc_fd_report_no_hook":
        assert r["passed"] is False, (mode, r)
    if name == "kill_checker_no_hook" and mode != "rlimits":
        assert r["passed"] is True, (mode, r)  # the checker is out of the program's reach
    if name.endswith("killed_host"):
        assert r["seen"] >= ATTACKS.get(name, ROOT_ONLY.get(name))["want"] and r["left"] == 0, (mode, r)


def test_sandboxes_die_with_a_killed_curate(tmp_path):
    """SIGKILL of `rossjax curate` while its verifier workers run sandboxed programs that sleep
    (a row's timeout_s of 86400 is capped): no sandbox process outlives it (was: PPID 1)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sandbox_worker import sandbox_pids

    rows = tmp_path / "in.jsonl"
    with open(rows, "w") as f:
        for i in range(4):
            f.write(json.dumps({"id": f"r{i}", "task": {
                "id": f"t{i}", "domain": "code", "entry_point": "add", "tests": TESTS,
                "timeout_s": 86400}, "messages": [
                    {"role": "user", "content": "add"},
                    {"role": "assistant", "content": "```python\nimport time\ntime.sleep(120)\n"
                                                     + GOOD + "```"}]}) + "\n")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "rossjax.cli", "curate",
                             f"--config={REPO}/configs/curate.py", f"--config.input={rows}",
                             f"--config.output={tmp_path / 'out'}", "--config.verify=rerun",
                             "--config.verify_workers=2"], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = str(tmp_path / "rossjax-sandbox-")
    try:
        deadline = time.monotonic() + 120
        while len(sandbox_pids(marker)) < 6 and time.monotonic() < deadline:
            assert proc.poll() is None, "curate ended before its sandboxes ran"
            time.sleep(0.1)
        assert len(sandbox_pids(marker)) >= 6
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while sandbox_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sandbox_pids(marker)


def test_disk_cap_without_a_tmpfs_counts_files():
    """Without namespaces (no size-capped tmpfs) the audit hook caps the files a run creates, so
    its disk use stays under files x file_mb."""
    prog = ("import os\nfor i in range(10):\n    with open('f%d' % i, 'wb') as f:\n"
            "        f.write(b'x' * 1000)\n    print(i, flush=True)\n")
    r = sandbox.run(prog, limits=Limits(namespaces=False, files=4, file_mb=1))
    assert "scratch-tmpfs" not in r.isolation
    assert not r.ok and "creating more than 4 files" in r.reason, r
    assert r.stdout.split()[-1] == "3", r.stdout
