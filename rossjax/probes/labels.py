"""Utility labels from solver trials (PROPEL's U_S) and the label-file reader.

A task x is *useful* to a solver S when its empirical solve rate lands in the learnable band:
    U_S(x) = 1[lo <= solved / valid <= hi]
with lo = 1/8, hi = 3/8 for K = 8 trials. For K = 3 the paper uses the open band (0, 1):
at least one success and one failure. A trial is `True`/`False`, or `None` when the solver's
output could not be judged (timeout, crash); null trials count neither as solved nor as valid.
Rows with fewer than `min_valid` valid trials carry too little evidence and are dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from rossjax.errors import ConfigError, InputError

BANDS = ("closed", "open")


@dataclasses.dataclass(frozen=True)
class Labels:
    """Labels for the rows that survived `min_valid`; `kept` indexes into the input rows."""

    y: np.ndarray           # int32 [m] in {0, 1}
    solve_rate: np.ndarray  # float64 [m]
    n_valid: np.ndarray     # int32 [m]
    kept: np.ndarray        # int64 [m] indices of the surviving input rows


def _as_trial(v, where: str):
    if v is None:
        return None
    if isinstance(v, bool) or (isinstance(v, (int, float)) and v in (0, 1)):
        return bool(v)
    raise InputError(f"{where}: trial value {v!r} is not true/false/1/0/null.")


def utility_labels(trials: Sequence[Sequence], *, lo: float = 1 / 8, hi: float = 3 / 8,
                   band: str = "closed", min_valid: int = 2, where: str = "trials") -> Labels:
    """U_S per row. band="closed": lo <= rate <= hi; band="open": 0 < rate < 1 (the K=3 variant)."""
    if band not in BANDS:
        raise ConfigError(f"{where}: band {band!r} is not one of {BANDS}.")
    if band == "closed" and not 0.0 <= lo <= hi <= 1.0:
        raise ConfigError(f"{where}: band bounds must satisfy 0 <= lo <= hi <= 1, got lo={lo}, hi={hi}.")
    ys, rates, nv, kept = [], [], [], []
    for i, row in enumerate(trials):
        vals = [_as_trial(v, f"{where} row {i + 1}") for v in row]
        valid = [v for v in vals if v is not None]
        if len(valid) < max(min_valid, 1):
            continue
        rate = sum(valid) / len(valid)
        # Compare in integer arithmetic where possible so 1/8 of 8 trials is exactly in band.
        if band == "closed":
            inside = lo * len(valid) - 1e-9 <= sum(valid) <= hi * len(valid) + 1e-9
        else:
            inside = 0 < sum(valid) < len(valid)
        ys.append(int(inside))
        rates.append(rate)
        nv.append(len(valid))
        kept.append(i)
    return Labels(np.asarray(ys, np.int32), np.asarray(rates, np.float64),
                  np.asarray(nv, np.int32), np.asarray(kept, np.int64))


def read_label_file(path: str) -> list[dict]:
    """Rows of a JSONL(.gz) label file: {"id": str, "trials": [true|false|null, ...]} or
    {"id", "label": 0|1}, optionally "group" (for group k-fold) and "valid" (the validity gate W)."""
    from rossjax.curate.files import read_objects

    rows = []
    for n, obj in read_objects(path):
        if "trials" not in obj and "label" not in obj:
            raise InputError(f"{path} row {n}: needs field 'trials' or 'label'.")
        if "trials" in obj and not isinstance(obj["trials"], list):
            raise InputError(f"{path} row {n}: field 'trials' is not a list.")
        if "label" in obj and obj["label"] not in (0, 1):
            raise InputError(f"{path} row {n}: field 'label' is {obj['label']!r}, not 0 or 1.")
        rows.append(obj)
    if not rows:
        raise InputError(f"{path}: the label file has no rows.")
    return rows


def align_labels(rows: list[dict], store_ids: Iterable[str], *, path: str = "labels",
                 **band_kw) -> tuple[np.ndarray, Labels, list]:
    """Match label rows to activation-store rows by id.

    Returns (store_index [m], labels, groups [m]). Every label id must exist in the store: a label
    file built for another store is an error, not a silent partial join.
    """
    index = {k: i for i, k in enumerate(store_ids)}
    missing = [r["id"] for r in rows if r["id"] not in index]
    if missing:
        raise InputError(f"{path}: field 'id' {missing[0]!r} (and {len(missing) - 1} more) is not in "
                         "the activation store; the label file does not match the store.")
    if all("trials" in r for r in rows):
        lab = utility_labels([r["trials"] for r in rows], where=path, **band_kw)
    else:
        lab = Labels(np.asarray([r.get("label", 0) for r in rows], np.int32),
                     np.asarray([r.get("label", 0) for r in rows], np.float64),
                     np.ones(len(rows), np.int32), np.arange(len(rows)))
        if any("label" not in r for r in rows):
            raise InputError(f"{path}: rows mix 'label' and 'trials'; use one form for the whole file.")
    kept_rows = [rows[i] for i in lab.kept]
    store_index = np.asarray([index[r["id"]] for r in kept_rows], np.int64)
    groups = [r.get("group", r["id"]) for r in kept_rows]
    return store_index, lab, groups
