"""Per-agent-turn activations aggregated over turns (rossjax/probes/turns.py): per-turn vectors
equal the one-pass extract's, mean / last / max / attention equal extract's turn pooling, and attention
pooling is the softmax of the last turn's dot products over the valid turns."""

import jax
import numpy as np
import pytest

from rossjax.errors import InputError
from rossjax.models import get_preset, init_params
from rossjax.probes import activations as A, turns


@pytest.fixture(scope="module")
def model():
    cfg = get_preset("tiny_qwen2")
    return cfg, init_params(cfg, jax.random.PRNGKey(0))


def _rows():
    rng = np.random.RandomState(3)
    rows = [rng.randint(0, 256, k).tolist() for k in (12, 16, 9)]  # one length bucket: one compile
    spans = [[(1, 4), (6, 12)], [(2, 5), (7, 11), (13, 16)], [(0, 9)]]
    return rows, spans


@pytest.fixture(scope="module")
def vectors(model):
    cfg, params = model
    rows, spans = _rows()
    return turns.turn_vectors(cfg, params, rows, spans, (2,), "mean", batch_tokens=64)


def test_turn_vectors_match_extract(model, vectors):
    cfg, params = model
    rows, spans = _rows()
    v, valid = vectors
    assert v.shape == (3, 3, 1, cfg.d_model) and valid.tolist() == [
        [True, True, False], [True, True, True], [True, False, False]]
    for i, row in enumerate(rows):
        for t, span in enumerate(spans[i]):  # the full row, one span: causal, so the same
            ref = A.extract(cfg, params, [row], (2,), "mean", [[span]], batch_tokens=64)[0]
            np.testing.assert_allclose(v[i, t], ref, atol=1e-5, rtol=0)
    assert not v[~valid].any()


def test_aggregate_equals_extract_turn_pooling(model, vectors):
    cfg, params = model
    rows, spans = _rows()
    for how in ("mean", "last", "max", "attention"):  # extract's jitted pooling == numpy's
        ref = A.extract(cfg, params, rows, (2,), "mean", spans, turn_pooling=how, batch_tokens=64)
        np.testing.assert_allclose(turns.aggregate(*vectors, how), ref, atol=1e-5, rtol=0)
    # max-pooled tokens over turns: empty turn slots never leak -inf / NaN into attention
    got = A.extract(cfg, params, rows, (2,), "max", spans, turn_pooling="attention",
                    batch_tokens=64)
    v, valid = turns.turn_vectors(cfg, params, rows, spans, (2,), "max", batch_tokens=64)
    np.testing.assert_allclose(got, turns.aggregate(v, valid, "attention"), atol=1e-5, rtol=0)
    with pytest.raises(InputError, match="pooling 'attention' is not one of"):
        A.extract(cfg, params, rows, (2,), "attention", spans, batch_tokens=64)


def test_attention_pooling():
    rng = np.random.RandomState(0)
    v = rng.randn(2, 4, 1, 8).astype(np.float32)
    valid = np.array([[True, True, True, False], [True, False, False, False]])
    got = turns.aggregate(v, valid, "attention")
    q = v[0, 2, 0].astype(np.float64)
    s = np.array([v[0, t, 0] @ q for t in range(3)]) / np.sqrt(8)
    w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    np.testing.assert_allclose(got[0, 0], (w[:, None] * v[0, :3, 0]).sum(0), atol=1e-6, rtol=0)
    np.testing.assert_allclose(got[1], v[1, 0], atol=1e-7, rtol=0)  # one turn: itself
    v2 = v.copy()
    v2[0, 3] = 1e6  # an invalid turn never enters
    np.testing.assert_array_equal(turns.aggregate(v2, valid, "attention"), got)
    np.testing.assert_allclose(turns.attention_weights(v, valid).sum(1), 1.0, atol=1e-12)


def test_bad_inputs(model):
    cfg, params = model
    v = np.zeros((1, 2, 1, 4), np.float32)
    with pytest.raises(InputError, match="not one of"):
        turns.aggregate(v, np.ones((1, 2), bool), "median")
    with pytest.raises(InputError, match="row 0 has no valid turn"):
        turns.aggregate(v, np.zeros((1, 2), bool), "mean")
    with pytest.raises(InputError, match=r"\[n, T, L, d\]"):
        turns.aggregate(v[0], np.ones((1, 2), bool))
    with pytest.raises(InputError, match="turn_spans"):
        turns.turn_vectors(cfg, params, [[1, 2, 3]], None, (1,))
    with pytest.raises(InputError, match="outside"):
        turns.turn_vectors(cfg, params, [[1, 2, 3]], [[(0, 9)]], (1,))
