"""`rossjax label-corpus --config=configs/label_corpus.py --config.pool=POOL --workdir=DIR`."""

from __future__ import annotations


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config
    from rossjax.train.propel import label_corpus

    c, workdir, flags = command_config(list(argv or []), "label-corpus", "configs/label_corpus.py",
                                       needs_workdir=False)
    r = label_corpus.run(c, workdir)
    o = r.get("oracles")
    oracles = (f"; oracles: {o['agreed']} agreed, {o['disagreement']} disagreed, {o['failure']} "
               f"failed, {o['a']['trials'] + o['b']['trials']} oracle trials" if o else "")
    print(f"rossjax label-corpus: {r['tasks']} {r['domain']} tasks, {r['valid']} valid, "
          f"K={r['k']} ({r['solver']['kind']}, {r['solver']['trials']} solver trials{oracles}), "
          f"band rate {r['band_rate']:.3f} -> {r['output']}")
    for tid, why in list(r["invalid"].items())[:5]:  # the rest: labels.jsonl, report.json
        print(f"  invalid {tid}: {why}")
    if len(r["invalid"]) > 5:
        print(f"  ... {len(r['invalid']) - 5} more invalid tasks in {r['output']}/report.json")
    if "kept" in r:  # swe: only bugs with >= min_valid judged trials are labels
        print(f"  kept {r['kept']} of {r['valid']} valid bugs (>= {r['min_valid']} judged "
              f"trials); {len(r['dropped'])} dropped (report.json says why)")
    for cmd in r.get("next", []):
        print(f"next: {cmd}")
    return 0
