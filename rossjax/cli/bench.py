"""`rossjax bench {model|sft|sample|curate|select|grpo} [flags]`: run one benchmark against its
peer (rossjax/bench/); the flags after the name belong to that benchmark."""

from __future__ import annotations

import sys

from rossjax.errors import UsageError


def main(argv=None) -> int:
    from rossjax import bench

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in bench.BENCHES:
        raise UsageError(f"usage: rossjax bench {{{'|'.join(bench.BENCHES)}}} [flags]")
    mod = bench.load(argv[0])
    if mod is None:
        raise UsageError(f"{argv[0]!r} is not available in this build")
    return int(mod.main(argv[1:]) or 0)
