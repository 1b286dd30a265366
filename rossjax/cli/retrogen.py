"""`rossjax retrogen --config=configs/retrogen.py [--workdir=DIR]`: score agent trajectories and
serialize the kept ones as rollouts (rossjax.curate.retrogen)."""

from __future__ import annotations

import os
import sys

from rossjax.cli.flags import parse_config, repo_config


def main(argv=None) -> int:
    from rossjax.curate.retrogen import format_report, run

    cfg, fv, _ = parse_config(list(argv or []), default_config=repo_config("retrogen.py"))
    out_dir = fv.workdir or cfg.output
    res = run(cfg, out_dir)
    print(format_report(res.report))
    gone = {}
    for d in res.discarded:
        gone[d["reason"]] = gone.get(d["reason"], 0) + 1
    if not res.kept and not res.discarded:
        print(f"warning: {cfg.input} holds no rows", file=sys.stderr)
    print(f"kept {len(res.kept)}, discarded {len(res.discarded)} "
          f"({', '.join(f'{k} {n}' for k, n in sorted(gone.items())) or 'none'}) "
          f"-> {os.path.join(out_dir, 'retrogen.jsonl')}")
    return 0
