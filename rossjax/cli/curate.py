"""`rossjax curate --config=configs/curate.py --config.input=ROLLOUTS --config.output=DIR`: verify,
compile token masks, write ArrayRecord shards and report.json (rossjax.curate.pipeline)."""

from __future__ import annotations

import sys

from rossjax.cli.flags import parse_config, repo_config
from rossjax.defaults import curate_recipe
from rossjax.errors import ConfigError, UsageError


def main(argv=None) -> int:
    from rossjax.curate.pipeline import finish, run

    cfg, fv, rest = parse_config(list(argv or []), default_config=repo_config("curate.py"))
    if rest:
        raise UsageError(f"rossjax curate takes no positional arguments, got {' '.join(rest)}")
    set_by_recipe = curate_recipe(cfg)
    if set_by_recipe:
        print(f"rossjax curate: recipe {cfg.recipe}: {' '.join(set_by_recipe)}", file=sys.stderr)
    runner = cfg.get("runner", "local")
    if runner == "beam":  # the same stages on Apache Beam (the beam extra)
        from rossjax.curate.beam import curate as run_on_beam

        finish(cfg, run_on_beam(cfg, fv.workdir), fv.workdir or cfg.output)
    elif runner == "local":
        run(cfg, fv.workdir)
    else:
        raise ConfigError(f"config.runner {runner!r} must be 'local' or 'beam'")
    return 0
