"""`rossjax mix --config=configs/mixture.py [--workdir=DIR]`: draw a token-budgeted mixture of
curated dirs into new shards (rossjax.curate.mixture)."""

from __future__ import annotations

from rossjax.cli.flags import parse_config, repo_config


def main(argv=None) -> int:
    from rossjax.curate.mixture import format_report, run

    cfg, fv, _ = parse_config(list(argv or []), default_config=repo_config("mixture.py"))
    mix = run(cfg, fv.workdir)
    print(format_report(mix.report))
    return 0
