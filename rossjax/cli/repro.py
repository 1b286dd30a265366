"""`rossjax repro ross|routes|propel|all --workdir DIR [--seeds N] [--quick]`.

Miniature, controlled reproductions of the papers' claims on this CPU (rossjax/repro). Each
experiment writes DIR/<name>/results.json, report.md and PNG plots and prints a summary table;
a rerun reuses every finished stage (DIR/<name>/.stages).
"""

from __future__ import annotations

import argparse
import sys

from rossjax.errors import UsageError


def main(argv=None) -> int:
    from rossjax import repro
    from rossjax.cli import main as command

    p = argparse.ArgumentParser(prog="rossjax repro", description=__doc__.strip().split("\n")[0],
                                exit_on_error=False)
    p.add_argument("experiment", choices=[*repro.EXPERIMENTS, "all"])
    p.add_argument("--workdir", required=True, help="output directory (reused on reruns)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per arm (default 3; 1 quick)")
    p.add_argument("--quick", action="store_true", help="the small variant (minutes)")
    try:
        a = p.parse_args(list(argv or []))
    except (argparse.ArgumentError, SystemExit) as e:
        if isinstance(e, SystemExit) and e.code == 0:  # --help
            return 0
        raise UsageError(f"{e}; usage: rossjax repro ross|routes|propel|all --workdir DIR "
                         f"[--seeds N] [--quick]") from None
    seeds = a.seeds if a.seeds is not None else (1 if a.quick else 3)
    if seeds < 1:
        raise UsageError(f"--seeds {seeds}: need at least 1.")
    names = repro.EXPERIMENTS if a.experiment == "all" else (a.experiment,)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    for name in names:
        print(repro.run(name, a.workdir, seeds=seeds, quick=a.quick, command=command,
                                   log=log), flush=True)
    return 0
