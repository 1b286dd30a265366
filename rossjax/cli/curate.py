"""`rossjax curate --config=configs/curate.py --config.input=ROLLOUTS --config.output=DIR`: verify,
compile token masks, write ArrayRecord shards and report.json (rossjax.curate.pipeline)."""

from __future__ import annotations

from rossjax.cli.flags import parse_config, repo_config
from rossjax.errors import UsageError


def main(argv=None) -> int:
    from rossjax.curate.pipeline import run

    cfg, fv, rest = parse_config(list(argv or []), default_config=repo_config("curate.py"))
    if rest:
        raise UsageError(f"rossjax curate takes no positional arguments, got {' '.join(rest)}")
    run(cfg, fv.workdir)
    return 0
