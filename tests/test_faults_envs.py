"""Environments an episode cannot game (issue 36 item 5), attacked as a policy would.

  - the python/calculator envs' final answer: integers compare exactly (1000000000 is not
    1000000001), floats within the stated tolerance (rossjax/agents/builtin.py);
  - the bash env (and the SWE solver episode over it): the package's clean SWE sources are never
    readable from inside an episode, neither by `cp` nor by python, in a wheel-style install (the
    package inside the venv) nor in this editable one, as root and as uid 65534 (Landlock).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from rossjax.agents import make_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("env_name", ["python", "calculator"])
def test_integers_compare_exactly_floats_with_the_stated_tolerance(env_name):
    env = make_env(env_name)
    env.reset({"prompt": "p", "answer": "1000000001"})
    assert env.finish("Answer: 1000000000").passed is False  # isclose(rel 1e-9) said equal
    assert env.finish("Answer: 1000000002").passed is False
    assert env.finish("Answer: 1000000001").passed is True
    assert env.finish("Answer: 1000000001.0").passed is True  # the same number, exactly
    assert env.finish("Answer: 1000000001.0000001").passed is False
    env.reset({"prompt": "p", "answer": 10 ** 18 + 1})  # past float precision
    assert env.finish(f"Answer: {10 ** 18}").passed is False
    assert env.finish(f"Answer: {10 ** 18 + 1}").passed is True
    assert env.finish("Answer: 1e18").passed is False
    env.reset({"prompt": "p", "answer": "0.1"})  # a float: within rel 1e-9 / abs 1e-9
    assert env.finish("Answer: 0.1000000000001").passed is True
    assert env.finish("Answer: 0.1001").passed is False
    env.reset({"prompt": "p", "answer": 2.5, "tolerance": 0.01})  # a task's own, stated
    assert env.finish("Answer: 2.509").passed is True
    assert env.finish("Answer: 2.52").passed is False
    env.reset({"prompt": "p", "answer": "Seine"})
    assert env.finish("Answer: seine").passed is True and env.finish("nan").passed is False


def test_answers_that_are_no_number_or_a_huge_one():
    env = make_env("python")
    env.reset({"prompt": "p", "answer": "5"})
    assert env.finish("Answer: 1e999999999").passed is False  # text, never 10**999999999
    assert env.finish("Answer: 5e0").passed is True and env.finish("Answer: inf").passed is False
    env.reset({"prompt": "p", "answer": 5, "tolerance": "wide"})
    assert env.finish("Answer: 5").passed is None


_WORKER = r"""
import json, os, shutil, sys
sys.path.insert(0, os.environ["RJ_REPO"])
from rossjax.agents import ToolCall
from rossjax.agents.bash import BashEnv
from rossjax.verify import repo as rrepo, sandbox, swe
tmp, out_path, mode = sys.argv[1:4]
CORE = "textkit/core.py"
clean = os.path.join(os.environ["RJ_REPO"], "rossjax", "data", "swe", "textkit")  # editable
ver = "python%d.%d" % sys.version_info[:2]
venv = os.path.join(tmp, "venv")  # a wheel install: the package and its data inside the venv
wheel = os.path.join(venv, "lib", ver, "site-packages", "rossjax", "data", "swe", "textkit")
shutil.copytree(clean, wheel)
with open(os.path.join(venv, "pyvenv.cfg"), "w") as f:
    f.write("home = /usr/bin\n")
base = swe.baseline(clean)
sys.prefix = venv  # what the bash env's read root used to be
bug = dict(base.files)
bug[CORE] = bug[CORE].replace("    if len(text) <= width:\n", "    if len(text) < width:\n")
src = os.path.join(tmp, "buggy")
rrepo.write_tree(bug, src)
kw = {}
if mode == "rlimits":  # no kernel file wall: the bash env refuses to run anything
    kw["limits"] = sandbox.Limits(procs=64, memory_mb=2048, output_bytes=1 << 20,
                                  landlock=False, namespaces=False)
env = BashEnv(step_timeout_s=10,
              grader=lambda wd, t: swe.check_fix(base, bug, wd, timeout_s=20), **kw)
def sh(cmd):
    return env.step([ToolCall("bash", {"command": cmd}, "c")])[0][0].content
res = {}
for where, root in (("wheel", wheel), ("editable", clean)):
    core = os.path.join(root, CORE)
    for how, cmd in (("cp", f"cp {core} {CORE}; echo rc=$?"),
                     ("python", f"python -c \"import shutil; shutil.copy('{core}', '{CORE}')\""),
                     ("pyread", f"python -c \"print(open('{core}').read())\" > {CORE}.new; "
                                f"mv {CORE}.new {CORE}")):
        env.reset({"prompt": "fix the bug", "repo": src})
        out = sh(cmd)
        with open(os.path.join(env.workdir, CORE)) as f:
            res[f"{where}_{how}"] = [f.read() == base.files[CORE], out]
