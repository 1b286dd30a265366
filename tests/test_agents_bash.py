"""The `bash` environment (rossjax/agents/bash.py) over sandbox.run_shell: it works, and a
command cannot write the original repository, read host files outside the allowed roots, reach
the network, or outlive its timeout. Root mode here; the Landlock mode (the host side as uid
65534, as in tests/test_faults_sandbox.py) in one test that runs the same attacks."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from rossjax.agents import ToolCall, make_env
from rossjax.agents.bash import BashEnv
from rossjax.agents.rollout import run_episode
from rossjax.errors import InputError
from rossjax.verify import sandbox

ROOT = os.geteuid() == 0


def tree_hash(root):
    h = hashlib.sha256()
    for d, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(d, name)
            h.update(os.path.relpath(p, root).encode())
            with open(p, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


@pytest.fixture()
def repo(tmp_path):
    r = tmp_path / "orig"
    (r / "pkg").mkdir(parents=True)
    (r / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (r / "README").write_text("hello\n")
    return str(r)


def sh(env, cmd, cid="c0"):
    obs, done, verdict = env.step([ToolCall("bash", {"command": cmd}, cid)])
    assert len(obs) == 1 and obs[0].tool_call_id == cid and not done and verdict is None
    return obs[0].content


def test_registered_and_runs_commands(repo):
    env = make_env("bash", step_timeout_s=10)
    assert isinstance(env, BashEnv)
    msgs = env.reset({"prompt": "look around", "repo": repo})
    assert msgs[-1] == {"role": "user", "content": "look around"}
    out = sh(env, "ls; cat pkg/mod.py; echo err >&2; exit 3")
    assert out.startswith("exit code: 3\n[stdout]\n") and "README" in out and "return 1" in out
    assert "[stderr]\nerr" in out
    out = sh(env, "python -c 'import pkg.mod as m; print(m.f() + 41)' && echo new > made.txt")
    assert out.startswith("exit code: 0") and "42" in out
    assert open(os.path.join(env.workdir, "made.txt")).read() == "new\n"
    scratch = os.path.dirname(env.workdir)
    env.close()
    assert env.workdir is None and not os.path.exists(scratch)


def test_original_is_never_written(repo):
    before = tree_hash(repo)
    env = BashEnv(step_timeout_s=10)
    env.reset({"prompt": "p", "repo": repo})
    out = sh(env, f"rm -rf ./*; echo x > new.txt; echo y > {repo}/evil.txt; "
                  f"rm -rf {repo}/pkg; ls")
    assert "new.txt" in out and "README" not in out
    assert tree_hash(repo) == before and not os.path.exists(os.path.join(repo, "evil.txt"))
    env.close()


def test_host_files_outside_the_roots_are_unreadable(repo, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN-3141\n")
    os.chmod(secret, 0o644)
    env = BashEnv(step_timeout_s=10)
    env.reset({"prompt": "p", "repo": repo})
    out = sh(env, f"cat {secret}; cat /etc/passwd; ls {repo}; ls /root /home; "
                  f"python -c \"print(open('{secret}').read())\"")
    assert "TOKEN-3141" not in out and "root:x:0" not in out
    assert "mod.py" in sh(env, "ls pkg")  # the copy itself is readable
    env.close()


def test_network_is_unreachable(repo):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    env = BashEnv(step_timeout_s=10)
    env.reset({"prompt": "p", "repo": repo})
    try:
        out = sh(env, f"echo hi > /dev/tcp/127.0.0.1/{port} && echo TCP-OK; python -c \""
                      f"import socket; socket.create_connection(('127.0.0.1', {port}), 2); "
                      "print('PY-OK')\"")
        assert "TCP-OK" not in out and "PY-OK" not in out
        with pytest.raises(TimeoutError):
            srv.accept()
    finally:
        srv.close()
        env.close()


def test_timeout_kills_the_step_and_everything_it_started(repo):
    env = BashEnv(step_timeout_s=1.0)  # the sandbox's own limit is 0.7 s (start-up margin)
    env.reset({"prompt": "p", "repo": repo})
    t0 = time.monotonic()
    out = sh(env, "(setsid sh -c 'sleep 1.5; touch late1' &) ; sleep 30")
    assert time.monotonic() - t0 < 3 and "timeout: still running" in out
    out = sh(env, "(sleep 1; touch late2) & echo started")  # returns; its child must not stay
    assert out.startswith("exit code: 0") and "started" in out
    time.sleep(1.8)
    assert not any(os.path.exists(os.path.join(env.workdir, f)) for f in ("late1", "late2"))
    out = sh(env, ":(){ :|:& };:")  # a fork bomb is capped by procs and the timeout
    assert "exit code" in out
    assert sh(env, "echo alive").startswith("exit code: 0")
    env.close()


def test_output_is_capped_with_a_note(repo):
    env = BashEnv(step_timeout_s=10, max_output_chars=3000)
    env.reset({"prompt": "p", "repo": repo})
    out = sh(env, "seq 1 50000")
    assert len(out) < 3100 and "characters cut" in out and out.rstrip().endswith("50000")
    out = sh(env, "yes | head -c 5000000")  # past Limits.output_bytes: killed, said so
    assert "output_limit" in out
    env.close()


def test_bad_calls_and_tasks(repo):
    env = BashEnv(step_timeout_s=10)
    with pytest.raises(InputError, match="reset"):
        env.run("true")
    with pytest.raises(InputError, match="'repo'"):
        env.reset({"prompt": "p", "repo": "/no/such/dir"})
    with pytest.raises(InputError, match="prompt"):
        env.reset({"repo": repo})
    env.reset({"prompt": "p", "repo": repo})
    obs, _, _ = env.step([ToolCall("python", {"code": "1"}, "a"), ToolCall("bash", {}, "b")])
    assert "unknown tool 'python'" in obs[0].content and "non-empty string" in obs[1].content
    env.close()


def test_no_kernel_file_wall_is_refused(repo):
    env = BashEnv(step_timeout_s=10, limits=sandbox.Limits(namespaces=False, landlock=False))
    env.reset({"prompt": "p", "repo": repo})
    out = sh(env, "echo should-not-run")
    assert "sandbox_error" in out and "should-not-run" not in out
    env.close()


def test_episode_with_check_command(repo):
    """A scripted policy edits the copy; the task's check command judges the final state."""
    replies = iter([{"content": "", "tool_calls": [{"id": "c0", "function": {
        "name": "bash", "arguments": json.dumps({"command": "sed -i 's/return 1/return 2/' "
                                                            "pkg/mod.py"})}}]},
                    {"content": "done", "tool_calls": []}])
    env = BashEnv(step_timeout_s=10)
    row = run_episode(env, {"id": "t", "prompt": "make f return 2", "repo": repo,
                            "check": "python -c 'import pkg.mod as m; assert m.f() == 2'"},
                      lambda msgs, tools: next(replies), rid="e0")
    assert row["verifier"]["passed"] is True and row["agent"]["stop"] == "answered"
    assert row["messages"][3]["role"] == "tool" and "exit code: 0" in row["messages"][3]["content"]
    assert "return 1" in open(os.path.join(repo, "pkg", "mod.py")).read()
    env.close()


