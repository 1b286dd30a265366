"""Selection over route fingerprints: diverse, similar, random, topology.

`diverse` (the route-diverse SFT recipe): mini-batch k-means into clusters; each cluster gets a
size-proportional share of the budget by largest remainder; inside a cluster, start from the row
nearest its centroid and repeatedly add the row farthest from those already chosen (k-center
greedy, one matrix-vector product per pick over a running min-distance array).
`similar`: the rows nearest the centroid of the largest cluster, spilling into the next-nearest
clusters only when the budget exceeds it. `random`: a seeded permutation. `topology`: one row per
distinct label sequence (route signature) before anything else, in seeded random order.

`groups` (problem ids) cap rows per problem at `per_group`; rows of a full group are skipped.
Everything is float32 numpy, chunked so 2M x 64 pools fit in a few hundred MB.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from rossjax.errors import InputError

METHODS = ("diverse", "similar", "random", "topology")
_CHUNK = 65536


class Clustering(NamedTuple):
    centers: np.ndarray   # float32 [k, d]
    labels: np.ndarray    # int64 [n]
    dist: np.ndarray      # float32 [n] squared distance of each row to its center


def default_clusters(n: int, budget: int) -> int:
    """3 * sqrt(budget) clusters, at least 1, at most the pool and the budget.

    k trades the final k-means assignment (cost ~ n * k, BLAS) against k-center greedy (cost ~
    budget * n / k, memory-bound). Measured on 1M rows / 50k budget: k = 224 took 51 s,
    k = 500 took 28 s; 3 * sqrt(budget) sits near that optimum."""
    return max(1, min(n, budget, int(round(3 * math.sqrt(max(budget, 1))))))


def _check_pool(fingerprints) -> np.ndarray:
    x = np.asarray(fingerprints, dtype=np.float32)
    if x.ndim != 2:
        raise InputError(f"fingerprints must be a 2-D array [rows, dim], got shape {x.shape}.")
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise InputError(f"fingerprints row {int(np.flatnonzero(bad)[0])} has a non-finite value.")
    return np.ascontiguousarray(x)


def _assign(x: np.ndarray, centers: np.ndarray):
    """Nearest center and squared distance for every row, in bounded-memory chunks."""
    cn = (centers * centers).sum(1)
    labels = np.empty(len(x), np.int64)
    dist = np.empty(len(x), np.float32)
    step = max(1024, (1 << 23) // max(len(centers), 1))  # [step, k] float32 blocks of ~32 MB
    for s in range(0, len(x), step):
        xb = x[s:s + step]
        d = xb @ centers.T
        d *= -2.0
        d += cn[None, :]
        j = d.argmin(1)
        labels[s:s + step] = j
        dist[s:s + step] = np.maximum(d[np.arange(len(xb)), j] + (xb * xb).sum(1), 0)
    return labels, dist


def _cluster_sums(x: np.ndarray, labels: np.ndarray, k: int):
    """(per-cluster row sums [k, d], counts [k]); sort + reduceat, far faster than np.add.at."""
    order = np.argsort(labels, kind="stable")
    cnt = np.bincount(labels, minlength=k)
    sums = np.zeros((k, x.shape[1]), np.float32)
    nz = np.flatnonzero(cnt)
    if len(nz):
        starts = np.concatenate([[0], np.cumsum(cnt)[:-1]])[nz]
        sums[nz] = np.add.reduceat(x[order], starts, axis=0)
    return sums, cnt


def _kmeans_pp(x: np.ndarray, k: int, rng) -> np.ndarray:
    centers = np.empty((k, x.shape[1]), np.float32)
    centers[0] = x[rng.integers(len(x))]
    d = ((x - centers[0]) ** 2).sum(1)
    for i in range(1, k):
        tot = float(d.sum())
        j = rng.integers(len(x)) if tot <= 0 else int(np.searchsorted(np.cumsum(d), rng.random() * tot))
        centers[i] = x[min(j, len(x) - 1)]
        np.minimum(d, ((x - centers[i]) ** 2).sum(1), out=d)
    return centers


def cluster_pool(fingerprints, clusters: int, seed: int = 0, *, batch_size: int = 8192,
                 iters: int = 200) -> Clustering:
    """k-means: Lloyd when the pool fits one batch, else mini-batch (Sculley 2010) with
    per-center learning rates; k-means++ init on a sample; a final full assignment."""
    x = _check_pool(fingerprints)
    n = len(x)
    if int(clusters) < 1:
        raise InputError(f"clusters must be >= 1, got {clusters}.")
    if n == 0:
        raise InputError("cannot cluster an empty pool.")
    k = min(int(clusters), n)  # documented: more clusters than rows is clamped to the pool size
    rng = np.random.Generator(np.random.PCG64(seed))
    sample = x if n <= 20_000 else x[np.sort(rng.choice(n, 20_000, replace=False))]
    centers = _kmeans_pp(sample, k, rng)
    if n <= batch_size:
        labels = None
        for _ in range(50):
            new, _d = _assign(x, centers)
            if labels is not None and np.array_equal(new, labels):
                break
            labels = new
            sums, cnt = _cluster_sums(x, labels, k)
            nz = cnt > 0
            centers[nz] = sums[nz] / cnt[nz, None]
    else:
        counts = np.zeros(k, np.float64)
        for _ in range(iters):
            xb = x[rng.integers(0, n, batch_size)]
            lb, _d = _assign(xb, centers)
            sums, m = _cluster_sums(xb, lb, k)
            m = m.astype(np.float64)
            nz = m > 0
            counts[nz] += m[nz]
            lr = (m[nz] / counts[nz]).astype(np.float32)[:, None]
            centers[nz] += lr * (sums[nz] / m[nz, None].astype(np.float32) - centers[nz])
    labels, dist = _assign(x, centers)
    return Clustering(centers, labels, dist)


def _largest_remainder(sizes: np.ndarray, budget: int) -> np.ndarray:
    """Integer shares proportional to sizes summing to budget (ties: lower index first)."""
    exact = budget * sizes / max(int(sizes.sum()), 1)
    share = np.floor(exact).astype(np.int64)
    rem = budget - int(share.sum())
    if rem > 0:
        order = np.lexsort((np.arange(len(sizes)), -(exact - share)))
        share[order[:rem]] += 1
    return np.minimum(share, sizes)


def _take_in_order(order: np.ndarray, budget: int, groups, per_group: int) -> np.ndarray:
    """First `budget` rows of `order`, skipping rows whose group already has per_group rows."""
    if groups is not None:
        g = groups[order]
        srt = np.argsort(g, kind="stable")
        gs = g[srt]
        starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
        rank = np.empty(len(order), np.int64)
        rank[srt] = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        order = order[rank < per_group]
    return order[:budget]


def _kcenter(x, q, chosen, mind):
    """Greedy farthest-first: yield up to q new local indices, each the row farthest from
    everything chosen so far. `mind` (float32, caller-owned) holds each row's squared distance
    to the chosen set, with -inf for rows that may not be picked (chosen, or group full); the
    caller may set more rows to -inf between picks. One in-place matrix-vector product per pick,
    no temporaries: this loop is the selection's hot path (100k picks at 2M rows)."""
    sq = np.einsum("ij,ij->i", x, x)
    tmp = np.empty(len(x), np.float32)

    def update(c):
        np.dot(x, x[c], out=tmp)
        np.multiply(tmp, -2.0, out=tmp)
        np.add(tmp, sq, out=tmp)
        np.add(tmp, sq[c], out=tmp)
        np.minimum(mind, tmp, out=mind)

    for c in chosen:
        update(c)
    for _ in range(q):
        j = int(mind.argmax())
        if mind[j] == -np.inf:
            break
        mind[j] = -np.inf
        yield j
        update(j)