env.reset({"prompt": "fix the bug", "repo": src})  # the buggy copy, untouched
res["import_rossjax"] = sh("python -c 'import rossjax; print(rossjax.__file__)'")
res["pytest"] = sh("python -m pytest -q -p no:cacheprovider 2>&1 | tail -2")
res["tmp"] = sh("echo x > /tmp/x && cat /tmp/x")
res["verdict"] = list(env.finish("done"))
res["isolation"] = env.run("true").isolation
env.close()
with open(out_path, "w") as f:
    json.dump(res, f)
"""

ROOT = os.geteuid() == 0
MODES = ["root", "landlock", "rlimits"] if ROOT else ["landlock", "rlimits"]


@pytest.fixture(scope="module", params=MODES)
def episode(request):
    mode = request.param
    if ROOT and mode != "root" and not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("unshare/setpriv (util-linux) are needed to run the host side unprivileged")
    tmp = tempfile.mkdtemp(prefix="rj-faults-env-", dir="/tmp")
    os.chmod(tmp, 0o777)
    try:
        script, out = os.path.join(tmp, "w.py"), os.path.join(tmp, "out.json")
        with open(script, "w") as f:
            f.write(_WORKER)
        os.chmod(script, 0o644)
        argv = [sys.executable, script, tmp, out, mode]
        if ROOT and mode != "root":
            sys.path.insert(0, os.path.dirname(__file__))
            from test_faults_sandbox import _as_nobody
            argv = _as_nobody(argv, tmp)
            argv[-1] = argv[-1].replace(" env -i ", f" env -i RJ_REPO='{REPO}' ")
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TMPDIR": tmp, "RJ_REPO": REPO})
        assert proc.returncode == 0 and os.path.exists(out), proc.stderr[-3000:]
        with open(out) as f:
            return mode, json.load(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("attack", ["wheel_cp", "wheel_python", "wheel_pyread", "editable_cp",
                                    "editable_python", "editable_pyread"])
def test_an_episode_cannot_copy_the_clean_source(episode, attack):
    mode, res = episode
    copied, out = res[attack]
    assert copied is False, (mode, attack, out)


def test_the_episode_runtime_holds_pytest_not_rossjax(episode):
    mode, res = episode
    if mode == "rlimits":
        assert "sandbox_error" in res["pytest"] and res["verdict"][0] is False, res
        return
    layers = res["isolation"]
    assert ("rootfs" in layers) if mode == "root" else ("landlock" in layers), (mode, layers)
    assert "No module named 'rossjax'" in res["import_rossjax"], (mode, res["import_rossjax"])
    assert "failed" in res["pytest"] and "passed" in res["pytest"], (mode, res["pytest"])
    assert res["verdict"][0] is False and "tests_fail" in res["verdict"][1], (mode, res)
    if mode == "root":  # the runtime is outside /tmp: /tmp stays the sandbox's own scratch
        assert res["tmp"].startswith("exit code: 0") and "x" in res["tmp"], res["tmp"]


def test_a_read_root_holding_the_package_is_refused(tmp_path):
    """An install where the sandbox could read the package (a read root above it, as the
    interpreter's own prefix is in a non-venv install) refuses to start an episode."""
    from rossjax.agents.bash import BashEnv
    from rossjax.errors import InputError

    repo = tmp_path / "r"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1\n")
    env = BashEnv(read_roots=(os.path.dirname(REPO),))
    with pytest.raises(InputError, match="clean SWE sources"):
        env.reset({"prompt": "p", "repo": str(repo)})


def test_a_changed_runtime_is_rebuilt_never_reused():
    """run_suite's checker imports pytest from the runtime: a file of it that changed after the
    build (a run without kernel file walls could write it) is never used again."""
    from rossjax.verify import repo as rrepo

    first = rrepo.runtime_root()
    assert rrepo.runtime_root() == first
    assert not os.path.exists(os.path.join(first, "lib", "python%d.%d" % sys.version_info[:2],
                                           "site-packages", "rossjax"))
    init = os.path.join(first, "lib", "python%d.%d" % sys.version_info[:2], "site-packages",
                        "_pytest", "reports.py")
    st = os.stat(init)
    with open(init, "r+") as f:  # same size, same mtime afterwards: only the ctime tells
        text = f.read()
        f.seek(0)
        f.write(text.replace("passed", "PASSED", 1))
    os.utime(init, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.warns(RuntimeWarning, match="changed after it was built"):
        fresh = rrepo.runtime_root()
    assert fresh != first and rrepo.default_read_roots() == (fresh,)
    shutil.rmtree(first, ignore_errors=True)
