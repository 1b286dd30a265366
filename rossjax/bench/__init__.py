"""Benchmarks: `rossjax bench <name> [flags]` (rossjax/cli/bench.py).

Each benchmark measures rossjax and its peer in the same run and prints the ratio; none is a
timed test. Each module's `main(argv)` parses its own flags and runs it. What makes the two
sides comparable (machine, settings, the asserted sameness check, work counts) lives in
compare.py.
"""

from __future__ import annotations

import importlib

BENCHES = ("model", "sft", "sample", "curate", "select", "grpo", "distill", "serve", "all")


def load(name: str):
    """The benchmark module `rossjax.bench.<name>`, or None when this build does not ship it."""
    if name not in BENCHES:
        raise KeyError(name)
    try:
        return importlib.import_module(f"rossjax.bench.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"rossjax.bench.{name}":
            return None
        raise  # a missing dependency of the benchmark is a real error, with its traceback
