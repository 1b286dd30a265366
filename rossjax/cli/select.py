"""`rossjax select --config=configs/select_routes.py [--workdir=DIR]`: fingerprint rollouts (or a
curated dir), select a subset, write it with report.json and a PNG (rossjax.curate.subset)."""

from __future__ import annotations

from rossjax.cli.flags import parse_config, repo_config
from rossjax.errors import ConfigError


def read_store(path: str, layer: int | None):
    """(ids, read_rows) of a finished `rossjax extract` store, its checksums verified
    (rossjax.probes.store; imports jax, so only the store-backed methods load it)."""
    from rossjax.probes.store import open_store

    store = open_store(path)
    layer = store.manifest["layers"][-1] if layer is None else layer
    return store.ids, lambda rows: store.read(layer, rows)


def main(argv=None) -> int:
    from rossjax.curate.subset import run

    cfg, fv, _ = parse_config(list(argv or []), default_config=repo_config("select_routes.py"))
    runner = cfg.get("runner", "local")
    if runner not in ("local", "beam"):
        raise ConfigError(f"config.runner {runner!r} must be 'local' or 'beam'")
    fingerprinter = None
    if runner == "beam":  # fingerprints on Apache Beam (the beam extra); selection stays here
        from rossjax.curate.beam_select import fingerprinter
    report = run(cfg, fv.workdir or cfg.output, fingerprinter=fingerprinter, read_store=read_store)
    r = report["rows"]
    skipped = ", ".join(f"{k} {n}" for k, n in sorted(r["skipped"].items())) or "none"
    print(f"selected {r['selected']} of {report['pool']['rows']} usable rows "
          f"({r['input_rows']} read; skipped: {skipped}) with {report['method']} "
          f"-> {report['output']}")
    print(f"{'method':10s} {'mean dist':>9s} {'routes':>7s} {'clusters':>8s}")
    for m, s in report["methods"].items():
        print(f"{m:10s} {s['mean_pairwise_distance']:9.3f} {s['distinct_label_sequences']:7d} "
              f"{s['clusters_covered']:8d}")
    return 0
