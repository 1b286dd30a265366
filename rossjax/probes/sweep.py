"""`rossjax probe-sweep`: grid layer x pooling x head x balance x seed, then pick one probe.

Inputs are finished activation stores (one per pooling, `rossjax extract`) over the same ids and a
label file (solver trials -> U_S, or explicit labels). Every cell trains on the train split, stops
early and calibrates on validation, and is reported on the held-out test split.

Selection, as PROPEL: validation numbers only (test stays untouched for reporting), averaged over
seeds and folds. Cells whose validation ECE measured *before* temperature calibration exceeds
`ece_max` are out; among the rest, every cell within `ba_tolerance` of the best validation
balanced accuracy is a candidate and the highest RVP wins (a slightly less accurate probe whose
reward varies more gives GRPO more signal). RVP is the variance of the exact RL reward (gate +
ensemble) on its own sample of base-model completions (rossjax/probes/rvp.py); without
`rvp_stores` it is NaN and the best balanced accuracy wins. When no cell meets the ECE ceiling
the best-calibrated cell wins and the manifest records it.

Splits, as PROPEL, but never across a group: `split=""` takes the domain's, one seeded 80/10/10
split for math and azr drawn over whole groups (`group_random`: rows sharing the label file's
`group` -- label-corpus writes a hash of the canonical task text -- land on one side, so a
duplicate task cannot sit in train and test), a grouped k-fold for swe (`group_kfold` trains every
fold, `fold=-1`; test = one fold, validation the next, for every seed, and reports the mean over
all of them: 5 folds x 3 seeds). `split=random` is the paper's row-level split, duplicates and all.
Class balance: `balance=()` takes the domain's default, downsampling for math and azr, a
reweighted loss for swe. The RL reward reads raw probe scores for math and azr and calibrated
ones for swe (reward.calibrated_for), so RVP measures those.

Outputs in the output dir: cells.csv (one line per cell and seed), summary.csv (mean over seeds),
heatmap_<head>.png (layer x pooling, validation balanced accuracy), selected_probe/ (orbax) and
selected_probe.json (the manifest: head, layer, pooling, domain, split, the reference model the
activations came from with its architecture and weights sha256, temperature, metrics), report.json
(the split, row counts and the selection), and TensorBoard events (tb/) + metrics.jsonl: every
cell's epoch curve and one point per cell.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable

import numpy as np

from rossjax.errors import ConfigError, InputError
from rossjax.monitor import MetricsWriter
from rossjax.probes import heads, labels as labels_mod, metrics, reward as reward_lib
from rossjax.probes.heads import save_probe
from rossjax.probes.rvp import RvpSample
from rossjax.probes.store import open_store

FIELDS = ("layer", "pooling", "head", "balance", "seed", "fold", "epochs", "temperature",
          "val_balanced_accuracy", "val_ece_raw", "val_ece", "test_accuracy", "test_balanced_accuracy", "test_f1", "test_ece", "test_spearman",
          "rvp", "rvp_source")


DOMAINS = {"math": "downsample", "azr": "downsample", "swe": "reweight"}
# PROPEL's probe protocols; math/azr's 80/10/10 is drawn over groups (duplicates stay together)
SPLITS = {"math": "group_random", "azr": "group_random", "swe": "group_kfold"}
SPLIT_KINDS = ("random", "group_random", "group_kfold")


def make_reward(kind: str = "probe_only", invalid_reward: float = -0.2,
                calibrated: bool = False) -> Callable:
    """reward(probe, x, valid, others=()) -> [n]: the probe score (raw, or calibrated as the RL
    reward reads it for swe), worst-cased with the ensemble's scores `others` (reward.wco),
    through the gate the RL loop applies (`reward.gate`: probe_only | hard_gate | soft_gate),
    so RVP measures exactly its reward."""
    if kind not in reward_lib.GATES:
        raise ConfigError(f"configs/probe_sweep.py: field 'reward' is {kind!r}, not one of "
                          f"{', '.join(reward_lib.GATES)}.")

    def fn(probe, x, valid, others=()):
        s = probe.score(x, calibrated=calibrated)
        return reward_lib.gate(kind, reward_lib.wco([s, *others]) if len(others) else s, valid,
                               invalid_reward)
    return fn


def balances(c) -> tuple:
    """The class-balance strategies to sweep: the config's, else the domain's default."""
    if c.balance:
        return tuple(c.balance)
    if c.domain not in DOMAINS:
        raise ConfigError(f"configs/probe_sweep.py: field 'domain' is {c.domain!r}, not one of "
                          f"{', '.join(DOMAINS)}.")
    return (DOMAINS[c.domain],)


def split_kind(c) -> str:
    """The split to use: the config's, else the domain's (group_random for math/azr,
    group_kfold for swe)."""
    if c.split:
        if c.split not in SPLIT_KINDS:
            raise ConfigError(f"configs/probe_sweep.py: field 'split' is {c.split!r}, not one of "
                              f"{', '.join(SPLIT_KINDS)} (or empty for the domain's).")
        return c.split
    if c.domain not in SPLITS:
        raise ConfigError(f"configs/probe_sweep.py: field 'domain' is {c.domain!r}, not one of "
                          f"{', '.join(SPLITS)}.")
    return SPLITS[c.domain]


def split_description(c) -> str:
    if split_kind(c) == "random":
        return f"random 80/10/10 (split_seed {c.split_seed}) x {len(c.seeds)} seeds"
    if split_kind(c) == "group_random":
        return (f"grouped 80/10/10 (whole groups; split_seed {c.split_seed}) x {len(c.seeds)} "
                "seeds")
    return (f"grouped {c.folds}-fold (test fold f, validation fold f+1; split_seed {c.split_seed})"
            f" x {len(c.seeds)} seeds")


def folds(c) -> list:
    """Fold indices to train: every fold of a group k-fold (fold=-1), else the one given."""
    if split_kind(c) == "group_kfold" and c.fold < 0:
        return list(range(c.folds))
    return [max(c.fold, 0)]


def group_random_split(groups, seed: int = 0, fractions=(0.8, 0.1, 0.1)):
    """Indices (train, val, test) of a seeded 80/10/10 split over whole groups: groups in a
    seeded order fill train up to round(0.8 n) rows, then validation up to round(0.9 n), then
    test. With one row per group the sizes are heads.random_split's."""
    groups = [str(g) for g in groups]
    n, uniq = len(groups), sorted(set(groups))
    if len(uniq) < 3:
        raise InputError(f"grouped 80/10/10 split: need at least 3 groups, got {len(uniq)}; "
                         "give the label file distinct 'group' values or use split=random.")
    a = int(round(fractions[0] * n))
    b = a + int(round(fractions[1] * n))
    sizes = {g: 0 for g in uniq}
    for g in groups:
        sizes[g] += 1
    side, filled = {}, 0
    for i in np.random.default_rng(seed).permutation(len(uniq)):
        g = uniq[i]
        side[g] = 0 if filled < a else 1 if filled < b else 2
        filled += sizes[g]
    of = np.asarray([side[g] for g in groups])
    out = tuple(np.flatnonzero(of == k) for k in range(3))
    if not all(len(x) for x in out):
        raise InputError(f"grouped 80/10/10 split: {n} rows in {len(uniq)} groups leave "
                         f"{'validation' if not len(out[1]) else 'test'} empty (the largest group "
                         f"holds {max(sizes.values())} rows); label more distinct tasks.")
    return out


