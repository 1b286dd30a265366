"""Probe heads: they learn a separable signal, early-stop, balance classes, and never see val rows."""

import numpy as np
import pytest

from rossjax.probes import heads, metrics


def _data(n=2000, d=32, seed=0, pos_frac=0.5):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < pos_frac).astype(np.int32)
    x = rng.normal(size=(n, d)).astype(np.float32) * 3 + 10  # offset/scale: standardisation matters
    x[:, 0] += 8.0 * (2 * y - 1)
    return x, y


@pytest.mark.parametrize("head", ["linear", "mlp", "deep_mlp"])
def test_heads_learn_separable_signal(head):
    x, y = _data()
    tr, va, te = heads.random_split(len(y), seed=0)
    cfg = heads.TrainConfig(head=head, max_epochs=20, patience=5)
    probe = heads.train_probe(x[tr], y[tr], x[va], y[va], cfg, train_ids=tr, val_ids=va)
    pred = (probe.score(x[te]) >= 0.5).astype(int)
    assert metrics.balanced_accuracy(y[te], pred) >= 0.9
    # the kept parameters are the best validation epoch's, and early stopping follows patience
    hist = probe.history
    assert [h["epoch"] for h in hist] == list(range(len(hist)))
    best = max(range(len(hist)), key=lambda i: (hist[i]["val_balanced_accuracy"], -i))
    val_pred = (probe.score(x[va]) >= 0.5).astype(int)
    assert metrics.balanced_accuracy(y[va], val_pred) == pytest.approx(
        hist[best]["val_balanced_accuracy"], abs=1e-12)
    assert len(hist) == 20 or len(hist) - 1 - best == 5


def test_training_refuses_overlapping_ids():
    x, y = _data(100)
    with pytest.raises(AssertionError, match="validation rows"):
        heads.train_probe(x[:80], y[:80], x[70:], y[70:], train_ids=[f"r{i}" for i in range(80)],
                          val_ids=[f"r{i}" for i in range(70, 100)])


def test_early_stopping_and_balance_strategies():
    x, y = _data(2000, d=4, pos_frac=0.15, seed=3)
    tr, va, te = heads.random_split(len(y), seed=1)
    res = {}
    for bal in ("none", "downsample", "reweight"):
        p = heads.train_probe(x[tr], y[tr], x[va], y[va], heads.TrainConfig(balance=bal, max_epochs=40))
        res[bal] = metrics.balanced_accuracy(y[te], (p.score(x[te]) >= 0.5).astype(int))
        # Early stopping: training ends at most `patience` epochs after the best one.
        best = max(h["val_balanced_accuracy"] for h in p.history)
        assert len(p.history) - 1 - max(i for i, h in enumerate(p.history)
                                        if h["val_balanced_accuracy"] == best) <= 7 or len(p.history) == 40
    assert min(res.values()) >= 0.85, res
    rows, w = heads._balance(y[tr], "downsample", np.random.default_rng(0))
    assert np.bincount(y[tr][rows]).tolist() == [np.bincount(y[tr]).min()] * 2
    rows, w = heads._balance(y[tr], "reweight", np.random.default_rng(0))
    assert np.allclose([w[y[tr] == c].sum() for c in (0, 1)], len(tr) / 2)
    with pytest.raises(ValueError, match="balance"):
        heads.train_probe(x[tr], y[tr], x[va], y[va], heads.TrainConfig(balance="smote"))


def test_group_kfold_keeps_groups_apart():
    groups = [f"repo{i % 7}" for i in range(70)]
    for fold in range(5):
        tr, va, te = heads.group_kfold(groups, k=5, fold=fold)
        g = lambda idx: {groups[i] for i in idx}
        assert not (g(tr) & g(va)) and not (g(tr) & g(te)) and not (g(va) & g(te))
        assert len(tr) + len(va) + len(te) == 70
    tr, va, te = heads.random_split(100, seed=0)
    assert (len(tr), len(va), len(te)) == (80, 10, 10)
    assert not set(tr) & set(va) and not set(tr) & set(te)
