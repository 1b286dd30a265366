"""Miniature, controlled reproductions of the papers' central claims (`rossjax repro`).

Truth is known by construction (synthetic task families, a noisy policy with planted errors, a
programmatic reviewer, known route families), and every stage runs the real pipeline: `rossjax
curate`, `select`, `train`, `export` through the CLI dispatcher, `rossjax.sample.generate` to
evaluate. See ross.py, routes.py and propel.py for each experiment's design and claims.
"""

from __future__ import annotations

import importlib
import os
import time

EXPERIMENTS = ("ross", "routes", "propel")


def run(name: str, workdir: str, *, seeds: int, quick: bool, command, log=print) -> str:
    """Run (or resume) one experiment in WORKDIR/<name>; write results.json, report.md and the
    plots there; return the one-screen summary. `command` is the CLI dispatcher
    (`rossjax.cli.main`) that runs each stage as a user would type it."""
    from rossjax.repro import report, stages

    if name not in EXPERIMENTS:
        from rossjax.errors import UsageError

        raise UsageError(f"rossjax repro: experiment {name!r} is not one of "
                         f"{', '.join(EXPERIMENTS)}, all.")
    mod = importlib.import_module(f"rossjax.repro.{name}")
    stages.COMMAND = command
    stages.enable_compile_cache(os.path.join(workdir, "jax-cache"))
    folder = os.path.join(workdir, name)
    t0 = time.time()
    results = mod.run(folder, seeds=seeds, quick=quick, log=log)
    results["seconds"] = round(time.time() - t0, 1)
    cmd = f"rossjax repro {name} --workdir {workdir} --seeds {seeds}" + (" --quick" if quick else "")
    return report.write(folder, results, mod, cmd)
