"""Mesh (data=2, fsdp=2, tensor=2) on 8 simulated CPU devices: sharded load_hf + forward equals
the single-device forward; rules are data, uneven dims fall back to replication."""

import jax
import numpy as np
import pytest
from hf_tiny import make_tiny_hf
from jax.sharding import PartitionSpec as P

from rossjax.models import ModelConfig, forward, init_params, load_hf
from rossjax.models.shardings import cache_shardings, init_params_sharded, param_shardings
from rossjax.sharding import (
    DEFAULT_RULES,
    batch_sharding,
    logical_to_mesh_spec,
    make_mesh,
    normalize_rules,
    shard_batch,
)

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")


def test_sharded_load_and_forward_equal_single_device(tmp_path):
    make_tiny_hf("qwen2", tmp_path)
    cfg, params = load_hf(tmp_path)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    _, sharded = load_hf(tmp_path, mesh=mesh)
    q = sharded["layers"]["attn"]["q"]["kernel"]  # [L, d, H, hd]
    assert q.sharding.spec == P(None, "fsdp", "tensor", None)
    assert {s.data.shape for s in q.addressable_shards} == {(2, 32, 2, 16)}
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(sharded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    rng = np.random.RandomState(0)
    tokens = rng.randint(0, cfg.vocab_size, (4, 16))
    seg = np.repeat([[1] * 10 + [2] * 6], 4, 0)
    ref, ref_hidden = forward(cfg, params, tokens, segment_ids=seg, hidden_layers=(1,))
    batch = shard_batch({"tokens": tokens, "seg": seg}, mesh)
    assert batch["tokens"].sharding.spec == P(("data", "fsdp"), None)
    got, hidden = jax.jit(lambda p, t, s: forward(cfg, p, t, segment_ids=s, hidden_layers=(1,)))(
        sharded, batch["tokens"], batch["seg"])
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(hidden[1]), np.asarray(ref_hidden[1]), atol=1e-5, rtol=0)


def test_param_shardings_rules_and_uneven_fallback():
    cfg = ModelConfig(model_type="llama", n_kv_heads=2, n_heads=4)
    mesh = make_mesh(data=1, fsdp=2, tensor=4)
    sh = param_shardings(cfg, mesh)
    assert sh["layers"]["attn"]["q"]["kernel"].spec == P(None, "fsdp", "tensor", None)
    assert sh["layers"]["attn"]["k"]["kernel"].spec == P(None, "fsdp", None, None)  # 2 heads / 4
    assert sh["embed"]["embedding"].spec == P("tensor", "fsdp")
    assert sh["lm_head"]["kernel"].spec == P("fsdp", "tensor")
    custom = dict(DEFAULT_RULES) | {"embed": None, "mlp": ["fsdp", "tensor"]}
    sh2 = param_shardings(cfg, mesh, custom)
    assert sh2["layers"]["mlp"]["up"]["kernel"].spec == P(None, None, ("fsdp", "tensor"))
    assert sh2["layers"]["attn"]["q"]["kernel"].spec == P(None, None, "tensor", None)
    # one mesh axis at most once per array
    assert logical_to_mesh_spec(P("embed", "embed"), DEFAULT_RULES, (8, 8), mesh) == P("fsdp", None)


def test_init_params_sharded_matches_plain_init():
    cfg = ModelConfig()
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = init_params_sharded(cfg, jax.random.key(3), mesh)
    plain = init_params(cfg, jax.random.key(3))
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(plain)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-7)
    assert sharded["embed"]["embedding"].sharding.spec == P("tensor", "fsdp")
    assert batch_sharding(mesh, 3).spec == P(("data", "fsdp"), None, None)
    cs = cache_shardings(cfg, mesh, batch=4, max_len=16)
    assert cs["k"].spec == P(None, ("data", "fsdp"), "tensor", None, None)
    assert cs["mask"].spec == P(("data", "fsdp"), None)


def test_bad_mesh_and_rules():
    with pytest.raises(ValueError, match="data\\*fsdp\\*tensor = 6"):
        make_mesh(data=2, fsdp=3, tensor=1)
    with pytest.raises(ValueError, match="mesh axis 'model'"):
        normalize_rules((("embed", "model"),))
    with pytest.raises(ValueError, match="batch size 3"):
        shard_batch({"x": np.zeros((3, 2))}, make_mesh(data=2, fsdp=2, tensor=2))
    assert make_mesh(tensor=2).shape == {"data": 1, "fsdp": 4, "tensor": 2}