def _split(c, n, groups, fold):
    if split_kind(c) == "random":
        return heads.random_split(n, seed=c.split_seed)
    if split_kind(c) == "group_random":
        return group_random_split(groups, seed=c.split_seed)
    return heads.group_kfold(groups, k=c.folds, fold=fold, seed=c.split_seed)


def run_sweep(c, out_dir: str, reward_fn: Callable | None = None, progress: bool = True) -> dict:
    from tqdm import tqdm


    if not c.stores or not all(c.stores):
        raise ConfigError("configs/probe_sweep.py: field 'stores' is empty; give the directories "
                         "written by `rossjax extract`.")
    if not os.path.isfile(c.labels):
        raise ConfigError(f"configs/probe_sweep.py: field 'labels' is {c.labels!r}, which is not a file.")
    stores = [open_store(p) for p in c.stores]
    ids = stores[0].ids
    for s in stores[1:]:
        if s.ids != ids:
            raise InputError(f"{s.path}: its ids differ from {stores[0].path}; sweep stores must "
                             "hold the same rows in the same order.")
    rows = labels_mod.read_label_file(c.labels)
    idx, lab, groups = labels_mod.align_labels(rows, ids, path=c.labels, lo=c.lo, hi=c.hi,
                                               band=c.band, min_valid=c.min_valid)
    if len(np.unique(lab.y)) < 2:
        raise InputError(f"{c.labels}: all {len(lab.y)} labelled rows (after min_valid) fall in class "
                         f"{int(lab.y[0]) if len(lab.y) else '-'}; a probe needs both in-band and "
                         "out-of-band rows.")
    splits = {f: _split(c, len(idx), groups, f) for f in folds(c)}
    row_ids = np.asarray([ids[i] for i in idx])
    calibrated = reward_lib.calibrated_for(c.domain)  # as the RL reward reads the probe
    reward_fn = reward_fn or make_reward(c.reward, c.invalid_reward, calibrated)
    sample = RvpSample(c)

    # TensorBoard: each cell's epoch curve under its own tag, and one point per cell under sweep/.
    os.makedirs(out_dir, exist_ok=True)
    writer = MetricsWriter(out_dir)
    cells, trained = [], {}
    grid = [(s, layer, head, bal, seed, fold) for s in stores
            for layer in (c.layers or s.manifest["layers"]) for head in c.heads
            for bal in balances(c) for seed in c.seeds for fold in splits]
    for s, layer, head, bal, seed, fold in tqdm(grid, desc="probe-sweep", disable=not progress):
        tr, va, te = splits[fold]
        x = s.read(layer=layer)[idx]
        tc = heads.TrainConfig(head=head, balance=bal, seed=seed, lr=c.lr, weight_decay=c.weight_decay,
                               batch_size=c.batch_size, max_epochs=c.max_epochs, patience=c.patience)
        probe = heads.train_probe(x[tr], lab.y[tr], x[va], lab.y[va], tc, train_ids=row_ids[tr],
                                  val_ids=row_ids[va])
        val = metrics.classification_report(lab.y[va], probe.logits(x[va]), temperature=probe.temperature)
        # The ECE ceiling applies before calibration: temperature scaling fixes confidence, not
        # the ranking, and the paper screens the raw probe.
        val_raw = metrics.classification_report(lab.y[va], probe.logits(x[va]), temperature=1.0)
        test = metrics.classification_report(lab.y[te], probe.logits(x[te]), temperature=probe.temperature,
                                             solve_rate=lab.solve_rate[te])
        pooling = s.manifest["pooling"]
        rvp = sample.rvp(reward_fn, probe, pooling, layer)
        cell = {"layer": layer, "pooling": pooling, "head": head, "balance": bal, "seed": seed,
                "fold": fold, "epochs": len(probe.history), "temperature": probe.temperature,
                "val_balanced_accuracy": val["balanced_accuracy"], "val_ece_raw": val_raw["ece"],
                "val_ece": val["ece"], **{f"test_{k}": v for k, v in test.items()}, "rvp": rvp,
                "rvp_source": sample.source}
        cells.append(cell)
        trained[(layer, pooling, head, bal, seed, fold)] = (probe, s)
        tag = f"{head}/layer{layer}/{pooling}/{bal}/seed{seed}" + (f"/fold{fold}" if len(splits) > 1 else "")
        for h in probe.history:
            writer.write(h["epoch"], {"loss": h["loss"], "val_balanced_accuracy": h["val_balanced_accuracy"]},
                         prefix=tag)
        writer.write(len(cells) - 1, {k: v for k, v in cell.items()
                                      if isinstance(v, (int, float)) and k not in ("layer", "seed", "fold")},
                     prefix="sweep")
    writer.close()

    _write_csv(os.path.join(out_dir, "cells.csv"), cells, FIELDS)
    summary = _summarize(cells)
    _write_csv(os.path.join(out_dir, "summary.csv"), summary, list(summary[0]))
    for head in c.heads:
        _heatmap(os.path.join(out_dir, f"heatmap_{head}.png"), [r for r in summary if r["head"] == head], head)
    best, note = select(summary, c.ece_max, c.ba_tolerance)
    key = (best["layer"], best["pooling"], best["head"], best["balance"])
    top = max((cl for cl in cells if (cl["layer"], cl["pooling"], cl["head"], cl["balance"]) == key),
              key=lambda cl: cl["val_balanced_accuracy"])
    seed, fold = top["seed"], top["fold"]
    probe, store = trained[key + (seed, fold)]
    tr, va, te = splits[fold]
    manifest = {"head": probe.head, "layer": best["layer"], "pooling": best["pooling"],
                "turn_pooling": store.manifest["turn_pooling"], "turns": store.manifest["turns"],
                "balance": best["balance"], "seed": seed, "fold": fold, "domain": c.domain,
                "split": split_kind(c), "split_detail": split_description(c),
                "reward_scores": "calibrated" if calibrated else "raw",
                "reference": reward_lib.reference_fingerprint(store.manifest["model"],
                                                              store.manifest["model_config"]),
                "temperature": probe.temperature, "ba_tolerance": c.ba_tolerance,
                "rvp_source": sample.source,
                "dropout": probe.dropout, "d_model": int(probe.mean.shape[0]),
                "model": store.manifest["model"], "store": store.path, "labels": c.labels,
                "band": {"lo": c.lo, "hi": c.hi, "band": c.band, "min_valid": c.min_valid},
                "ece_max": c.ece_max, "ece_measured": "before temperature calibration",
                "selection_note": note, "summary": best,
                "n_train": int(len(tr)), "n_val": int(len(va)), "n_test": int(len(te))}
    save_probe(os.path.join(out_dir, "selected_probe"), probe, manifest)
    report = {"domain": c.domain, "split": split_kind(c), "split_detail": split_description(c),
              "rows": int(len(idx)), "cells": len(cells),
              "n_train": manifest["n_train"], "n_val": manifest["n_val"], "n_test": manifest["n_test"],
              "reward_scores": manifest["reward_scores"], "selected": {
                  k: manifest[k] for k in ("head", "layer", "pooling", "balance", "seed", "fold")},
              "selection_note": note, "reference": manifest["reference"]}
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1, default=float)
    return {"cells": cells, "summary": summary, "selected": manifest, "report": report}