def test_episode_time_limit(repo):
    env = BashEnv(step_timeout_s=5, episode_timeout_s=1.0)
    env.reset({"prompt": "p", "repo": repo})
    sh(env, "sleep 2")  # runs into the episode limit (cut at what is left)
    obs, done, verdict = env.step([ToolCall("bash", {"command": "true"}, "c1")])
    assert done and verdict.passed is False and "episode" in obs[0].content
    env.close()


_WORKER = r"""
import json, os, socket, sys, time
from rossjax.agents import ToolCall
from rossjax.agents.bash import BashEnv
repo, secret = sys.argv[1], sys.argv[2]
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(4); port = srv.getsockname()[1]
env = BashEnv(step_timeout_s=1.0, read_roots=())
env.reset({"prompt": "p", "repo": repo})
def sh(c):
    return env.step([ToolCall("bash", {"command": c}, "c")])[0][0].content
out = {"id": sh("id -u; echo ok > made.txt; cat made.txt"),
       "write": sh(f"echo y > {repo}/evil.txt; rm -f {repo}/README"),
       "read": sh(f"cat {secret}"),
       "net": sh(f"echo hi > /dev/tcp/127.0.0.1/{port} && echo TCP-OK"),
       "timeout": sh("(setsid sh -c 'sleep 1.5; touch late' &); sleep 30")}
time.sleep(1.5)
out["late"] = os.path.exists(os.path.join(env.workdir, "late"))
out["isolation"] = env.run("true").isolation
env.close()
print(json.dumps(out))
"""


@pytest.mark.skipif(not ROOT or not shutil.which("setpriv"), reason="needs root + setpriv")
def test_landlock_mode_confines_the_same(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from test_faults_sandbox import _as_nobody

    tmp = tempfile.mkdtemp(prefix="rj-bash-", dir="/tmp")
    os.chmod(tmp, 0o777)
    try:
        repo = os.path.join(tmp, "orig")
        os.makedirs(repo)
        with open(os.path.join(repo, "README"), "w") as f:
            f.write("hello\n")
        os.chmod(repo, 0o777)
        os.chmod(os.path.join(repo, "README"), 0o666)
        secret = os.path.join(tmp, "secret.txt")
        with open(secret, "w") as f:
            f.write("TOKEN-2718\n")
        os.chmod(secret, 0o644)
        script = os.path.join(tmp, "w.py")
        with open(script, "w") as f:
            f.write(_WORKER)
        os.chmod(script, 0o644)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        cmd = _as_nobody([sys.executable, script, repo, secret], tmp)
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TMPDIR": tmp, "PYTHONPATH": root})
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert "landlock" in out["isolation"] and "uid" not in out["isolation"], out
        assert "65534" in out["id"] and "ok" in out["id"], out
        assert not os.path.exists(os.path.join(repo, "evil.txt"))
        assert os.path.exists(os.path.join(repo, "README"))
        assert "TOKEN-2718" not in out["read"] and "TCP-OK" not in out["net"], out
        assert "timeout" in out["timeout"] and not out["late"], out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_disk_cap_ends_the_episode(repo):
    env = BashEnv(step_timeout_s=10, limits=sandbox.Limits(procs=64, disk_mb=2, file_mb=1))
    env.reset({"prompt": "p", "repo": repo})
    out = sh(env, "head -c 2000000 /dev/zero > big")  # one file past file_mb: cut by the kernel
    assert os.path.getsize(os.path.join(env.workdir, "big")) <= 1 << 20, out
    obs, done, verdict = env.step([ToolCall("bash", {"command": "for i in 1 2 3; do "
                                                     "head -c 900000 /dev/zero > f$i; done"}, "c")])
    assert done and verdict.passed is False and "disk_limit" in obs[0].content
    env.close()
