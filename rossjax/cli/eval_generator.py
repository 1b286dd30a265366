"""`rossjax eval-generator`."""

from __future__ import annotations


def main(argv=None) -> int:
    from rossjax.train.eval_generator import main as _main  # TODO(arch): body moves here; library exposes run(cfg, workdir)

    return _main(argv)
