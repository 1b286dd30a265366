"""`rossjax eval-generator --config=configs/eval_generator.py --workdir=DIR`."""

from __future__ import annotations

import json
import sys


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config
    from rossjax.train.propel import eval_generator

    c, workdir, _ = command_config(list(argv or []), "eval-generator", "configs/eval_generator.py")
    out = eval_generator.run(c, workdir)
    print(json.dumps({k: v for k, v in out.items() if k != "solve_counts"}), file=sys.stderr)
    return 0
