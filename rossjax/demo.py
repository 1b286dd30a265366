"""`make demo`: the most complete pipeline that exists, on the embedded default data in data/."""

from __future__ import annotations


def main(argv) -> int:
    from rossjax.cli import parse_config

    _, flags, _ = parse_config(argv)
    workdir = flags.workdir or "runs/demo"
    print(f"rossjax demo: nothing to run yet (workdir {workdir}).")
    return 0
