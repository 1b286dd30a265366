"""`rossjax label-corpus --config=configs/label_corpus.py --config.pool=POOL --workdir=DIR`."""

from __future__ import annotations


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config
    from rossjax.train import label_corpus

    c, workdir, flags = command_config(list(argv or []), "label-corpus", "configs/label_corpus.py",
                                       needs_workdir=False)
    r = label_corpus.run(c, workdir)
    print(f"rossjax label-corpus: {r['tasks']} tasks, {r['valid']} valid, K={r['k']} "
          f"({r['solver']}), band rate {r['band_rate']:.3f} -> {r['output']}")
    for tid, why in list(r["invalid"].items())[:5]:  # the rest: labels.jsonl, report.json
        print(f"  invalid {tid}: {why}")
    if len(r["invalid"]) > 5:
        print(f"  ... {len(r['invalid']) - 5} more invalid tasks in {r['output']}/report.json")
    return 0
