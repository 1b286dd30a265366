"""Grain in a process whose command line was parsed into its own absl FlagValues."""

from __future__ import annotations


def mark_absl_parsed():
    """Grain's worker code reads its absl flags from the global FLAGS; our CLI parses into its own
    FlagValues, so let grain see its defaults."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