def _summarize(cells):
    keys = sorted({(c["layer"], c["pooling"], c["head"], c["balance"]) for c in cells}, key=str)
    out = []
    for k in keys:
        group = [c for c in cells if (c["layer"], c["pooling"], c["head"], c["balance"]) == k]
        row = dict(zip(("layer", "pooling", "head", "balance"), k))
        for f in ("val_balanced_accuracy", "val_ece_raw", "val_ece", "test_balanced_accuracy",
                  "test_ece", "test_f1", "test_spearman", "rvp"):
            vals = np.asarray([g[f] for g in group], float)
            row[f] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
            row[f + "_std"] = float(np.nanstd(vals)) if np.isfinite(vals).any() else float("nan")
        row["seeds"] = len({g["seed"] for g in group})
        row["folds"] = len({g["fold"] for g in group})
        row["runs"] = len(group)   # the means above are over all seeds x folds
        out.append(row)
    return out


def select(summary, ece_max: float, ba_tolerance: float = 0.0):
    """(best summary row, note): among rows with validation ECE before calibration <= ece_max,
    those within `ba_tolerance` of the best validation balanced accuracy are candidates and the
    highest RVP wins (NaN RVP counts as lowest; equal RVP goes to the higher accuracy)."""
    ok = [r for r in summary if r["val_ece_raw"] <= ece_max]
    note = "met the ECE ceiling (before calibration)"
    if not ok:
        ok = [min(summary, key=lambda r: r["val_ece_raw"])]
        note = f"no cell met ECE <= {ece_max} before calibration; chose the best-calibrated cell"
    top = max(r["val_balanced_accuracy"] for r in ok)
    near = [r for r in ok if r["val_balanced_accuracy"] >= top - ba_tolerance - 1e-12]
    best = max(near, key=lambda r: (r["rvp"] if np.isfinite(r["rvp"]) else -np.inf,
                                    r["val_balanced_accuracy"]))
    if best["val_balanced_accuracy"] < top:
        note += f"; higher RVP within {ba_tolerance} balanced accuracy of the best"
    return best, note


