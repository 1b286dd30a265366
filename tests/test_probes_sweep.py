"""Honesty of probes on real activations, and the probe-sweep CLI end to end.

The data: short random 'texts' holding one number token (tokens 100..199 stand for 0..99); the
label is whether that number exceeds 49. The property is visible in the tokens, so a linear probe
on a random-init model's activations must decode it; with shuffled labels it must not.
"""

import json
import os
import re

import jax
import numpy as np
import pytest

from rossjax.models import get_preset, init_params
from rossjax.probes import extract, heads, metrics, write_store
from rossjax.probes.heads import load_probe


@pytest.fixture(scope="module")
def wide_model():
    # Width matters: 100 random number embeddings must be linearly separable in d_model dims.
    # Embeddings are drawn at std 0.5 instead of 0.02: at the default init the random blocks'
    # outputs are ~5x the embeddings and bury token identity, unlike a trained model, where the
    # residual stream keeps it. Nothing here sees the labels.
    cfg = get_preset("tiny_qwen2", d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=512)
    params = init_params(cfg, jax.random.PRNGKey(1))
    params["embed"]["embedding"] = params["embed"]["embedding"] * 25
    return cfg, params


def _texts(n, seed):
    rng = np.random.RandomState(seed)
    nums = rng.randint(0, 100, n)
    rows = []
    for x in nums:
        filler = rng.randint(0, 100, rng.randint(3, 12)).tolist()
        pos = rng.randint(0, len(filler) + 1)
        rows.append(filler[:pos] + [100 + int(x)] + filler[pos:])
    return rows, nums


def test_linear_probe_decodes_visible_property_and_not_shuffled_labels(wide_model):
    cfg, params = wide_model
    rows, nums = _texts(3300, seed=0)
    y = (nums > 49).astype(np.int32)
    x = extract(cfg, params, rows, (2,), "mean")[:, 0]
    ids = np.asarray([f"t{i}" for i in range(len(rows))])
    # 1500 train / 300 val / 1500 test: a large test split so chance level is measured to ~0.013
    tr, va, te = np.arange(1500), np.arange(1500, 1800), np.arange(1800, 3300)
    probe = heads.train_probe(x[tr], y[tr], x[va], y[va], heads.TrainConfig(head="linear"),
                              train_ids=ids[tr], val_ids=ids[va])
    bacc = metrics.balanced_accuracy(y[te], (probe.score(x[te]) >= 0.5).astype(int))
    assert bacc >= 0.9, bacc
    ys = np.random.RandomState(5).permutation(y)
    null = heads.train_probe(x[tr], ys[tr], x[va], ys[va], heads.TrainConfig(head="linear"),
                             train_ids=ids[tr], val_ids=ids[va])
    bacc_null = metrics.balanced_accuracy(ys[te], (null.score(x[te]) >= 0.5).astype(int))
    assert abs(bacc_null - 0.5) <= 0.05, bacc_null


def _trials(nums, rng):
    # In band (1..3 of 8 solved) when the number exceeds 49, else 0 or 5..8 solved; one null trial.
    out = []
    for x in nums:
        k = rng.randint(1, 4) if x > 49 else rng.choice([0, 5, 6, 7])
        t = [True] * k + [False] * (7 - k) + [None]
        out.append(t)
    return out


