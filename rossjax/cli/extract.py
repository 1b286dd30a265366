"""`rossjax extract --config=configs/extract.py --config.model=... --config.input=... --config.output=...`."""

from __future__ import annotations


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config
    from rossjax.probes import store

    c, _, flags = command_config(list(argv or []), "extract", "configs/extract.py",
                                 needs_workdir=False)
    if c.get("kind", "activations") == "grad_sketch":   # LM-head gradient sketches (select)
        from rossjax.probes import grad_sketch

        man = grad_sketch.run(c, flags.workdir or "")
        sk = man["sketch"]
        print(f"rossjax extract: {man['n']} rows x LM-head gradient sketch {sk['k1']} x {sk['k2']} "
              f"(seed {sk['seed']}) -> {man['output']}")
        return 0
    if c.get("kind", "activations") != "activations":
        from rossjax.errors import ConfigError

        raise ConfigError(f"config.kind {c.kind!r} is not one of activations, grad_sketch.")
    man = store.run(c, flags.workdir or "")
    print(f"rossjax extract: {man['n']} rows x layers {man['layers']} x d {man['d_model']} "
          f"({man['pooling']} pooling) on mesh {man['mesh']} -> {man['output']}")
    return 0
