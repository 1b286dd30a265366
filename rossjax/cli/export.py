"""`rossjax export --checkpoint DIR [--step N] --format hf|orbax OUT`."""

from __future__ import annotations

USAGE = "usage: rossjax export --checkpoint DIR [--step N] --format hf|orbax OUT"


def main(argv=None) -> int:
    from absl import flags

    from rossjax.cli.flags import parse_config
    from rossjax.errors import UsageError
    from rossjax.train.export import export

    def extra(fv):
        flags.DEFINE_string("checkpoint", None, "Training workdir or checkpoint folder.", flag_values=fv)
        flags.DEFINE_string("format", "hf", "hf | orbax", flag_values=fv)
        flags.DEFINE_integer("step", None, "Step to export (default: the latest).", flag_values=fv)

    _, fv, rest = parse_config(list(argv or []), extra_flags=extra)
    if not fv.checkpoint or len(rest) != 1:
        raise UsageError(USAGE)
    step = export(fv.checkpoint, rest[0], fv.format, fv.step)
    print(f"rossjax export: step {step} of {fv.checkpoint} written to {rest[0]} ({fv.format}).")
    return 0