def _diverse(x, budget, cl: Clustering, groups, per_group):
    k = len(cl.centers)
    sizes = np.bincount(cl.labels, minlength=k)
    quota = _largest_remainder(sizes, budget)
    members = np.split(np.argsort(cl.labels, kind="stable"), np.cumsum(sizes)[:-1])
    gcount = None if groups is None else np.zeros(int(groups.max()) + 1, np.int64)
    chosen_local = [[] for _ in range(k)]
    out = []
    pending = quota.copy()
    while True:
        for c in np.flatnonzero(pending > 0):
            idx = members[c]
            xc = x[idx]
            mind = np.full(len(idx), np.inf, np.float32)
            mind[chosen_local[c]] = -np.inf
            gc = None
            if gcount is not None:
                gc = groups[idx]
                mind[gcount[gc] >= per_group] = -np.inf

            def picked(j):
                chosen_local[c].append(j)
                out.append(idx[j])
                pending[c] -= 1
                if gc is not None:
                    gcount[gc[j]] += 1
                    if gcount[gc[j]] >= per_group:
                        mind[gc == gc[j]] = -np.inf

            if not chosen_local[c]:   # start from the row nearest the centroid
                cand = np.where(mind > -np.inf, cl.dist[idx], np.inf)
                j0 = int(cand.argmin())
                if not np.isfinite(cand[j0]):
                    continue
                mind[j0] = -np.inf
                picked(j0)
            for j in _kcenter(xc, int(pending[c]), chosen_local[c][:], mind):
                picked(j)
        short = int(pending.clip(0).sum())
        if short == 0:
            break
        # Group caps left some clusters short: hand the shortfall to clusters that still have
        # eligible rows, again in proportion to their size (the caller checked capacity).
        pending[:] = 0
        left = np.array([len(members[c]) - len(chosen_local[c]) for c in range(k)])
        if gcount is not None:
            free = gcount[groups] < per_group
            free[np.asarray(out, np.int64)] = False
            left = np.bincount(cl.labels[free], minlength=k)
        if left.sum() == 0:
            break
        pending = _largest_remainder(np.where(left > 0, sizes, 0), min(short, int(left.sum())))
        pending = np.minimum(pending, left)
        if pending.sum() == 0:
            pending[int(np.argmax(left))] = 1
    return np.asarray(out, np.int64)


