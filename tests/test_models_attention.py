"""Block-wise (flash) attention equals dense attention: outputs, logsumexp and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax.models import ModelConfig, attention as att, forward, hidden_states, init_params


def _packed_ids(b, s, rng):
    """Segment ids with documents of random length (the last one cut), 0 = trailing padding."""
    seg = np.zeros((b, s), np.int32)
    pos = np.zeros((b, s), np.int32)
    for r in range(b):
        off, i = 0, 1
        end = s - rng.randint(0, 6)
        while off < end:
            n = min(rng.randint(3, 17), end - off)
            seg[r, off:off + n], pos[r, off:off + n] = i, np.arange(n)
            off, i = off + n, i + 1
    return seg, pos


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("block", [8, 16])
def test_blockwise_matches_dense_with_gradients(window, block):
    rng = np.random.RandomState(window + block)
    b, s, nkv, g, hd = 2, 45, 2, 3, 8           # s not a multiple of the block: padded tiles
    q = jnp.asarray(rng.normal(size=(b, s, nkv, g, hd)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, s, nkv, hd)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, s, nkv, hd)), jnp.float32)
    seg, pos = _packed_ids(b, s, rng)
    idx = jnp.arange(s, dtype=jnp.int32)
    m = att.MaskSpec(jnp.asarray(seg), jnp.asarray(seg), idx, idx, jnp.asarray(pos), jnp.asarray(pos),
                     jnp.int32(window))
    ct = jnp.asarray(rng.normal(size=q.shape), jnp.float32)

    def run(fn):
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, m), q, k, v)
        return (out, *vjp(ct))

    dense = run(att.dense)
    block_ = run(jax.jit(lambda q, k, v, m: att.blockwise(q, k, v, m, block=block)))
    for a, b_ in zip(dense, block_):
        np.testing.assert_allclose(np.asarray(b_), np.asarray(a), atol=2e-5, rtol=0)
    # the logsumexp the flash forward keeps for its backward is the dense one
    scores = jnp.einsum("bskgd,btkd->bkgst", q, k) * q.shape[-1] ** -0.5
    lse = jax.nn.logsumexp(jnp.where(att.mask_array(m)[:, None, None], scores, att.MASK_VALUE), -1)
    np.testing.assert_allclose(np.asarray(att._flash_forward(q, k, v, m, block, block)[1]),
                               np.asarray(lse), atol=2e-5, rtol=0)


def test_tiles_skip_exactly_the_empty_tiles():
    rng = np.random.RandomState(3)
    seg, pos = _packed_ids(1, 64, rng)
    idx = jnp.arange(64, dtype=jnp.int32)
    for window in (0, 4):
        m = att.MaskSpec(jnp.asarray(seg), jnp.asarray(seg), idx, idx, jnp.asarray(pos),
                         jnp.asarray(pos), jnp.int32(window))
        full = np.asarray(att.mask_array(m))[0]
        needed = np.asarray(att._tiles(m, 64, 64, 8, 8).needed)
        has_pair = full.reshape(8, 8, 8, 8).any(axis=(1, 3))
        assert not (has_pair & ~needed).any()            # never skips a visible pair
        assert needed[np.triu_indices(8, 1)].sum() == 0  # causal: no tile above the diagonal
        assert needed.sum() < 36                         # and documents/windows prune more


@pytest.mark.parametrize("name", ["qwen2", "qwen3_window"])
def test_model_blockwise_equals_dense_on_packed_batch(name):
    base = {"qwen2": ModelConfig(model_type="qwen2", qkv_bias=True, tie_embeddings=True),
            "qwen3_window": ModelConfig(model_type="qwen3", qk_norm=True, sliding_window=6,
                                        layer_types=("full_attention", "sliding_attention"))}[name]
    base = base.replace(initializer_range=0.2)
    dense_cfg = base.replace(attention_impl="dense")
    block_cfg = base.replace(attention_impl="blockwise", attention_block=16)
    params = init_params(dense_cfg, jax.random.key(0))
    rng = np.random.RandomState(1)
    seg, pos = _packed_ids(2, 56, rng)
    tokens = rng.randint(0, base.vocab_size, seg.shape)
    ld, _ = forward(dense_cfg, params, tokens, pos, seg)
    lb, _ = forward(block_cfg, params, tokens, pos, seg)
    np.testing.assert_allclose(np.asarray(lb), np.asarray(ld), atol=1e-4, rtol=0)

    w = jnp.asarray(rng.normal(size=(2, 56, base.d_model)), jnp.float32)
    grad = lambda cfg: jax.grad(lambda p: jnp.sum(hidden_states(cfg, p, tokens, pos, seg) * w))(params)
    for a, b in zip(jax.tree.leaves(grad(dense_cfg)), jax.tree.leaves(grad(block_cfg))):
        # gradients reach ~30 here and fp32 summation order differs: bound the error relative
        # to each tensor's largest entry
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(b - a)) <= 1e-5 * max(1.0, np.max(np.abs(a)))


def test_auto_picks_dense_for_short_rows():
    assert not att.use_blockwise("auto", 512, 512, 512)
    assert att.use_blockwise("auto", 2048, 2048, 512)
    assert not att.use_blockwise("auto", 4, 4096, 512)     # a few decode queries: dense is cheap
    assert att.use_blockwise("blockwise", 8, 8, 512) and not att.use_blockwise("dense", 9e9, 9e9, 1)
    with pytest.raises(ValueError, match="attention_impl"):
        ModelConfig(attention_impl="flash")


def test_block_zero_is_the_platforms_block():
    # ModelConfig's default block (0) is 128 on CPU: block-wise from 257 keys on; an explicit
    # block is kept, and the config refuses a negative one.
    assert ModelConfig().attention_block == 0 and att.block_size(0) == 128
    assert att.block_size(512) == 512
    assert att.backend("auto", 512, 512, 0, jnp.float32) == "blockwise"
    assert att.backend("auto", 256, 256, 0, jnp.float32) == "dense"
    assert att.backend("auto", 1024, 1024, 512, jnp.float32) == "dense"
    with pytest.raises(ValueError, match="attention_block"):
        ModelConfig(attention_block=-1)


def test_row_chunks_keep_the_outputs_and_gradients(monkeypatch):
    # On CPU 'auto' runs the kernels over chunks of rows (dense for short rows, block-wise for
    # long ones); budgets shrunk here so that 6 rows split into chunks of 2 and 3, with packed
    # documents, padding and a window, against the whole-batch kernels.
    rng = np.random.RandomState(3)
    b, s, t, h, kvh, hd = 6, 40, 40, 4, 2, 8
    q = jnp.asarray(rng.normal(size=(b, s, h, hd)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(b, t, kvh, hd)), jnp.float32) for _ in range(2))
    seg = np.stack([_packed_ids(1, s, rng)[0][0] for _ in range(b)])
    seg[1, 30:] = 0                                         # a padded row
    m = att.MaskSpec(jnp.asarray(seg), jnp.asarray(seg), jnp.arange(s), jnp.arange(t),
                     jnp.asarray(np.tile(np.arange(s), (b, 1))),
                     jnp.asarray(np.tile(np.arange(t), (b, 1))), jnp.int32(9))
    w = jnp.asarray(rng.normal(size=(b, s, h, hd)), jnp.float32)
    loss = lambda impl, block: lambda q, k, v: jnp.sum(att.attend(q, k, v, m, impl=impl,
                                                                  block=block) * w)
    row = 4 * h * s * t
    for plan, kind, rows, block in (({"dense_row": row, "chunk": 2 * row, "tile": 1}, "dense", 2, 16),
                                    ({"dense_row": 0, "chunk": 0, "tile": 4 * h * 16 * 16 * 3},
                                     "blockwise", 3, 16)):
        monkeypatch.setitem(att.ROW_CHUNKS_BY_PLATFORM, "cpu", plan)
        assert att.row_chunks(b, s, t, h, block) == (kind, rows)
        want = jax.value_and_grad(loss(kind, block), argnums=(0, 1, 2))(q, k, v)
        got = jax.value_and_grad(loss("auto", block), argnums=(0, 1, 2))(q, k, v)
        for a, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(a), atol=2e-5, rtol=1e-5)
    monkeypatch.setitem(att.ROW_CHUNKS_BY_PLATFORM, "cpu", {"dense_row": 1, "chunk": 1, "tile": 1})
    assert att.row_chunks(7, s, t, h, 16) == ("blockwise", 1)          # a prime batch: row by row
    monkeypatch.delitem(att.ROW_CHUNKS_BY_PLATFORM, "cpu")
    assert att.row_chunks(b, s, t, h, 16) is None                      # other platforms: whole
