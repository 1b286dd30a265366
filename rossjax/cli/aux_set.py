"""`rossjax aux-set --config=configs/aux_set.py --config.original_labels=... --config.run_labels=...`."""

from __future__ import annotations


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config
    from rossjax.probes import auxiliary

    c, workdir, _ = command_config(list(argv or []), "aux-set", "configs/aux_set.py",
                                   needs_workdir=False)
    r = auxiliary.run(c, workdir)
    print(f"rossjax aux-set: {r['positives']} positives, {r['false_positives']} false positives, "
          f"collapsed family {r['collapsed_family']!r} ({r['collapsed_family_rows']} rows) -> "
          f"{r['output']}")
    return 0
