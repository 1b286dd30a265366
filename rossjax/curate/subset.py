"""What `rossjax select --config=configs/select_routes.py` runs: fingerprint records, select,
report (`run(cfg, workdir)`; the command line is rossjax/cli/select.py).

Streams rollout records (or a curated output dir) through the fingerprinter (memory holds the
fingerprints and a few fields per row, never the records), selects `budget` rows
with `method`, copies the chosen rows verbatim into the output in the input's own format, and
writes report.json plus a PNG scatter of a 2-D PCA projection of the pool against each compared
method's choice. A curated dir holds token ids only: the route is the decoded assistant turns
(`turn_spans`, with `config.tokenizer`), the problem id is `provenance.task_id`, and the output
is again compiled-NNNNN.array_record shards.

Baselines (routes/baselines.py): `lexical`, `embedding` and `gradient` select with the diverse
procedure in their own space (TF-IDF of the route text, the frozen model's activations, gradient
sketches) under the same budget, group quota and seed; the report measures every method in the
route-fingerprint space, so the columns compare like with like. The store-backed two need
`read_store` (rossjax/cli/select.py passes rossjax.probes.store's checked reader).
"""

from __future__ import annotations

import gzip
import json
import os

import numpy as np

from rossjax.errors import ConfigError, InputError
from rossjax.routes import baselines
from rossjax.routes.fingerprint import fingerprint_many, trace_text
from rossjax.routes.selection import METHODS, cluster_pool, default_clusters, select

_PAIR_SAMPLE = 2000


def _field(record: dict, dotted: str):
    cur = record
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


class PoolMeta:
    """What selection keeps per usable row while the traces stream past: input row number, id,
    the `group_by` value, plus skipped-row counts. The records themselves are never held."""

    def __init__(self, group_by: str = ""):
        self.group_by, self.rows, self.ids, self.groups, self.skipped = group_by, [], [], [], {}

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def add(self, row: int, record: dict) -> None:
        self.rows.append(row)
        self.ids.append(record.get("id"))
        if self.group_by:
            self.groups.append(_field(record, self.group_by))

    def __len__(self) -> int:
        return len(self.rows)


def stream_pool(path: str, meta: PoolMeta, only_passed: bool = True):
    """Yield the route (trace_text) of each usable row of `path`, recording it in `meta`."""
    from rossjax.curate.schema import iter_records

    for r in iter_records(path):
        t, skip = pool_trace(r.record, only_passed)
        if skip:
            meta.skip(skip)
            continue
        meta.add(r.row, r.record)
        yield t


def pool_trace(record: dict | None, only_passed: bool = True):
    """(route, None) for a usable record (None: an invalid row), else (None, skip reason)."""
    if record is None:
        return None, "invalid"
    if only_passed and _field(record, "verifier.passed") is not True:
        return None, "not_passed"
    t = trace_text(record)
    if not (any(s.strip() for s in t) if isinstance(t, list) else t.strip()):
        return None, "empty_trace"
    return t, None


def stream_compiled_pool(path: str, tokenizer: str, meta: PoolMeta):
    """Yield the decoded assistant turns of each row of a curated output dir, recording it in
    `meta` as a pseudo-record (id, task.id / task.domain from the provenance)."""
    from rossjax.curate.compiled import read_compiled
    from rossjax.tokenizers import load_tokenizer

    if not tokenizer:
        raise ConfigError(f"{path} is a curated dir: set --config.tokenizer to decode its token ids.")
    tok = load_tokenizer(tokenizer)
    for k, ex in enumerate(read_compiled(path), start=1):
        ids = np.asarray(ex["input_ids"])
        spans = ex.get("turn_spans") or []
        parts = [tok.decode(ids[s:e].tolist()) for s, e in spans] if spans else \
            [tok.decode(ids[np.asarray(ex["eligible_mask"]) == 1].tolist())]
        text = "\n\n".join(p.strip() for p in parts if p.strip())
        if not text:
            meta.skip("empty_trace")
            continue
        prov = ex.get("provenance") or {}
        meta.add(k, {"id": ex["id"], "task": {"id": prov.get("task_id"), "domain": prov.get("domain")}})
        yield text


def mean_pairwise_distance(x: np.ndarray, seed: int = 0) -> float:
    """Mean Euclidean distance over distinct pairs (on a seeded sample of 2,000 rows if larger)."""
    if len(x) < 2:
        return 0.0
    if len(x) > _PAIR_SAMPLE:
        x = x[np.random.Generator(np.random.PCG64(seed)).choice(len(x), _PAIR_SAMPLE, replace=False)]
    x = x.astype(np.float64)
    sq = (x * x).sum(1)
    d = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2 * x @ x.T, 0))
    n = len(x)
    return float(d.sum() / (n * (n - 1)))


