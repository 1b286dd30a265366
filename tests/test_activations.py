"""Activation extraction: pooled vectors equal a per-row reference, the store reads back exactly,
a killed run resumes without redoing finished rows, and bad input is refused clearly."""

import json
import os

import jax
import numpy as np
import pytest

from rossjax.models import forward, get_preset, init_params
from rossjax.probes import activations as A, store as S


@pytest.fixture(scope="module")
def model():
    cfg = get_preset("tiny_qwen2")
    return cfg, init_params(cfg, jax.random.PRNGKey(0))


def _rows(n=13, seed=0):
    rng = np.random.RandomState(seed)
    lens = rng.randint(1, 40, n)
    return [rng.randint(0, 256, k).tolist() for k in lens]


def _ref(cfg, params, toks, layers, pooling, spans=None, turn_pooling="mean"):
    # One row at a time, right-padded to a fixed width (one compile); padding has segment id 0
    # and cannot touch the real tokens, which are the only ones read below.
    width = 64
    tok = np.zeros((1, width), np.int32)
    seg = np.zeros((1, width), np.int32)
    tok[0, :len(toks)], seg[0, :len(toks)] = toks, 1
    _, hid = forward(cfg, params, tok, segment_ids=seg, hidden_layers=(0, 1, 2))
    out = []
    for l in layers:
        h = np.asarray(hid[l][0, :len(toks)], np.float64)
        per_turn = []
        for s, e in (spans or [(0, len(toks))]):
            seg = h[s:e]
            per_turn.append({"mean": seg.mean(0), "max": seg.max(0), "last": seg[-1]}[pooling])
        t = np.stack(per_turn)
        out.append({"mean": t.mean(0), "max": t.max(0), "last": t[-1]}[turn_pooling])
    return np.stack(out)


@pytest.mark.parametrize("pooling", ["mean", "last", "max"])
def test_extract_matches_per_row_reference(model, pooling):
    cfg, params = model
    rows = _rows()
    layers = (0, 1, 2)
    got = A.extract(cfg, params, rows, layers, pooling, batch_tokens=64)
    assert got.shape == (len(rows), 3, cfg.d_model) and got.dtype == np.float32
    for i, toks in enumerate(rows):
        np.testing.assert_allclose(got[i], _ref(cfg, params, toks, layers, pooling), atol=1e-5, rtol=0)


def test_turn_spans_pool_per_turn_then_over_turns(model):
    cfg, params = model
    rows = [r for r in _rows(8, seed=1) if len(r) >= 6]
    spans = [[(1, 3), (4, len(r))] if i % 2 else [(0, len(r) - 1)] for i, r in enumerate(rows)]
    for pooling, tp in (("mean", "max"), ("last", "mean"), ("max", "last")):
        got = A.extract(cfg, params, rows, (2,), pooling, spans, turn_pooling=tp)
        for i, toks in enumerate(rows):
            np.testing.assert_allclose(got[i], _ref(cfg, params, toks, (2,), pooling, spans[i], tp),
                                       atol=1e-5, rtol=0)