def _write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields))
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in fields})


def color_range(grid) -> tuple[float, float]:
    """The heatmap's colour scale: chance (0.5) to 1 for balanced accuracy, widened to cover
    every cell (below-chance cells were clipped to the floor colour)."""
    vals = np.asarray(grid, dtype=float)
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return 0.5, 1.0
    return float(min(0.5, vals.min())), float(max(1.0, vals.max()))


def _heatmap(path, rows, head):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted({r["layer"] for r in rows})
    pools = sorted({r["pooling"] for r in rows})
    grid = np.full((len(layers), len(pools)), np.nan)
    for r in rows:  # several balance strategies: show the best one per cell
        i, j = layers.index(r["layer"]), pools.index(r["pooling"])
        grid[i, j] = np.nanmax([grid[i, j], r["val_balanced_accuracy"]])
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(pools), 1.2 + 0.45 * len(layers)))
    vmin, vmax = color_range(grid)
    im = ax.imshow(grid, vmin=vmin, vmax=vmax, cmap="viridis", aspect="auto")
    for i in range(len(layers)):
        for j in range(len(pools)):
            bright = im.norm(grid[i, j]) > 0.6  # dark text on viridis' yellow end
            ax.text(j, i, f"{grid[i, j]:.3f}", ha="center", va="center", fontsize=8,
                    color="k" if bright else "w")
    ax.set_xticks(range(len(pools)), pools)
    ax.set_yticks(range(len(layers)), layers)
    ax.set_xlabel("pooling")
    ax.set_ylabel("layer")
    ax.set_title(f"{head}: validation balanced accuracy")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(c, workdir: str = "") -> dict:
    """`rossjax probe-sweep` (configs/probe_sweep.py): returns run_sweep's result plus "output"."""
    out = c.output or (os.path.join(workdir, "probe_sweep") if workdir else "")
    if not out or not c.labels:
        raise ConfigError("configs/probe_sweep.py: fields 'labels' and 'output' must be set.")
    return {**run_sweep(c, out), "output": out}
