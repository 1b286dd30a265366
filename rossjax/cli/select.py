"""`rossjax select`."""

from __future__ import annotations


def main(argv=None) -> int:
    from rossjax.curate.select_cli import main as _main  # TODO(arch): body moves here; library exposes run(cfg, workdir)

    return _main(argv)