def test_store_reads_back_exactly_and_resumes_after_a_kill(model, tmp_path, monkeypatch):
    cfg, params = model
    rows = _rows(21, seed=2)
    ids = [f"r{i}" for i in range(len(rows))]
    fresh = A.extract(cfg, params, rows, (1, 2), "mean", batch_tokens=64)
    out = str(tmp_path / "store")

    real = A.iter_extract
    seen = []

    def killed_after_two(*a, **kw):
        for k, item in enumerate(real(*a, **kw)):
            if k == 2:
                raise KeyboardInterrupt  # the process dies mid-run
            seen.extend(item[0].tolist())
            yield item

    monkeypatch.setattr(A, "iter_extract", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        S.write_store(out, cfg, params, ids, rows, (1, 2), "mean", batch_tokens=64, progress=False)
    first = sorted(seen)
    assert 0 < len(first) < len(rows)
    with pytest.raises(ValueError, match="unfinished"):
        S.open_store(out)
    assert json.load(open(os.path.join(out, "manifest.json")))["complete"] is False

    seen.clear()
    monkeypatch.setattr(A, "iter_extract", lambda *a, **kw: (seen.extend(x[0].tolist()) or x
                                                            for x in real(*a, **kw)))
    man = S.write_store(out, cfg, params, ids, rows, (1, 2), "mean", batch_tokens=64, progress=False)
    assert man["complete"] is True
    assert sorted(seen) == sorted(set(range(len(rows))) - set(first))  # finished rows skipped
    store = S.open_store(out)
    assert store.ids == ids
    np.testing.assert_array_equal(store.read(), fresh)
    np.testing.assert_array_equal(store.read(layer=2), fresh[:, 1])
    # a different setting on the same directory is refused, not mixed in
    with pytest.raises(ValueError, match="other settings"):
        S.write_store(out, cfg, params, ids, rows, (1, 2), "max", progress=False)


def test_bad_input(model, tmp_path, monkeypatch):
    cfg, params = model
    with pytest.raises(ValueError, match="layer 3, but the model has 2 layers"):
        A.extract(cfg, params, [[1, 2]], (3,), "mean")
    with pytest.raises(ValueError, match="row 1 has an empty text"):
        A.extract(cfg, params, [[1, 2], []], (1,), "mean")
    with pytest.raises(ValueError, match="turn_spans"):
        A.extract(cfg, params, [[1, 2]], (1,), "mean", [[(1, 5)]])
    with pytest.raises(ValueError, match="repeats"):
        S.write_store(str(tmp_path / "s"), cfg, params, ["a", "a"], [[1], [2]], (1,), progress=False)
    monkeypatch.setattr(S.shutil, "disk_usage", lambda p: type("U", (), {"free": 10})())
    with pytest.raises(ValueError, match="needs .* bytes but the disk has 10 free"):
        S.write_store(str(tmp_path / "full"), cfg, params, ["a"], [[1]], (1,), progress=False)
    monkeypatch.undo()
    if os.geteuid() != 0:  # root ignores permission bits
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        with pytest.raises(ValueError, match="not writable"):
            S.write_store(str(ro / "s"), cfg, params, ["a"], [[1]], (1,), progress=False)
    with pytest.raises(ValueError, match="not an activation store"):
        S.open_store(str(tmp_path))


def test_cli_writes_store(tmp_path):
    from rossjax.cli import main
    rows = _rows(5, seed=3)
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"x{i}", "input_ids": r}) for i, r in enumerate(rows)))
    out = tmp_path / "acts"
    assert main(["extract", "--config=configs/extract.py", f"--config.input={src}",
                 f"--config.output={out}", "--config.pooling=last"]) == 0
    store = S.open_store(str(out))
    assert store.ids == [f"x{i}" for i in range(5)] and store.manifest["pooling"] == "last"
    cfg = get_preset("tiny_qwen2")
    # the CLI ran data-parallel over all 8 simulated devices; one device gives the same vectors
    np.testing.assert_allclose(store.read(), A.extract(cfg, init_params(cfg, jax.random.PRNGKey(0)),
                                                       rows, (1, 2), "last"), atol=1e-5, rtol=0)
    # TensorBoard events and metrics.jsonl next to the store
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(out / "tb"))
    rows_m = [json.loads(l) for l in open(out / "metrics.jsonl")]
    assert rows_m[-1]["split"] == "extract" and rows_m[-1]["rows_done"] == 5
    assert rows_m[-1]["tokens_per_s"] > 0 and 0 <= rows_m[-1]["padding_share"] < 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "input_ids": [1]}\n{"id": "b", "input_ids": []}\n')
    assert main(["extract", "--config=configs/extract.py", f"--config.input={bad}",
                 f"--config.output={tmp_path / 'o2'}"]) == 2


def test_cli_bad_input_is_one_sentence(tmp_path, capsys):
    from rossjax.cli import main
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "input_ids": [1, 2]}\n')
    base = ["extract", "--config=configs/extract.py", f"--config.input={src}",
            f"--config.output={tmp_path / 'o'}"]
    for extra, says in ((["--config.layers=(5,)"], "layer 5, but the model has 2 layers"),
                        (["--config.model=/nonexistent/model"], "field 'model'"),
                        (["--config.mesh.data=16"], "asks for 16 devices"),
                        (["--config.no_such=1"], "no field 'no_such'"),
                        (["stray"], "unexpected arguments")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err


@pytest.mark.parametrize("sizes,pooling,turns", [((8, 1, 1), "mean", False), ((2, 2, 2), "last", True)])
def test_extract_on_a_mesh_equals_one_device(model, sizes, pooling, turns):
    from rossjax.sharding import make_mesh
    cfg, params = model
    rng = np.random.RandomState(4)
    rows = [rng.randint(0, 256, k).tolist() for k in rng.randint(2, 16, 11)]  # one length bucket
    spans = [[(0, len(r) // 2), (len(r) // 2, len(r))] for r in rows] if turns else None
    one = A.extract(cfg, params, rows, (0, 2), pooling, spans, turn_pooling="max", batch_tokens=64)
    many = A.extract(cfg, params, rows, (0, 2), pooling, spans, turn_pooling="max", batch_tokens=64,
                     mesh=make_mesh(*sizes))
    np.testing.assert_allclose(many, one, atol=1e-5, rtol=0)
