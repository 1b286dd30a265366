"""Feature spaces of the selection baselines the route-diverse paper compares against.

Each baseline selects in its own space with the `diverse` procedure (selection.py: k-means into
clusters, size-proportional quotas, farthest-first inside each cluster) on unit-length rows, so
farthest-first by Euclidean distance is farthest-first by cosine distance (|a - b|^2 = 2 - 2 cos
for unit a, b). What differs is only the space:

- `lexical`: n-gram TF-IDF of the route text (scikit-learn's TfidfVectorizer: word and
  punctuation 1..ngram_max grams, sublinear tf, L2 rows), mapped by a seeded sparse random
  projection (Johnson-Lindenstrauss; scikit-learn's SparseRandomProjection) to `dim` values when
  the vocabulary is larger, then renormalised. The projection preserves the TF-IDF cosine
  geometry in expectation (unlike an SVD, which drops directions), costs one pass over the
  non-zeros, and keeps the hot loop a dense matrix-vector product at millions of rows; at or
  below `dim` terms the space is exact.
- `embedding`: the frozen model's pooled activations of each row (`rossjax extract`), one layer.
- `gradient`: random-projection sketches of each row's LM-head gradient
  (`rossjax extract --config.kind=grad_sketch`).

The two store-backed spaces are looked up by row id (`features_by_id`): every pool row must have
a stored vector. Nothing here imports jax; reading a store is the caller's (rossjax/cli/select.py
passes rossjax.probes.store's checked reader), because the store reader lives in the device half.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rossjax.errors import ConfigError, InputError

BASELINES = ("lexical", "embedding", "gradient")
# config field naming the store of each store-backed baseline
STORE_FIELD = {"embedding": "embedding_store", "gradient": "gradient_store"}


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (float32); an all-zero row stays zero (no direction to keep)."""
    x = np.asarray(x, np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def lexical_features(texts: Sequence[str], *, ngram_max: int = 3, dim: int = 256,
                     max_features: int = 1 << 20, seed: int = 0) -> np.ndarray:
    """[n, <= dim] float32 unit rows: TF-IDF over 1..ngram_max grams, projected to dim."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.random_projection import SparseRandomProjection

    if ngram_max < 1 or dim < 1 or max_features < 1:
        raise ConfigError(f"config.lexical: ngram_max {ngram_max}, dim {dim} and max_features "
                          f"{max_features} must be >= 1.")
    vec = TfidfVectorizer(ngram_range=(1, ngram_max), sublinear_tf=True, max_features=max_features,
                          dtype=np.float32, token_pattern=r"(?u)\b\w+\b|[^\w\s]")
    try:
        tfidf = vec.fit_transform(texts)
    except ValueError as e:  # sklearn: "empty vocabulary"
        raise InputError(f"lexical selection: the route texts hold no words ({e}).") from None
    if tfidf.shape[1] <= dim:
        return unit_rows(tfidf.toarray())
    proj = SparseRandomProjection(n_components=dim, dense_output=True, random_state=seed)
    return unit_rows(proj.fit_transform(tfidf))


def features_by_id(store_ids: Sequence[str], read_rows, pool_ids: Sequence,
                   where: str) -> np.ndarray:
    """The stored row of every pool id, in pool order, as unit rows. `read_rows(sorted store row
    numbers) -> [k, d]` reads only those rows. A pool id the store lacks is an InputError naming
    the first one and how many are missing."""
    index = {str(i): k for k, i in enumerate(store_ids)}
    rows = np.fromiter((index.get(str(i), -1) for i in pool_ids), np.int64, len(pool_ids))
    missing = np.flatnonzero(rows < 0)
    if len(missing):
        raise InputError(f"{where}: no stored row for id {pool_ids[missing[0]]!r} ({len(missing)} of "
                         f"the {len(pool_ids)} pool rows are missing); extract the same rows the "
                         f"selection reads.")
    want, inverse = np.unique(rows, return_inverse=True)
    x = np.asarray(read_rows(want), np.float32)
    if x.ndim != 2 or len(x) != len(want):
        raise InputError(f"{where}: expected {len(want)} stored vectors, read shape {x.shape}.")
    x = x[inverse.reshape(-1)]
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise InputError(f"{where}: the row of id {pool_ids[int(np.flatnonzero(bad)[0])]!r} has a "
                         f"non-finite value.")
    return unit_rows(x)
