"""`rossjax extract --config=configs/extract.py --config.model=... --config.input=... --config.output=...`."""

from __future__ import annotations


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config
    from rossjax.probes import store

    c, _, flags = command_config(list(argv or []), "extract", "configs/extract.py",
                                 needs_workdir=False)
    man = store.run(c, flags.workdir or "")
    print(f"rossjax extract: {man['n']} rows x layers {man['layers']} x d {man['d_model']} "
          f"({man['pooling']} pooling) on mesh {man['mesh']} -> {man['output']}")
    return 0
