"""`rossjax probe-sweep --config=configs/probe_sweep.py --config.labels=... --config.output=...`."""

from __future__ import annotations


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config
    from rossjax.probes import sweep

    c, _, flags = command_config(list(argv or []), "probe-sweep", "configs/probe_sweep.py",
                                 needs_workdir=False)
    res = sweep.run(c, flags.workdir or "")
    sel = res["selected"]
    s = sel["summary"]
    print(f"rossjax probe-sweep: {len(res['cells'])} cells -> {res['output']}")
    print(f"  selected {sel['head']} layer {sel['layer']} {sel['pooling']} ({sel['balance']}): "
          f"val bacc {s['val_balanced_accuracy']:.3f}, val ECE {s['val_ece_raw']:.3f} before / "
          f"{s['val_ece']:.3f} after temperature calibration (the ceiling applies before), "
          f"test bacc {s['test_balanced_accuracy']:.3f}, RVP {s['rvp']:.4f} [{sel['selection_note']}]")
    return 0
