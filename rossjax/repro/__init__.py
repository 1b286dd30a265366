"""Miniature, controlled reproductions of the papers' central claims (`rossjax repro`).

Truth is known by construction (synthetic task families, a noisy policy with planted errors, a
programmatic reviewer, known route families), and every stage runs the real pipeline: `rossjax
curate`, `select`, `train`, `export` through the CLI dispatcher, `rossjax.sample.generate` to
evaluate. See ross.py, routes.py, propel.py and retrogen.py for each experiment's design and claims.
"""

from __future__ import annotations

import importlib
import os
import time

EXPERIMENTS = ("ross", "routes", "propel", "retrogen")
# run by name, but neither in `all` nor in README's Evidence until a full run is committed
PRELIMINARY: tuple[str, ...] = ()


def run(name: str, workdir: str, *, seeds: int, quick: bool, command, log=print) -> str:
    """Run (or resume) one experiment in WORKDIR/<name>; write results.json, report.md and the
    plots there; return the one-screen summary. `command` is the CLI dispatcher
    (`rossjax.cli.main`) that runs each stage as a user would type it."""
    from rossjax.repro import report, stages

    if name not in (*EXPERIMENTS, *PRELIMINARY):
        from rossjax.errors import UsageError

        raise UsageError(f"rossjax repro: experiment {name!r} is not one of "
                         f"{', '.join((*EXPERIMENTS, *PRELIMINARY))}, all.")
    mod = importlib.import_module(f"rossjax.repro.{name}")
    stages.COMMAND = command
    stages.enable_compile_cache(os.path.join(workdir, "jax-cache"))
    folder = os.path.join(workdir, name)
    t0 = time.time()
    prov = _first_provenance(folder)
    results = mod.run(folder, seeds=seeds, quick=quick, log=log)
    results["seconds"] = round(time.time() - t0, 1)
    results["provenance"] = prov
    cmd = f"rossjax repro {name} --workdir {workdir} --seeds {seeds}" + (" --quick" if quick else "")
    return report.write(folder, results, mod, cmd)


def _first_provenance(folder: str) -> dict:
    """The provenance of the run that started this folder (its stages hold that code's numbers);
    a resume with other code, jax or threads adds `resumed_with`."""
    import json

    now = provenance()
    path = os.path.join(folder, "provenance.json")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(now, f)
        os.replace(path + ".tmp", path)
        return now
    from rossjax.errors import read_json

    first = read_json(path, "repro provenance")
    return first if first == now else {**first, "resumed_with": now}


def provenance() -> dict:
    """What a table's numbers depend on besides the seeds: the code (git commit, and whether the
    checkout had local changes), jax/jaxlib, and the CPU threads XLA may use (its CPU reductions
    split work by thread count, so another core count can give other floating-point results)."""
    import subprocess

    import jax
    import jaxlib

    here = os.path.dirname(os.path.abspath(__file__))
    git = lambda *a: subprocess.run(["git", "-C", here, *a], capture_output=True, text=True,  # noqa: E731
                                    timeout=30)
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
        commit = head.stdout.strip() if head.returncode == 0 else None
        changed = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        commit = changed = None
    return {"commit": commit, "local_changes": changed, "jax": jax.__version__,
            "jaxlib": jaxlib.__version__, "cpu_threads": len(os.sched_getaffinity(0)),
            "devices": jax.device_count(), "xla_flags": os.environ.get("XLA_FLAGS", "")}
