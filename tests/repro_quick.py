"""`rossjax repro NAME --quick` in a subprocess, as users run it, for the repro tests."""

import json
import os
import subprocess
import sys


def run_quick(name, workdir, timeout=3600):
    """(results.json, stdout) of a quick run in `workdir`. One CPU device and XLA's full
    optimization: the runs train hundreds of steps (tests/conftest.py's -O0 would cost more than
    it saves), and a few packed rows a step do not divide the tests' 8 simulated devices."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "JAX_DISABLE_MOST_OPTIMIZATIONS")}
    out = subprocess.run([sys.executable, "-m", "rossjax.cli", "repro", name, "--workdir",
                          str(workdir), "--quick"], env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(workdir / name / "results.json") as f:
        res = json.load(f)
    assert (workdir / name / "report.md").exists()
    return res, out.stdout
