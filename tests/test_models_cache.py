"""KV cache: chunked prefill + single-token decode equals one full forward, with left padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax.models import (
    ModelConfig,
    decode_params,
    forward,
    forward_cached,
    init_cache,
    init_params,
)

CONFIGS = {
    "qwen2": ModelConfig(model_type="qwen2", qkv_bias=True, tie_embeddings=True),
    "mistral_window": ModelConfig(model_type="mistral", sliding_window=3),
    "qwen3_mixed_window": ModelConfig(model_type="qwen3", qk_norm=True, head_dim=32, sliding_window=3,
                                      layer_types=("full_attention", "sliding_attention")),
    # long-prompt path: the chunk attends over the whole cache through the block-wise kernel
    "qwen3_window_blockwise": ModelConfig(model_type="qwen3", qk_norm=True, head_dim=32,
                                          sliding_window=3, attention_impl="blockwise",
                                          attention_block=4,
                                          layer_types=("full_attention", "sliding_attention")),
}


@pytest.mark.parametrize("layout", ["stacked", "decode"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_prefill_and_decode_match_full_forward(name, layout):
    """`decode` = what generate uses on CPU: decode_params weights and a per-layer cache."""
    # a wider init than the default so every position's logits differ visibly
    cfg = CONFIGS[name].replace(initializer_range=0.2)
    params = init_params(cfg, jax.random.key(1))
    rng = np.random.RandomState(0)
    b, prompt, steps, max_len = 3, 6, 4, 12
    pads = np.array([0, 2, 4])
    tokens = rng.randint(0, cfg.vocab_size, (b, prompt + steps))
    valid = np.arange(prompt + steps)[None, :] >= pads[:, None]          # left padding
    positions = np.clip(np.cumsum(valid, 1) - 1, 0, None)
    full, _ = forward(cfg, params, tokens, positions=positions, segment_ids=valid.astype(np.int32))
    full = np.asarray(full)

    step = jax.jit(lambda p, t, pos, c, i, m: forward_cached(cfg, p, t, pos, c, i, m))
    cache = init_cache(cfg, b, max_len, per_layer=layout == "decode")
    if layout == "decode":
        params = decode_params(cfg, params)
    got = []
    for lo, hi in ((0, 4), (4, prompt)):  # prefill in two chunks
        logits, cache = step(params, tokens[:, lo:hi], positions[:, lo:hi], cache, jnp.int32(lo),
                             valid[:, lo:hi])
        got.append(np.asarray(logits))
    for t in range(prompt, prompt + steps):  # then one token at a time, traced cache_index
        logits, cache = step(params, tokens[:, t:t + 1], positions[:, t:t + 1], cache, jnp.int32(t),
                             valid[:, t:t + 1])
        got.append(np.asarray(logits))
    got = np.concatenate(got, axis=1)
    assert got.dtype == np.float32 and got.shape == full.shape
    np.testing.assert_allclose(got[valid], full[valid], atol=1e-4, rtol=0)
    assert np.asarray(cache["mask"])[:, :prompt + steps].tolist() == valid.tolist()
    assert not np.asarray(cache["mask"])[:, prompt + steps:].any()


def test_default_token_mask_and_cache_dtype():
    cfg = ModelConfig(initializer_range=0.2)
    params = init_params(cfg, jax.random.key(0))
    tokens = np.arange(5)[None] % cfg.vocab_size
    cache = init_cache(cfg, 1, 8, dtype=jnp.bfloat16)
    assert cache["k"].dtype == jnp.bfloat16 and cache["k"].shape == (2, 1, 2, 8, 16)
    logits, cache = forward_cached(cfg, params, tokens, np.arange(5)[None], cache, 0)
    assert np.asarray(cache["mask"]).tolist() == [[True] * 5 + [False] * 3]
    full, _ = forward(cfg, params, tokens)
    # bf16 cache storage loses precision; the point is the slots line up
    np.testing.assert_allclose(np.asarray(logits), np.asarray(full), atol=5e-2, rtol=0)