def _write_subset(path: str, rows: np.ndarray, out_dir: str) -> str:
    """Copy the chosen input rows verbatim (JSONL line numbers / Parquet row numbers, 1-based)."""
    want = set(int(r) for r in rows)
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        out = os.path.join(out_dir, "selected.parquet")
        pq.write_table(pq.read_table(path).take(np.sort(rows) - 1), out)
        return out
    gz = path.endswith(".gz")
    out = os.path.join(out_dir, "selected.jsonl" + (".gz" if gz else ""))
    opener = gzip.open if gz else open
    with opener(path, "rt", encoding="utf-8") as f, opener(out, "wt", encoding="utf-8") as g:
        for k, line in enumerate(f, start=1):
            if k in want:
                g.write(line if line.endswith("\n") else line + "\n")
    return out


def _pca2(x: np.ndarray) -> np.ndarray:
    mu = x.mean(0)
    _, _, vt = np.linalg.svd((x - mu).astype(np.float64), full_matrices=False)
    return (x - mu) @ vt[:2].T.astype(np.float32)


def stack_points(xy: np.ndarray, decimals: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """The distinct points of `xy` [n, 2] (equal to `decimals` places) and how many rows each."""
    if len(xy) == 0:
        return np.zeros((0, 2), np.float32), np.zeros(0, int)
    pts, counts = np.unique(np.round(xy, decimals), axis=0, return_counts=True)
    return pts, counts


def plot_selection(fps: np.ndarray, chosen: dict, path: str, seed: int = 0) -> None:
    """One panel per method: the pool (grey) and the chosen rows (colour) on the pool's PCA plane."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xy = _pca2(fps) if len(fps) > 2 else np.zeros((len(fps), 2), np.float32)
    show = np.arange(len(fps))
    if len(show) > 20000:  # keep the PNG readable and small
        show = np.random.Generator(np.random.PCG64(seed)).choice(len(fps), 20000, replace=False)
    fig, axes = plt.subplots(1, len(chosen), figsize=(4 * len(chosen), 4), squeeze=False)
    for ax, (name, idx) in zip(axes[0], chosen.items()):
        # Rows with one route share a point: one marker per point, its area the row count.
        pts, n = stack_points(xy[show])
        ax.scatter(pts[:, 0], pts[:, 1], s=4 * n, c="0.8",
                   label=f"pool ({len(fps)})")
        pts, n = stack_points(xy[np.asarray(idx, int)])
        ax.scatter(pts[:, 0], pts[:, 1], s=8 * n, c="tab:red", alpha=0.7,
                   label=f"{name} ({len(idx)}; area = rows at a point)")
        ax.set_title(name)
        ax.legend(loc="best", fontsize=7)
    fig.suptitle("route fingerprints, PCA of the pool")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _route_texts(cfg, meta: PoolMeta) -> list[str]:
    """The route text of every pool row (a second pass over the input, same rows as `meta`)."""
    again = PoolMeta(cfg.group_by)
    texts = (stream_compiled_pool(cfg.input, cfg.tokenizer, again) if os.path.isdir(cfg.input)
             else stream_pool(cfg.input, again, cfg.only_passed))
    out = ["\n\n".join(t) if isinstance(t, list) else t for t in texts]
    if again.rows != meta.rows:
        raise InputError(f"{cfg.input}: the input changed between two passes of select.")
    return out


def baseline_features(cfg, method: str, meta: PoolMeta, read_store=None) -> np.ndarray:
    """Unit rows of the pool in `method`'s space (routes/baselines.py), in pool order."""
    if method == "lexical":
        lx = cfg.get("lexical") or {}
        return baselines.lexical_features(
            _route_texts(cfg, meta), ngram_max=int(lx.get("ngram_max", 3)),
            dim=int(lx.get("dim", 256)), max_features=int(lx.get("max_features", 1 << 20)),
            seed=cfg.seed)
    field = baselines.STORE_FIELD[method]
    path = cfg.get(field, "")
    if not path:
        raise ConfigError(f"config.method {method!r} needs --config.{field}=DIR (a store written by "
                          f"`rossjax extract` over the same rows).")
    if read_store is None:
        raise ConfigError(f"config.method {method!r} reads an activation store: run it through "
                          f"`rossjax select` (or pass read_store).")
    layer = cfg.get("embedding_layer") if method == "embedding" else None
    ids, read_rows = read_store(path, layer)
    return baselines.features_by_id(ids, read_rows, meta.ids, f"config.{field} {path}")


def run(cfg, workdir: str | None = None, fingerprinter=None, read_store=None) -> dict:
    """Select `cfg.budget` rows of `cfg.input` into `workdir` (default `cfg.output`); returns the
    report (also written to report.json there). `fingerprinter(cfg, workdir) -> (fingerprints,
    routes, PoolMeta)` replaces the local fingerprinting pass (the Beam runner's);
    `read_store(path, layer) -> (ids, read_rows)` reads an embedding or gradient store."""
    out_dir = workdir or cfg.output
    if not cfg.input or not out_dir:
        raise ConfigError("select needs --config.input (records) and --config.output (a directory).")
    compare = [m for m in str(cfg.compare).split(",") if m]
    for m in [cfg.method] + compare:
        if m not in METHODS + baselines.BASELINES:
            raise ConfigError(f"config.method/compare: unknown selection method {m!r}; choose from "
                              f"{METHODS + baselines.BASELINES}.")
    curated = os.path.isdir(cfg.input)
    if not curated:
        from rossjax.curate.schema import expand_inputs

        if len(files := expand_inputs(cfg.input)) > 1:
            raise ConfigError(f"config.input {cfg.input} names {len(files)} files; select copies rows "
                             f"out_dir of one rollout file, so concatenate them first.")
    # One streaming pass: traces go straight to the fingerprinter; only light per-row metadata
    # stays. A second pass over the input copies the chosen rows.
    if fingerprinter is not None:
        fps, routes, meta = fingerprinter(cfg, out_dir)
    else:
        meta = PoolMeta(cfg.group_by)
        texts = (stream_compiled_pool(cfg.input, cfg.tokenizer, meta) if curated
                 else stream_pool(cfg.input, meta, cfg.only_passed))
        fps, routes = fingerprint_many(texts, cfg.domain, cfg.dim, cfg.seed, workers=cfg.workers,
                                       progress=cfg.progress)
    rows, skipped = np.asarray(meta.rows, np.int64), meta.skipped
    if not len(meta):
        raise InputError(f"{cfg.input}: no usable records to select from ({skipped or 'file is empty'}).")
    if cfg.budget > len(meta):
        raise ConfigError(f"config.budget {cfg.budget} is larger than the {len(meta)} usable records "
                         f"in {cfg.input}.")
    groups = None
    if cfg.group_by:
        groups = np.array([str(v) if v is not None else f"<row {k}>" for k, v in zip(rows, meta.groups)])
    quota_groups = groups if cfg.per_group is not None else None
    per_group = cfg.per_group if cfg.per_group is not None else 1
    k = default_clusters(len(fps), cfg.budget) if cfg.clusters is None else cfg.clusters
    clustering = cluster_pool(fps, k, cfg.seed)

    def stats(idx):
        out = {"rows": int(len(idx)),
               "mean_pairwise_distance": mean_pairwise_distance(fps[idx], cfg.seed),
               "distinct_label_sequences": int(len(np.unique(routes[idx]))),
               "clusters_covered": int(len(np.unique(clustering.labels[idx])))}
        if groups is not None:
            counts = np.unique(groups[idx], return_counts=True)[1]
            out["rows_per_problem"] = {"problems": int(len(counts)),
                                       "max": int(counts.max()) if len(counts) else 0,
                                       "mean": float(counts.mean()) if len(counts) else 0.0}
        return out

    chosen = {}
    for m in dict.fromkeys([cfg.method] + compare):
        if m in baselines.BASELINES:   # the diverse procedure in the baseline's own space
            feats = baseline_features(cfg, m, meta, read_store)
            chosen[m] = select(feats, cfg.budget, "diverse", seed=cfg.seed, groups=quota_groups,
                               per_group=per_group, clustering=cluster_pool(feats, k, cfg.seed))
            continue
        chosen[m] = select(fps, cfg.budget, m, seed=cfg.seed, groups=quota_groups,
                           per_group=per_group, routes=routes, clustering=clustering)
    os.makedirs(out_dir, exist_ok=True)
    if curated:
        from rossjax.curate.mixture import write_shards

        sel = {"pool": rows[chosen[cfg.method]] - 1}   # 0-based read order
        written = write_shards(out_dir, {"pool": cfg.input}, sel, 4096, tag=None)
        written = os.path.join(out_dir, written[0]) if len(written) == 1 else out_dir
    else:
        written = _write_subset(cfg.input, rows[chosen[cfg.method]], out_dir)
    # Every input row is accounted for: skipped (with a reason), selected, or left in the pool.
    n_sel = int(len(chosen[cfg.method]))
    rows_in = {"input_rows": int(len(meta) + sum(skipped.values())), "skipped": skipped,
               "selected": n_sel, "not_selected": int(len(meta) - n_sel)}
    report = {"input": cfg.input, "output": written, "method": cfg.method, "budget": cfg.budget,
              "rows": rows_in,
              "domain": cfg.domain, "seed": cfg.seed, "clusters": int(len(clustering.centers)),
              "pool": {**stats(np.arange(len(fps))), "skipped": skipped},
              "methods": {m: stats(idx) for m, idx in chosen.items()},
              "selected_ids": [meta.ids[i] for i in chosen[cfg.method]]}
    if cfg.plot:
        plot_selection(fps, chosen, os.path.join(out_dir, "selection.png"), cfg.seed)
        report["plot"] = os.path.join(out_dir, "selection.png")
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    return report
