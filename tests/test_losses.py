"""Losses against slow obvious references and PyTorch cross_entropy(ignore_index=-100)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax.train import losses

jax.config.update("jax_enable_x64", False)


def slow_masked_nll(logits, targets, mask):
    """Loop over every position; log-softmax by hand in float64."""
    total, count = 0.0, 0.0
    for idx in np.ndindex(*targets.shape):
        if mask[idx] == 0:
            continue
        row = logits[idx].astype(np.float64)
        m = row.max()
        lse = m + math.log(sum(math.exp(v - m) for v in row))
        total += (lse - row[targets[idx]]) * float(mask[idx])
        count += float(mask[idx])
    return total, count


def slow_shift(input_ids, loss_mask, segment_ids):
    b, s = input_ids.shape
    tgt = np.zeros((b, s), np.int32)
    msk = np.zeros((b, s), np.float32)
    for i in range(b):
        for t in range(s - 1):
            tgt[i, t] = input_ids[i, t + 1]
            same_doc = segment_ids[i, t + 1] == segment_ids[i, t] and segment_ids[i, t + 1] != 0
            msk[i, t] = float(loss_mask[i, t + 1] != 0 and same_doc)
    return tgt, msk


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    b, s, d, v = 3, 37, 16, 53
    hidden = rng.normal(size=(b, s, d)).astype(np.float32)
    w = (rng.normal(size=(d, v)) / 4).astype(np.float32)
    targets = rng.integers(0, v, size=(b, s)).astype(np.int32)
    mask = (rng.random((b, s)) < 0.4).astype(np.float32)
    mask[1] = 0.0  # a row with nothing supervised
    return hidden, w, targets, mask


def test_masked_nll_matches_slow_reference(data):
    hidden, w, targets, mask = data
    logits = hidden @ w
    s, c = losses.masked_nll(jnp.asarray(logits), targets, mask)
    rs, rc = slow_masked_nll(logits, targets, mask)
    assert float(c) == rc
    np.testing.assert_allclose(float(s), rs, rtol=1e-6)


def test_masked_nll_matches_torch_cross_entropy(data):
    torch = pytest.importorskip("torch")
    hidden, w, targets, mask = data
    logits = hidden @ w
    labels = np.where(mask > 0, targets, -100)
    ref = torch.nn.functional.cross_entropy(
        torch.from_numpy(logits).reshape(-1, logits.shape[-1]),
        torch.from_numpy(labels).long().reshape(-1), ignore_index=-100, reduction="mean")
    s, c = losses.masked_nll(jnp.asarray(logits), targets, mask)
    np.testing.assert_allclose(float(s / c), ref.item(), rtol=1e-6)


def test_torch_hf_label_convention_matches_shift_targets():
    """HF shifts `labels` inside the model; shift_targets must give the same supervised set."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    b, s, v = 2, 11, 19
    ids = rng.integers(0, v, size=(b, s)).astype(np.int32)
    lm = (rng.random((b, s)) < 0.6).astype(np.uint8)
    logits = rng.normal(size=(b, s, v)).astype(np.float32)
    labels = torch.from_numpy(np.where(lm > 0, ids, -100)).long()
    ref = torch.nn.functional.cross_entropy(
        torch.from_numpy(logits)[:, :-1].reshape(-1, v), labels[:, 1:].reshape(-1),
        ignore_index=-100, reduction="sum")
    tgt, msk = losses.shift_targets(ids, lm, np.ones_like(ids))
    s_, c_ = losses.masked_nll(jnp.asarray(logits), tgt, msk)
    assert int(c_) == int((labels[:, 1:] != -100).sum())
    np.testing.assert_allclose(float(s_), ref.item(), rtol=1e-6)


def test_shift_targets_never_crosses_documents_or_padding():
    ids = np.array([[5, 6, 7, 8, 9, 10, 0, 0]], np.int32)
    seg = np.array([[1, 1, 1, 2, 2, 2, 0, 0]], np.int32)
    lm = np.array([[1, 1, 1, 1, 1, 1, 1, 1]], np.uint8)  # even padding "marked": must not count
    tgt, msk = losses.shift_targets(ids, lm, seg)
    rt, rm = slow_shift(ids, lm, seg)
    np.testing.assert_array_equal(np.asarray(tgt)[:, :-1], rt[:, :-1])
    np.testing.assert_array_equal(np.asarray(msk), rm)
    # token 8 opens document 2: position 2 (last of doc 1) must not predict it.
    assert np.asarray(msk).tolist() == [[1, 1, 0, 1, 1, 0, 0, 0]]


def test_shift_targets_random_matches_slow():
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 50, size=(4, 30)).astype(np.int32)
    lm = (rng.random((4, 30)) < 0.5).astype(np.uint8)
    seg = np.sort(rng.integers(0, 4, size=(4, 30)), axis=1)[:, ::-1].astype(np.int32)
    tgt, msk = losses.shift_targets(ids, lm, seg)
    rt, rm = slow_shift(ids, lm, seg)
    np.testing.assert_array_equal(np.asarray(msk), rm)
    np.testing.assert_array_equal(np.asarray(tgt)[:, :-1], rt[:, :-1])


@pytest.mark.parametrize("chunk", [1, 8, 10, 37, 64])
def test_chunked_equals_unchunked_value_and_grads(data, chunk):
    hidden, w, targets, mask = data

    def full(h, w_):
        return losses.masked_nll(h @ w_, targets, mask)[0]

    def chunked(h, w_):
        return losses.chunked_masked_nll(h, w_, targets, mask, chunk_size=chunk)[0]

    v0, g0 = jax.value_and_grad(full, argnums=(0, 1))(hidden, w)
    v1, g1 = jax.value_and_grad(chunked, argnums=(0, 1))(hidden, w)
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, atol=1e-6)
    c = losses.chunked_masked_nll(hidden, w, targets, mask, chunk_size=chunk)[1]
    assert float(c) == mask.sum()


def test_chunked_bf16_hidden_computes_logits_in_float32(data):
    hidden, w, targets, mask = data
    hb, wb = jnp.asarray(hidden, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)
    s, _ = losses.chunked_masked_nll(hb, wb, targets, mask, chunk_size=8)
    ref = losses.masked_nll(hb.astype(jnp.float32) @ wb.astype(jnp.float32), targets, mask)[0]
    assert s.dtype == jnp.float32
    np.testing.assert_allclose(float(s), float(ref), rtol=1e-5)


def test_chunked_backward_never_holds_full_logits():
    """Compiled temp memory of the gradient stays far below one [b, s, V] float32 tensor."""
    b, s, d, v, chunk = 1, 2048, 32, 4096, 128
    h = jax.ShapeDtypeStruct((b, s, d), jnp.float32)
    w = jax.ShapeDtypeStruct((d, v), jnp.float32)
    t = jax.ShapeDtypeStruct((b, s), jnp.int32)
    m = jax.ShapeDtypeStruct((b, s), jnp.float32)

    def loss(h, w, t, m):
        return losses.chunked_masked_nll(h, w, t, m, chunk_size=chunk)[0]

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(h, w, t, m).compile()
    mem = compiled.memory_analysis()
    if mem is None:
        pytest.skip("backend gives no memory analysis")
    full_logits = b * s * v * 4
    assert mem.temp_size_in_bytes < full_logits / 4, (mem.temp_size_in_bytes, full_logits)
