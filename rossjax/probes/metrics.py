"""Probe metrics: accuracy, balanced accuracy, F1, ECE, Spearman, temperature calibration, RVP.

Plain NumPy on host: these run once per sweep cell on a few thousand rows, so clarity beats speed.
Binary probes throughout; `probs` is P(y = 1), `logits` is [n, 2].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def accuracy(y: np.ndarray, pred: np.ndarray) -> float:
    y, pred = np.asarray(y), np.asarray(pred)
    return float(np.mean(y == pred)) if len(y) else float("nan")


def balanced_accuracy(y: np.ndarray, pred: np.ndarray) -> float:
    """Mean per-class recall over the classes present in y (sklearn's definition)."""
    y, pred = np.asarray(y), np.asarray(pred)
    recalls = [np.mean(pred[y == c] == c) for c in np.unique(y)]
    return float(np.mean(recalls)) if recalls else float("nan")


def f1(y: np.ndarray, pred: np.ndarray, positive: int = 1) -> float:
    y, pred = np.asarray(y), np.asarray(pred)
    tp = np.sum((pred == positive) & (y == positive))
    fp = np.sum((pred == positive) & (y != positive))
    fn = np.sum((pred != positive) & (y == positive))
    return float(2 * tp / (2 * tp + fp + fn)) if (2 * tp + fp + fn) else 0.0


def ece(y: np.ndarray, probs: np.ndarray, n_bins: int = 15) -> float:
    """Expected calibration error (Guo et al. 2017): top-label confidence in `n_bins` equal-width
    bins on [0, 1], |accuracy - confidence| weighted by bin occupancy. For a binary probe the
    confidence is never below 0.5, so only the upper bins fill; the binning stays the textbook
    one so the figures compare with published ECEs."""
    y, p1 = np.asarray(y), np.asarray(probs, np.float64)
    pred = (p1 >= 0.5).astype(int)
    conf = np.where(pred == 1, p1, 1.0 - p1)
    correct = (pred == y).astype(np.float64)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.clip(np.digitize(conf, edges[1:-1], right=True), 0, n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        m = idx == b
        if m.any():
            total += m.mean() * abs(correct[m].mean() - conf[m].mean())
    return float(total)


def _rank(x: np.ndarray) -> np.ndarray:
    """Ranks with ties sharing their average rank (as Spearman requires)."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), np.float64)
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2:
        return float("nan")
    ra, rb = _rank(a), _rank(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def _nll(logits: np.ndarray, y: np.ndarray, t: float) -> float:
    z = logits / t
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean())


def fit_temperature(logits: np.ndarray, y: np.ndarray, lo: float = 0.05, hi: float = 20.0) -> float:
    """Post-hoc temperature scaling: the T > 0 minimising validation NLL of softmax(logits / T).

    NLL is unimodal in log T for fixed logits, so golden-section search on log T is exact enough.
    """
    logits, y = np.asarray(logits, np.float64), np.asarray(y, np.int64)
    a, b = np.log(lo), np.log(hi)
    g = (np.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(60):
        if _nll(logits, y, np.exp(c)) < _nll(logits, y, np.exp(d)):
            b = d
        else:
            a = c
        c, d = b - g * (b - a), a + g * (b - a)
    return float(np.exp((a + b) / 2))


def softmax_p1(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, np.float64) / temperature
    return 1.0 / (1.0 + np.exp(-(z[:, 1] - z[:, 0])))


def rvp(reward_fn: Callable[[Sequence], np.ndarray], samples: Sequence) -> float:
    """Reward variance under the reference policy: Var over a fixed sample of reference-policy
    outputs of exactly the reward the RL loop will use (gates included). A reward that is flat
    on what the policy currently produces gives GRPO no signal, whatever its accuracy."""
    r = np.asarray(reward_fn(samples), np.float64)
    if r.ndim != 1 or len(r) != len(samples):
        raise ValueError(f"rvp: reward_fn returned shape {r.shape}, expected [{len(samples)}].")
    return float(np.var(r))


def classification_report(y: np.ndarray, logits: np.ndarray, *, temperature: float = 1.0,
                          solve_rate: np.ndarray | None = None, n_bins: int = 15) -> dict:
    p1 = softmax_p1(logits, temperature)
    pred = (p1 >= 0.5).astype(int)
    out = {"accuracy": accuracy(y, pred), "balanced_accuracy": balanced_accuracy(y, pred),
           "f1": f1(y, pred), "ece": ece(y, p1, n_bins)}
    out["spearman"] = spearman(p1, solve_rate) if solve_rate is not None else float("nan")
    return out