def _similar(x, budget, cl: Clustering, groups, per_group):
    sizes = np.bincount(cl.labels, minlength=len(cl.centers))
    anchor = cl.centers[int(sizes.argmax())]
    cdist = ((cl.centers - anchor) ** 2).sum(1)
    rank_of_cluster = np.empty(len(cdist), np.int64)
    rank_of_cluster[np.lexsort((np.arange(len(cdist)), cdist))] = np.arange(len(cdist))
    drow = np.concatenate([((x[s:s + _CHUNK] - anchor) ** 2).sum(1) for s in range(0, len(x), _CHUNK)])
    order = np.lexsort((np.arange(len(x)), drow, rank_of_cluster[cl.labels]))
    return _take_in_order(order, budget, groups, per_group)


def select(fingerprints, budget: int, method: str = "diverse", clusters: int | None = None,
           seed: int = 0, groups=None, *, per_group: int = 1, routes=None,
           clustering: Clustering | None = None) -> np.ndarray:
    """Indices (ascending int64) of `budget` rows of the pool chosen by `method`.

    - clusters: k for diverse/similar (default `default_clusters`); more than the pool is clamped.
    - groups: one problem id per row (any hashable); at most `per_group` rows per problem.
    - routes: route signatures from `fingerprint(..., return_routes=True)`; needed by topology.
    - clustering: a `cluster_pool` result to reuse across methods.
    budget 0 gives an empty array; a budget larger than the pool (or than the group caps
    allow), zero clusters or non-finite fingerprints raise ValueError.
    """
    x = _check_pool(fingerprints)
    n = len(x)
    if method not in METHODS:
        raise InputError(f"unknown selection method {method!r}; choose one of {METHODS}.")
    if isinstance(budget, bool) or int(budget) != budget or budget < 0:
        raise InputError(f"budget must be a non-negative integer, got {budget!r}.")
    budget = int(budget)
    if budget > n:
        raise InputError(f"budget {budget} is larger than the pool of {n} rows.")
    if clusters is not None and int(clusters) < 1:
        raise InputError(f"clusters must be >= 1, got {clusters}.")
    if groups is not None:
        groups = np.asarray(groups)
        if len(groups) != n:
            raise InputError(f"groups has {len(groups)} entries for a pool of {n} rows.")
        if int(per_group) < 1:
            raise InputError(f"per_group must be >= 1, got {per_group}.")
        groups = np.unique(groups, return_inverse=True)[1].reshape(-1).astype(np.int64)
        cap = int(np.minimum(np.bincount(groups), per_group).sum())
        if budget > cap:
            raise InputError(f"budget {budget} exceeds the {cap} rows allowed by per_group="
                             f"{per_group} over {int(groups.max()) + 1} groups.")
    if budget == 0:
        return np.zeros(0, np.int64)
    rng = np.random.Generator(np.random.PCG64(seed))
    if method == "random":
        out = _take_in_order(rng.permutation(n), budget, groups, per_group)
    elif method == "topology":
        if routes is None or len(routes) != n:
            raise InputError("method 'topology' needs routes: one route signature per row, from "
                             "fingerprint(..., return_routes=True).")
        perm = rng.permutation(n)
        _, first = np.unique(np.asarray(routes)[perm], return_index=True)
        head = np.zeros(n, bool)
        head[np.sort(first)] = True
        out = _take_in_order(np.concatenate([perm[head], perm[~head]]), budget, groups, per_group)
    else:
        if clustering is None:
            k = default_clusters(n, budget) if clusters is None else int(clusters)
            clustering = cluster_pool(x, k, seed)
        elif len(clustering.labels) != n:
            raise InputError("clustering was computed for a different pool size.")
        fn = _diverse if method == "diverse" else _similar
        out = fn(x, budget, clustering, groups, per_group)
    return np.sort(np.asarray(out, np.int64))
