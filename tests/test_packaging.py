"""The wheel carries the shipped configs and sample data, and an installed rossjax finds them with
importlib.resources from any folder: `pip install rossjax` + `rossjax demo` needs no checkout."""

import glob
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "configs", "*.py")))
DATA = ["retrogen/sample.jsonl", "rollouts/sample.jsonl", "select/sample.jsonl",
        "swe/textkit/pyproject.toml", "swe/textkit/textkit/core.py"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """`pip wheel --no-deps` of a copy of the checkout (so no build/ lands in the tree)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".beam", ".git", "runs", "build", "*.egg-info", "__pycache__", ".pytest_cache",
        "tests"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = glob.glob(str(tmp / "dist" / "rossjax-*.whl"))
    return whl


def test_wheel_holds_configs_and_sample_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for c in CONFIGS:
        assert f"rossjax/configs/{c}" in names
    for d in DATA:
        assert f"rossjax/data/{d}" in names
    assert any(n.endswith("entry_points.txt") for n in names)


def test_installed_package_finds_configs_and_data_outside_a_checkout(wheel, tmp_path):
    """The wheel unpacked as site-packages (what pip install does for a pure wheel), run from a
    folder with no checkout: the shipped config's default input is the wheel's own sample, and
    `rossjax curate` curates it into --workdir."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
    code = ("import os, rossjax; from rossjax.cli import repo_config, parse_config; "
            "from rossjax import demo; "
            "cfg, _, _ = parse_config([], default_config=repo_config('curate.py')); "
            "print(rossjax.__file__); print(repo_config('ross_sft.py')); print(cfg.input); "
            "print(demo.data_path('rollouts', 'sample.jsonl'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.split()
    assert all(p.startswith(str(site)) for p in lines), lines
    assert all(os.path.isfile(p) for p in lines)
    r = subprocess.run([sys.executable, "-m", "rossjax.cli", "curate", "--config.verify=stored",
                        "--config.progress=False", f"--workdir={tmp_path / 'curated'}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "curated" / "report.json").is_file()


FAKE_GCLOUD = """#!/usr/bin/env bash
# gcloud stand-in: `compute tpus tpu-vm ssh ... --command CMD` runs CMD in a shell here (HOME is
# the fake worker), as SSH would; anything else is an error.
while [ $# -gt 0 ]; do [ "$1" = "--command" ] && exec bash -c "$2"; shift; done
exit 3
"""
FAKE_ROSSJAX = """#!/usr/bin/env bash
echo "started $*"
sleep 4
echo "done $*"
"""


def test_tpu_vm_run_survives_a_dropped_ssh_session(tmp_path):
    """`launch/tpu_vm.sh run` with its SSH session killed (SIGHUP and SIGKILL to the whole
    session's process group) right after start: the command still runs to its end, logged."""
    import signal
    import time

    home, bin_ = tmp_path / "home", tmp_path / "bin"
    (home / "rossjax" / ".venv" / "bin").mkdir(parents=True)
    bin_.mkdir()
    for path, text in ((bin_ / "gcloud", FAKE_GCLOUD),
                       (home / "rossjax" / ".venv" / "bin" / "rossjax", FAKE_ROSSJAX)):
        path.write_text(text)
        path.chmod(0o755)
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_}:{os.environ['PATH']}"}
    p = subprocess.Popen(["bash", os.path.join(ROOT, "launch", "tpu_vm.sh"), "run", "vm", "zone",
                          "--", "rossjax", "train", "--config.x=a b", "--workdir=w"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    logs = home / "rossjax" / "logs"
    deadline = time.time() + 30
    while time.time() < deadline and not any(
            "started" in f.read_text() for f in logs.glob("run-*.log")):
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGHUP)  # the SSH connection drops
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    (log,) = logs.glob("run-*.log")
    while time.time() < deadline and "[exit" not in log.read_text():
        time.sleep(0.2)
    text = log.read_text()
    assert "started train --config.x=a b --workdir=w" in text
    assert "done train --config.x=a b --workdir=w" in text and "[exit 0]" in text


def test_colab_clones_a_configurable_url():
    import json

    nb = json.load(open(os.path.join(ROOT, "launch", "colab.ipynb")))
    first = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    assert 'os.environ.get("ROSSJAX_REPO"' in first and "# @param" in first
    assert "git clone" in first and "{REPO_URL}" in first and "--branch {REPO_REF}" in first
