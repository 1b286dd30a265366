"""Benchmarks: `rossjax bench <name>` or `python -m rossjax.bench <name>`.

Each benchmark measures rossjax and its peer in the same run and prints the ratio; none is a
timed test. Names: model, sft, sample, curate, select, grpo.
"""

from __future__ import annotations

import importlib
import sys

BENCHES = ("model", "sft", "sample", "curate", "select", "grpo")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHES:
        print(f"usage: rossjax bench {{{'|'.join(BENCHES)}}} [flags]", file=sys.stderr)
        return 2
    try:
        mod = importlib.import_module(f"rossjax.bench.{argv[0]}")
    except ModuleNotFoundError as e:
        if e.name == f"rossjax.bench.{argv[0]}":
            print(f"rossjax bench: {argv[0]!r} is not available in this build", file=sys.stderr)
            return 2
        raise
    return int(mod.main(argv[1:]) or 0)
