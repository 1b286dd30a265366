"""The adversarial auxiliary probe's training set, as PROPEL defines it, built from a GRPO run
(`rossjax aux-set`).

  positives  the original probe's band positives: rows of its own label corpus whose solve rate
             lands in the learnable band (U_S = 1);
  negatives  the run's false positives (valid generated tasks the probe scored >= `threshold`
             whose realized solve count is outside the band) plus the dominant collapsed family
             (every valid task of the most common family among the run's last `last_steps`
             steps: what the generator collapsed onto while the probe kept paying for it).

Inputs are `rossjax label-corpus` outputs: the original corpus (labels.jsonl + inputs.jsonl) and
the run's history labelled the same way (its rows carry probe_score, step and family). Outputs
aux_labels.jsonl ({"id", "label", "source"}) and aux_inputs.jsonl (the matching extract rows,
same ids), so `rossjax extract` + `rossjax probe-sweep` train the auxiliary probe as any other.
"""

from __future__ import annotations

import collections
import json
import os

from rossjax.errors import ConfigError, InputError
from rossjax.probes import labels as labels_mod


def _jsonl(path: str, field: str) -> list[dict]:
    from rossjax.curate.files import read_objects

    if not os.path.isfile(path):
        raise ConfigError(f"configs/aux_set.py: field '{field}' is {path!r}, which is not a file.")
    return [obj for _, obj in read_objects(path, id_field=None)]


def _in_band(rows, path, band_kw) -> dict:
    """id -> 0/1 for the rows with enough valid trials (or an explicit label)."""
    lab = labels_mod.utility_labels([r.get("trials", []) for r in rows], where=path, **band_kw) \
        if all("trials" in r for r in rows) else None
    if lab is None:
        return {r["id"]: int(r["label"]) for r in rows if "label" in r}
    return {rows[i]["id"]: int(y) for i, y in zip(lab.kept, lab.y)}


def build(original: list[dict], run: list[dict], *, threshold: float = 0.5, last_steps: int = 0,
          band_kw: dict | None = None, run_path: str = "run_labels",
          original_path: str = "original_labels") -> tuple[list[dict], dict]:
    """(rows [{"id", "label", "source"}], report) from the original and the run's label rows."""
    band_kw = band_kw or {}
    pos = [i for i, y in _in_band(original, original_path, band_kw).items() if y == 1]
    for n, r in enumerate(run, 1):
        if "probe_score" not in r:
            raise InputError(f"{run_path} row {n}: field 'probe_score' is missing; label the "
                             "run's history.jsonl with `rossjax label-corpus` (it keeps the scores).")
    band = _in_band([r for r in run if r.get("valid", 1)], run_path, band_kw)
    fp = [r["id"] for r in run if r["id"] in band and band[r["id"]] == 0
          and float(r["probe_score"]) >= threshold]
    valid = [r for r in run if r.get("valid", 1)]
    if last_steps > 0 and valid and all("step" in r for r in valid):
        top = max(int(r["step"]) for r in valid)
        valid = [r for r in valid if int(r["step"]) > top - last_steps]
    fams = collections.Counter(r.get("family", "other") for r in valid)
    family, count = fams.most_common(1)[0] if fams else (None, 0)
    fam_ids = [r["id"] for r in valid if r.get("family", "other") == family]
    clash = set(pos) & ({r["id"] for r in run})
    if clash:
        raise InputError(f"{run_path}: id {sorted(clash)[0]!r} is also in {original_path}; the "
                         "original corpus and the run must not share ids.")
    source = {i: "band_positive" for i in pos}
    for i in fp:
        source[i] = "false_positive"
    for i in fam_ids:
        source[i] = "false_positive+collapsed_family" if i in fp else "collapsed_family"
    rows = [{"id": i, "label": int(s == "band_positive"), "source": s} for i, s in source.items()]
    report = {"positives": len(pos), "false_positives": len(fp), "collapsed_family": family,
              "collapsed_family_rows": len(fam_ids),
              "collapsed_family_share": count / max(1, len(valid)),
              "negatives": sum(1 for r in rows if r["label"] == 0), "threshold": threshold,
              "last_steps": last_steps}
    return rows, report


def run(c, workdir: str = "") -> dict:
    """`rossjax aux-set` (configs/aux_set.py): write aux_labels.jsonl, aux_inputs.jsonl and
    report.json; return the report plus "output"."""
    out = c.output or (os.path.join(workdir, "aux_set") if workdir else "")
    if not out:
        raise ConfigError("configs/aux_set.py: field 'output' (or --workdir) must be set.")
    original = _jsonl(c.original_labels, "original_labels")
    run_rows = _jsonl(c.run_labels, "run_labels")
    band_kw = {"lo": c.lo, "hi": c.hi, "band": c.band, "min_valid": c.min_valid}
    rows, report = build(original, run_rows, threshold=c.threshold, last_steps=c.last_steps,
                         band_kw=band_kw, run_path=c.run_labels, original_path=c.original_labels)
    wanted = {r["id"] for r in rows}
    inputs = {}
    for path, field in ((c.original_inputs, "original_inputs"), (c.run_inputs, "run_inputs")):
        for r in _jsonl(path, field):
            if r.get("id") in wanted:
                inputs[r["id"]] = r
    missing = [r["id"] for r in rows if r["id"] not in inputs]
    if missing:
        raise InputError(f"configs/aux_set.py: id {missing[0]!r} (and {len(missing) - 1} more) has "
                         "no row in original_inputs / run_inputs.")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "aux_labels.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(out, "aux_inputs.jsonl"), "w") as f:
        f.writelines(json.dumps(inputs[r["id"]]) + "\n" for r in rows)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    return {**report, "output": out}
