"""`rossjax bench {model|sft|sample|curate|select|grpo|distill|serve|all} [flags]`: run one benchmark against its
peer (rossjax/bench/); the flags after the name belong to that benchmark
(`rossjax bench NAME --help` lists them with their defaults)."""

from __future__ import annotations

import argparse
import sys

from rossjax.cli.flags import HELP_FLAGS, HelpRequested
from rossjax.errors import UsageError


def _bench_help(name: str, mod) -> str:
    """The benchmark's docstring and its argparse flags with their defaults."""
    import contextlib
    import io

    # The benches' parsers use the plain formatter and leave some flags without help; show
    # every flag's default as every other --help does (patched for this one help call only).
    plain_help, plain_add = (argparse.HelpFormatter._get_help_string,
                             argparse.ArgumentParser.add_argument)

    def add_argument(self, *args, **kwargs):
        if kwargs.get("help") is None and kwargs.get("action") not in ("help", "store_true"):
            kwargs["help"] = "(default: %(default)s)"
        return plain_add(self, *args, **kwargs)

    argparse.HelpFormatter._get_help_string = argparse.ArgumentDefaultsHelpFormatter._get_help_string
    argparse.ArgumentParser.add_argument = add_argument
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            mod.main(["--help"])
    except SystemExit:
        pass
    finally:
        argparse.HelpFormatter._get_help_string = plain_help
        argparse.ArgumentParser.add_argument = plain_add
    return f"benchmark {name}:\n\n{(mod.__doc__ or '').strip()}\n\n{out.getvalue().strip()}"


def main(argv=None) -> int:
    from rossjax import bench

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in HELP_FLAGS:
        raise HelpRequested("benchmarks:\n" + "\n".join(f"  {n}" for n in bench.BENCHES))
    if not argv or argv[0] not in bench.BENCHES:
        raise UsageError(f"usage: rossjax bench {{{'|'.join(bench.BENCHES)}}} [flags]")
    mod = bench.load(argv[0])
    if mod is None:
        raise UsageError(f"{argv[0]!r} is not available in this build")
    if any(a in HELP_FLAGS for a in argv[1:]):
        raise HelpRequested(_bench_help(argv[0], mod))
    if argv[0] != "all":   # bench all prints the machine with its table
        from rossjax.bench import compare

        # every figure below is this CPU's: its model and ISA flags come first
        print(compare.machine_line(), flush=True)
    return int(mod.main(argv[1:]) or 0)
