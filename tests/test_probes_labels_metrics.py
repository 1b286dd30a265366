"""Utility labels and probe metrics against slow obvious references."""

import json

import numpy as np
import pytest

from rossjax.probes import labels, metrics


def test_utility_band_k8_edges_and_nulls():
    t, f = True, False
    rows = [
        [t] + [f] * 7,                 # 1/8 -> in band (lo inclusive)
        [t] * 3 + [f] * 5,             # 3/8 -> in band (hi inclusive)
        [t] * 4 + [f] * 4,             # 4/8 -> out
        [f] * 8,                       # 0 -> out
        [t, None, None, None, None, None, None, None],  # 1 valid < min_valid 2 -> dropped
        [t, f, None, None, f, f, None, None],           # 1/4 (nulls not counted) -> in band
    ]
    lab = labels.utility_labels(rows)
    assert lab.kept.tolist() == [0, 1, 2, 3, 5]
    assert lab.y.tolist() == [1, 1, 0, 0, 1]
    np.testing.assert_allclose(lab.solve_rate, [1 / 8, 3 / 8, 0.5, 0.0, 0.25])
    assert lab.n_valid.tolist() == [8, 8, 8, 8, 4]


def test_utility_open_band_k3_and_min_valid():
    rows = [[1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0], [1, None, None]]
    lab = labels.utility_labels(rows, band="open")
    assert lab.y.tolist() == [1, 0, 0, 1]
    lab1 = labels.utility_labels(rows, band="open", min_valid=1)
    assert lab1.kept.tolist() == [0, 1, 2, 3, 4] and lab1.y[-1] == 0
    with pytest.raises(ValueError, match="row 1"):
        labels.utility_labels([["yes"]])


def test_label_file_ids_must_match_store(tmp_path):
    p = tmp_path / "labels.jsonl"
    p.write_text("\n".join(json.dumps({"id": f"t{i}", "trials": [1] * (1 + 3 * (i % 2)) + [0] * (7 - 3 * (i % 2))})
                           for i in range(4)))
    rows = labels.read_label_file(str(p))
    idx, lab, groups = labels.align_labels(rows, ["t3", "t2", "t1", "t0"], path=str(p))
    assert idx.tolist() == [3, 2, 1, 0] and lab.y.tolist() == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="not in the activation store"):
        labels.align_labels(rows, ["t0", "t1", "x"], path=str(p))
    p.write_text('{"id": "a", "label": 1}\n{"id": "a", "label": 0}\n')
    with pytest.raises(ValueError, match="row 2: field 'id'"):
        labels.read_label_file(str(p))


def _ece_ref(y, p, bins=15):
    pred = (p >= 0.5).astype(int)
    conf = np.maximum(p, 1 - p)
    tot = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins  # textbook bins on [0, 1]
        m = [(lo < c <= hi) or (b == 0 and c == 0.0) for c in conf]
        m = np.array(m)
        if m.any():
            tot += m.mean() * abs((pred[m] == y[m]).mean() - conf[m].mean())
    return tot


def test_metrics_against_references():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    p = np.clip(rng.random(200) * 0.6 + 0.4 * y, 0, 1)
    pred = (p >= 0.5).astype(int)
    acc = sum(int(a == b) for a, b in zip(y, pred)) / len(y)
    rec = [sum(1 for a, b in zip(y, pred) if a == c and b == c) / sum(1 for a in y if a == c) for c in (0, 1)]
    tp = sum(1 for a, b in zip(y, pred) if a == 1 and b == 1)
    prec = tp / sum(pred)
    assert metrics.accuracy(y, pred) == pytest.approx(acc)
    assert metrics.balanced_accuracy(y, pred) == pytest.approx(sum(rec) / 2)
    assert metrics.f1(y, pred) == pytest.approx(2 * prec * rec[1] / (prec + rec[1]))
    assert metrics.ece(y, p) == pytest.approx(_ece_ref(y, p), abs=1e-12)
    # Textbook binning: confidences 0.55 and 0.58 share the bin (8/15, 9/15], so ECE is
    # |0.5 - 0.565|; finer bins on [0.5, 1] would split them and give 0.515.
    assert metrics.ece(np.array([1, 0]), np.array([0.55, 0.58])) == pytest.approx(0.065)
    # Spearman with ties: against Pearson of average ranks computed the slow way.
    a = np.array([1, 2, 2, 3, 5, 5, 5, 0.5])
    b = np.array([2, 1, 4, 4, 6, 7, 3, 0])
    def avg_rank(v):
        return np.array([sum(w < x for w in v) + (sum(w == x for w in v) - 1) / 2 for x in v])
    ra, rb = avg_rank(a), avg_rank(b)
    assert metrics.spearman(a, b) == pytest.approx(np.corrcoef(ra, rb)[0, 1])


def test_temperature_scaling_recovers_overconfidence():
    rng = np.random.default_rng(1)
    z = rng.normal(size=4000) * 2
    y = (rng.random(4000) < 1 / (1 + np.exp(-z))).astype(int)
    logits = np.stack([np.zeros_like(z), 3.0 * z], 1)  # 3x overconfident
    t = metrics.fit_temperature(logits, y)
    assert 2.6 < t < 3.4
    assert metrics.ece(y, metrics.softmax_p1(logits, t)) < metrics.ece(y, metrics.softmax_p1(logits))


def test_rvp_is_variance_of_given_reward():
    xs = list(range(10))
    assert metrics.rvp(lambda s: np.array([x % 2 for x in s], float), xs) == pytest.approx(0.25)
    assert metrics.rvp(lambda s: np.full(len(s), 0.3), xs) == pytest.approx(0.0, abs=1e-20)
    with pytest.raises(ValueError):
        metrics.rvp(lambda s: np.zeros(3), xs)
