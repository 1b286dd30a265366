"""`rossjax repro ross|routes|propel|retrogen|all --workdir DIR [--seeds N] [--quick]`.

Miniature, controlled reproductions of the papers' claims on this CPU (rossjax/repro), each
stage a real rossjax command:
  ross    noisy rollouts with planted errors -> curate (ROSS mask / no mask / positive SFT)
          -> train -> held-out accuracy and error imitation        (full ~9 min, quick ~2.5)
  routes  a pool of six route families -> select (diverse / random / similar / topology)
          -> relearn -> coverage of routes on held-out problems    (full ~12 min, quick ~3)
  propel  a task generator -> labelled pool -> extract + probe-sweep -> GRPO with the probe
          reward vs a heuristic -> utility, validity, diversity    (full ~18 min, quick ~7.5)
  retrogen  a corpus world -> reconstruct (RetroGen / ForwardGen, stand-in endpoint) -> retrogen
          (threshold / Artifact-Only / next-N replace) -> SFT -> agent eval on held-out
          questions (quick ~1 min; not in `all`: no full run in README's Evidence yet)
Times are for 2 CPU cores. Each experiment writes DIR/<name>/results.json, report.md and PNG
plots and prints a summary table; a rerun reuses every finished stage (DIR/<name>/.stages),
and a DIR holding a run of other sizes (quick vs full) is refused.
"""

from __future__ import annotations

import argparse
import sys

from rossjax.errors import UsageError


def main(argv=None) -> int:
    from rossjax import repro
    from rossjax.cli import main as command

    p = argparse.ArgumentParser(prog="rossjax repro", description=__doc__.strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                exit_on_error=False)
    p.add_argument("experiment", choices=[*repro.EXPERIMENTS, *repro.PRELIMINARY, "all"])
    p.add_argument("--workdir", required=True, help="output directory (reused on reruns)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per arm (default 3; 1 quick)")
    p.add_argument("--quick", action="store_true", help="the small variant: 1 seed, smaller pools and fewer steps")
    try:
        a = p.parse_args(list(argv or []))
    except (argparse.ArgumentError, SystemExit) as e:
        if isinstance(e, SystemExit) and e.code == 0:  # --help
            return 0
        raise UsageError(f"{e}; usage: rossjax repro ross|routes|propel|retrogen|all --workdir "
                         f"DIR "
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