def test_probe_sweep_cli_end_to_end(wide_model, tmp_path, monkeypatch, capsys):
    from rossjax.cli import main
    from rossjax.probes import sweep

    seen = []  # (train ids, val ids) of every probe the sweep trains

    def recording(xt, yt, xv, yv, tc, *, train_ids, val_ids):
        seen.append((list(train_ids), list(val_ids)))
        return real(xt, yt, xv, yv, tc, train_ids=train_ids, val_ids=val_ids)

    real = heads.train_probe
    monkeypatch.setattr(sweep.heads, "train_probe", recording)

    cfg, params = wide_model
    rows, nums = _texts(1000, seed=1)
    ids = [f"task{i}" for i in range(len(rows))]
    stores = []
    for pooling in ("mean", "max"):
        d = str(tmp_path / f"acts_{pooling}")
        write_store(d, cfg, params, ids, rows, (1, 2), pooling, progress=False)
        stores.append(d)
    rng = np.random.RandomState(0)
    lab = tmp_path / "labels.jsonl"
    lab.write_text("\n".join(json.dumps({"id": i, "trials": t, "group": f"g{j % 9}"})
                             for j, (i, t) in enumerate(zip(ids, _trials(nums, rng)))))
    out = tmp_path / "sweep"
    argv = ["probe-sweep", "--config=configs/probe_sweep.py", f"--config.stores={tuple(stores)!r}",
            f"--config.labels={lab}", f"--config.output={out}", "--config.heads=('linear',)",
            "--config.seeds=(0,1)", "--config.max_epochs=40", "--config.ece_max=0.3",
            "--config.split=random", "--config.balance=('reweight',)", "--config.ba_tolerance=0.0"]
    assert main(argv) == 0
    said = capsys.readouterr().out  # which ECE is which (issue 29 part 8)
    assert re.search(r"val ECE \d\.\d{3} before / \d\.\d{3} after temperature calibration", said)
    lines = (out / "cells.csv").read_text().strip().splitlines()
    assert len(lines) == 1 + 2 * 2 * 2   # header + pooling x layer x seed
    assert (out / "heatmap_linear.png").stat().st_size > 1000
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(out / "tb"))
    logged = [json.loads(l) for l in open(out / "metrics.jsonl")]
    assert len([r for r in logged if r["split"] == "sweep"]) == 8
    assert {r["split"] for r in logged} >= {"linear/layer1/mean/reweight/seed0", "linear/layer2/max/reweight/seed1"}
    # probe training never sees validation (or test) rows
    assert len(seen) == 8
    for tr_ids, va_ids in seen:
        assert not set(tr_ids) & set(va_ids) and len(tr_ids) + len(va_ids) < len(ids)
    probe, man = load_probe(str(out / "selected_probe"))
    assert man["head"] == "linear" and man["layer"] in (1, 2) and man["pooling"] in ("mean", "max")
    summary = [r for r in _csv(out / "summary.csv")]
    ok = [r for r in summary if float(r["val_ece_raw"]) <= 0.3]   # before calibration
    assert float(man["summary"]["val_balanced_accuracy"]) == max(float(r["val_balanced_accuracy"]) for r in ok)
    x = extract(cfg, params, rows, (man["layer"],), man["pooling"])[:, 0]
    s = probe.score(x)
    assert s.shape == (1000,) and ((s >= 0.5) == (nums > 49)).mean() > 0.7  # accuracy proper: the honesty test
    # group k-fold split and a label file whose ids are not in the store
    seen.clear()
    assert main(argv[:5] + ["--config.split=group_kfold", "--config.heads=('linear',)", "--config.layers=(2,)",
                            "--config.seeds=(0,)", "--config.max_epochs=3",
                            f"--config.output={tmp_path / 'sweep_g'}"]) == 0
    # group k-fold (SWE's protocol) over all 5 folds, the domain's (azr) downsampling; the
    # summary is the mean over every fold, not fold 0
    gcells = _csv(tmp_path / "sweep_g" / "cells.csv")
    assert len(gcells) == 2 * 5 and {c["fold"] for c in gcells} == {str(f) for f in range(5)}
    assert {c["balance"] for c in gcells} == {"downsample"}
    for row in _csv(tmp_path / "sweep_g" / "summary.csv"):
        mine = [float(c["val_balanced_accuracy"]) for c in gcells if c["pooling"] == row["pooling"]]
        assert row["runs"] == "5" and float(row["val_balanced_accuracy"]) == pytest.approx(np.mean(mine))
    group = {i: f"g{j % 9}" for j, i in enumerate(ids)}
    for tr_ids, va_ids in seen:  # whole groups: validation groups never appear in training
        assert not {group[i] for i in tr_ids} & {group[i] for i in va_ids}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "nope", "label": 1}) + "\n")
    one_class = tmp_path / "one_class.jsonl"
    one_class.write_text("\n".join(json.dumps({"id": i, "label": 1}) for i in ids))
    capsys.readouterr()
    for extra, says in (([f"--config.labels={bad}"], "not in the activation store"),
                        ([f"--config.labels={tmp_path / 'missing.jsonl'}"], "field 'labels'"),
                        ([f"--config.labels={lab}", "--config.stores=('',)"], "field 'stores' is empty"),
                        ([f"--config.labels={one_class}"], "needs both in-band and out-of-band")):
        assert main(argv[:2] + [argv[2]] + extra + [f"--config.output={tmp_path / 'x'}"]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err


def _csv(path):
    import csv
    with open(path) as f:
        return list(csv.DictReader(f))


def test_rvp_reward_is_the_rl_gate():
    from rossjax.probes import sweep

    class Fixed:  # a probe whose scores are given
        def score(self, x, calibrated=True):
            return np.asarray(x, np.float64)

    s, valid = np.array([0.9, 0.2, 0.6, 0.4]), np.array([1.0, 0.0, 1.0, 0.0])
    np.testing.assert_array_equal(sweep.make_reward("hard_gate", -0.2)(Fixed(), s, valid), [0.9, -0.2, 0.6, -0.2])
    np.testing.assert_array_equal(sweep.make_reward("probe_only")(Fixed(), s, valid), s)
    # the ensemble the RL reward worst-cases with is part of the reward RVP measures
    other = np.array([0.5, 0.9, 0.1, 0.9])
    np.testing.assert_array_equal(sweep.make_reward("hard_gate")(Fixed(), s, valid, [other]),
                                  [0.5, -0.2, 0.1, -0.2])
    np.testing.assert_allclose(sweep.make_reward("soft_gate")(Fixed(), s, valid * 0.5), [0.45, 0, 0.3, 0])
    assert metrics.rvp(lambda v: sweep.make_reward("hard_gate")(Fixed(), s, v), valid) == pytest.approx(
        np.var([0.9, -0.2, 0.6, -0.2]))
    with pytest.raises(ValueError, match="field 'reward'"):
        sweep.make_reward("gate_of_gold")


def _row(ba, ece_raw, ece, rvp):
    return {"val_balanced_accuracy": ba, "val_ece_raw": ece_raw, "val_ece": ece, "rvp": rvp}


def test_selection_ece_before_calibration_then_rvp_within_tolerance():
    from rossjax.probes import sweep

    a = _row(0.800, 0.05, 0.02, 0.010)
    b = _row(0.795, 0.06, 0.03, 0.050)   # slightly less accurate, more reward variance
    c = _row(0.850, 0.20, 0.03, 0.090)   # calibrated ECE fine, raw ECE over the ceiling
    best, note = sweep.select([a, b, c], ece_max=0.1, ba_tolerance=0.01)
    assert best is b and "higher RVP" in note
    assert sweep.select([a, b, c], ece_max=0.1, ba_tolerance=0.0)[0] is a
    assert sweep.select([a, b, c], ece_max=0.3, ba_tolerance=0.01)[0] is c
    d = _row(0.799, 0.05, 0.02, float("nan"))   # no RVP sample: accuracy decides
    assert sweep.select([a, d], ece_max=0.1, ba_tolerance=0.01)[0] is a
    assert "no cell met" in sweep.select([c], ece_max=0.1)[1]


def test_class_balance_defaults_by_domain():
    import ml_collections

    from rossjax.probes import sweep

    c = ml_collections.ConfigDict({"balance": (), "domain": "azr", "split": "group_kfold",
                                   "fold": -1, "folds": 5})
    assert sweep.balances(c) == ("downsample",) and sweep.folds(c) == [0, 1, 2, 3, 4]
    c.domain = "math"
    assert sweep.balances(c) == ("downsample",)
    c.domain = "swe"
    assert sweep.balances(c) == ("reweight",)
    c.balance = ("none",)
    assert sweep.balances(c) == ("none",)
    c.split = "random"
    assert sweep.folds(c) == [0]
    c.balance, c.domain = (), "chess"
    with pytest.raises(ValueError, match="field 'domain'"):
        sweep.balances(c)


def test_rvp_sample_is_its_own_set_with_gate_and_ensemble(wide_model, tmp_path):
    import ml_collections

    from rossjax.probes import reward, rvp, sweep
    from rossjax.probes.heads import save_probe

    cfg, params = wide_model
    rows, nums = _texts(300, seed=7)   # base-model completions: not the sweep's rows
    ids = [f"base{i}" for i in range(300)]
    d = str(tmp_path / "rvp_mean")
    write_store(d, cfg, params, ids, rows, (2,), "mean", progress=False)
    valid = (np.arange(300) % 3 != 0).astype(int)
    vpath = tmp_path / "valid.jsonl"
    vpath.write_text("\n".join(json.dumps({"id": i, "valid": int(v)}) for i, v in zip(ids, valid)))
    x = extract(cfg, params, rows, (2,), "mean")[:, 0]
    y = (nums > 49).astype(np.int32)
    p1 = heads.train_probe(x[:200], y[:200], x[200:], y[200:], heads.TrainConfig(max_epochs=5))
    p2 = heads.train_probe(x[:200], 1 - y[:200], x[200:], 1 - y[200:], heads.TrainConfig(max_epochs=5))
    save_probe(str(tmp_path / "ens"), p2, {"head": "linear", "layer": 2, "pooling": "mean",
                                            "temperature": p2.temperature, "dropout": p2.dropout})
    c = ml_collections.ConfigDict({"rvp_stores": (d,), "rvp_n": 50, "rvp_seed": 3, "reward": "hard_gate",
                                   "rvp_valid": str(vpath), "rvp_ensemble": (str(tmp_path / "ens"),)})
    sample = rvp.RvpSample(c)
    assert len(sample.rows) == 50 and len(set(sample.rows.tolist())) == 50
    got = sample.rvp(sweep.make_reward("hard_gate"), p1, "mean", 2)
    r = sample.rows
    # raw scores, as the AZR/Math RL reward reads them
    want = np.var(reward.hard_gate(np.minimum(p1.score(x[r], calibrated=False),
                                              p2.score(x[r], calibrated=False)), valid[r]))
    assert got == pytest.approx(want, rel=1e-5) and "50 rows" in sample.source
    c.rvp_valid = ""
    with pytest.raises(ValueError, match="rvp_valid"):
        rvp.RvpSample(c)
    assert np.isnan(rvp.RvpSample(ml_collections.ConfigDict({"rvp_stores": ()})).rvp(None, p1, "mean", 2))
