"""Training-facing API: hidden_states @ lm_head == forward logits, scan == loop, remat keeps grads,
bf16 compute keeps fp32 logits, presets and init."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax.models import (
    ModelConfig,
    compute_logits,
    forward,
    get_preset,
    hidden_states,
    init_params,
    lm_head,
    logical_axes,
)

BASE = ModelConfig(model_type="qwen3", qk_norm=True, head_dim=32, initializer_range=0.2)


@pytest.mark.parametrize("tied", [False, True])
def test_hidden_states_times_lm_head_is_forward_logits(tied):
    cfg = BASE.replace(tie_embeddings=tied)
    params = init_params(cfg, jax.random.key(0))
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 9))
    seg = np.array([[1] * 9, [1] * 4 + [2] * 5])
    logits, hidden = forward(cfg, params, tokens, segment_ids=seg, hidden_layers=(-1,))
    h = hidden_states(cfg, params, tokens, segment_ids=seg)
    head = lm_head(cfg, params)
    assert head.shape == (cfg.d_model, cfg.vocab_size) and h.shape == (2, 9, cfg.d_model)
    ref = np.asarray(h, np.float64) @ np.asarray(head, np.float64)
    np.testing.assert_allclose(np.asarray(logits), ref, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(hidden[-1]), np.asarray(h), atol=1e-6, rtol=0)
    if tied:
        assert "lm_head" not in params
        np.testing.assert_array_equal(np.asarray(head), np.asarray(params["embed"]["embedding"]).T)


def _loss(cfg, params, tokens):
    h = hidden_states(cfg, params, tokens)
    logp = jax.nn.log_softmax(compute_logits(cfg, params, h[:, :-1]))
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()


@pytest.mark.slow
def test_scan_loop_and_remat_agree():
    tokens = jnp.asarray(np.random.RandomState(1).randint(0, BASE.vocab_size, (2, 8)))
    params = init_params(BASE, jax.random.key(1))
    ref_logits, ref_hidden = forward(BASE, params, tokens, hidden_layers=(0, 1, 2))
    ref_loss, ref_grad = jax.value_and_grad(lambda p: _loss(BASE, p, tokens))(params)
    for kw in ({"remat_policy": "full"}, {"scan_layers": False, "remat_policy": "dots"}):
        cfg = BASE.replace(**kw)
        logits, hidden = forward(cfg, params, tokens, hidden_layers=(0, 1, 2))
        np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=1e-5, rtol=0)
        for i in (0, 1, 2):
            np.testing.assert_allclose(np.asarray(hidden[i]), np.asarray(ref_hidden[i]), atol=1e-5)
        loss, grad = jax.jit(jax.value_and_grad(lambda p: _loss(cfg, p, tokens)))(params)
        np.testing.assert_allclose(float(loss), float(ref_loss), atol=1e-6)
        for g, r in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5, rtol=0, err_msg=str(kw))


def test_bf16_compute_keeps_fp32_logits():
    cfg = BASE.replace(dtype="bf16", param_dtype="bfloat16")
    params = init_params(cfg, jax.random.key(2))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
    tokens = np.arange(6)[None]
    logits, hidden = forward(cfg, params, tokens, hidden_layers=(1,))
    assert logits.dtype == jnp.float32 and hidden[1].dtype == jnp.bfloat16
    f32 = BASE.replace(param_dtype="float32")
    ref, _ = forward(f32, jax.tree.map(lambda x: x.astype(jnp.float32), params), tokens)
    assert np.abs(np.asarray(logits) - np.asarray(ref)).max() < 0.1 * np.abs(np.asarray(ref)).max()


def test_init_structure_matches_logical_axes_and_param_count():
    cfg = get_preset("qwen2_30m")
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    axes = logical_axes(cfg)
    is_spec = lambda s: isinstance(s, jax.sharding.PartitionSpec)
    assert jax.tree.structure(axes, is_leaf=is_spec) == jax.tree.structure(shapes)
    for spec, leaf in zip(jax.tree.leaves(axes, is_leaf=is_spec), jax.tree.leaves(shapes)):
        assert len(spec) == leaf.ndim
    assert sum(x.size for x in jax.tree.leaves(shapes)) == cfg.num_params()
    assert 25e6 < cfg.num_params() < 35e6
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.vocab_size) == (
        512, 8, 8, 2, 1536, 8192)


def test_bf16_checkpoint_round_trip(tmp_path):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from rossjax.models import load_hf, save_hf

    cfg = BASE.replace(dtype="bfloat16", param_dtype="bfloat16")
    params = init_params(cfg, jax.random.key(4))
    save_hf(cfg, params, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        assert f.get_slice("model.layers.0.self_attn.q_proj.weight").get_dtype() == "BF16"
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert model.dtype == torch.bfloat16
    cfg2, params2 = load_hf(tmp_path, dtype="bfloat16")
    assert cfg2.dtype == "bfloat16"
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        assert b.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    _, params32 = load_hf(tmp_path)  # default float32 upcasts exactly
    np.testing.assert_array_equal(np.asarray(params32["embed"]["embedding"]),
                                  np.asarray(params["embed"]["embedding"], np.float32))


def test_from_hf_config_legacy_and_v5_rope_keys_agree():
    from rossjax.models import from_hf_config

    base = {"model_type": "llama", "vocab_size": 8, "hidden_size": 32, "num_hidden_layers": 3,
            "num_attention_heads": 2, "intermediate_size": 8}
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    v4 = from_hf_config({**base, "rope_theta": 5e5, "rope_scaling": {"type": "llama3", **scaling}})
    v5 = from_hf_config({**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5,
                                                     **scaling}})
    assert v4 == v5 and v4.rope_theta == 5e5
    plain = from_hf_config({**base, "rope_theta": 5e5})
    assert not np.allclose(v4.inv_freq(), plain.inv_freq())
    # Qwen2 config without layer_types: sliding from max_window_layers on, as transformers does
    q = from_hf_config({**base, "model_type": "qwen2", "use_sliding_window": True,
                        "sliding_window": 4, "max_window_layers": 1})
    assert q.layer_windows() == (0, 4, 4)
    assert from_hf_config({**base, "model_type": "qwen2", "sliding_window": 4}).layer_windows() == (
        0, 0, 0)
