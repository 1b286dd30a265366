"""The train core SFT and GRPO share (state.py, accumulate.py) and the Partitioner's divisibility
rule: a GRPO update with a non-finite loss leaves the state as it was (lax.cond), micro-batch
accumulation equals the whole batch, and an axis that does not divide a tensor names both."""

import warnings

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from rossjax import models, sharding
from rossjax.errors import ConfigError
from rossjax.models import shardings as model_shardings
from rossjax.train import accumulate, state as state_lib
from rossjax.train.rl import grpo_step

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")


def _loss_cfg(micro=2):
    # Two iterations per batch: the update ratio is against the batch's old_logp (off-policy).
    return ml_collections.ConfigDict(dict(micro_batches=micro, agg="token_mean", beta=0.0,
                                          eps_low=0.2, eps_high=0.2, is_mode="none",
                                          contexts=2, group_size=4, num_iterations=2,
                                          minibatches=1))


def _grpo_setup(micro=2, opt=None):
    cfg = models.get_preset("tiny_qwen2", vocab_size=64)
    part = sharding.Partitioner(sharding.make_mesh(data=4, fsdp=1, tensor=2))
    opt = opt or optax.adam(1e-2)
    p_shard = model_shardings.param_shardings(cfg, part)
    params = model_shardings.init_params_sharded(cfg, jax.random.PRNGKey(0), part)
    s_shard = state_lib.state_shardings(p_shard, opt, jax.eval_shape(lambda: params), part)
    fns = grpo_step.StepFns(cfg, opt, lambda s: 1e-2, partitioner=part, param_shardings=p_shard,
                            state_shardings=s_shard, base_shardings={}, lora_alpha=None,
                            loss_cfg=_loss_cfg(micro), chunk=8, max_new=8)
    return cfg, fns, params, opt, s_shard


def _grpo_batch(rows=8, seq=16, vocab=64, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, (rows, seq)).astype(np.int32)
    mask = np.zeros((rows, seq), np.float32)
    mask[:, 6:12] = 1
    return {"tokens": tokens, "positions": np.tile(np.arange(seq, dtype=np.int32), (rows, 1)),
            "segment_ids": np.ones((rows, seq), np.int32),
            "targets": np.concatenate([tokens[:, 1:], np.zeros((rows, 1), np.int32)], 1),
            "mask": mask, "old_logp": np.full((rows, seq), -4.0, np.float32),
            "sampler_logp": np.full((rows, seq), -4.0, np.float32),
            "ref_logp": np.zeros((rows, seq), np.float32),
            "is_weights": np.zeros((rows, seq), np.float32),
            "adv": rng.normal(size=rows).astype(np.float32)}


def test_grpo_nonfinite_update_leaves_state_unchanged():
    cfg, fns, params, opt, s_shard = _grpo_setup()
    before = jax.device_get(params)
    state = state_lib.init_state(params, opt, s_shard)
    batch = _grpo_batch()
    batch["adv"][3] = np.nan                      # one bad advantage: the loss is NaN
    state, m = fns.update(state, {}, fns.put_rows(batch))
    m = jax.device_get(m)
    assert not np.isfinite(m["loss"]) and m["skipped"] == 1 and m["bad_steps"] == 1
    assert int(state["step"]) == 1 and int(state["bad_steps"]) == 1
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(state["params"]))):
        np.testing.assert_array_equal(a, b)
    assert int(jax.device_get(state["opt_state"][0].count)) == 0   # Adam never stepped

    # A finite update then moves the params and resets the bad-step count.
    state, m = fns.update(state, {}, fns.put_rows(_grpo_batch()))
    assert jax.device_get(m)["skipped"] == 0 and int(state["bad_steps"]) == 0
    moved = [not np.array_equal(a, b) for a, b in
             zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(state["params"])))]
    assert any(moved)


def test_grpo_micro_batches_equal_one_batch():
    outs = []
    for micro in (1, 4):
        # SGD: linear in the gradient (Adam's first step is ~sign(g), which flips on noise).
        cfg, fns, params, opt, s_shard = _grpo_setup(micro, optax.sgd(0.1))
        state = state_lib.init_state(params, opt, s_shard)
        state, m = fns.update(state, {}, fns.put_rows(_grpo_batch()))
        outs.append((jax.device_get(m), jax.device_get(state["params"])))
    (m1, p1), (m4, p4) = outs
    np.testing.assert_allclose(m1["loss"], m4["loss"], rtol=1e-5)
    np.testing.assert_allclose(m1["grad_norm"], m4["grad_norm"], rtol=1e-4)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p4)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_apply_if_finite_and_split_batch():
    opt = optax.sgd(1.0)
    params = {"w": jnp.ones(3)}
    opt_state = opt.init(params)
    g = {"w": jnp.full(3, 4.0)}
    new, _ = accumulate.apply_if_finite(opt, params, opt_state, g, jnp.bool_(True), jnp.float32(2))
    np.testing.assert_array_equal(new["w"], -np.ones(3))        # 1 - 4 / 2
    same, _ = accumulate.apply_if_finite(opt, params, opt_state, g, jnp.bool_(False), 2.0)
    np.testing.assert_array_equal(same["w"], np.ones(3))
    x = jnp.arange(8)
    np.testing.assert_array_equal(accumulate.split_micro(x, 2), [[0, 2, 4, 6], [1, 3, 5, 7]])
    with pytest.raises(ValueError, match="6 rows is not divisible into 4"):
        accumulate.split_batch({"x": jnp.zeros((6, 2))}, 4)


def test_partitioner_divisibility_names_tensor_and_axis():
    mesh = sharding.make_mesh(data=1, fsdp=2, tensor=4)
    strict = sharding.Partitioner(mesh, (("heads", "tensor"), ("kv_heads", "tensor"),
                                         ("embed", "fsdp")))
    cfg = models.ModelConfig(model_type="llama", n_kv_heads=2, n_heads=4)
    with pytest.raises(ConfigError, match=r"params/layers/attn/k/kernel dim 2 \('kv_heads', size 2\)"
                                          r".*mesh axis 'tensor'"):
        model_shardings.param_shardings(cfg, strict)
    with pytest.raises(ConfigError, match="the batch dim 0 .*mesh axis 'data'"):
        sharding.Partitioner(sharding.make_mesh(data=8, fsdp=1)).rows(2, (4, 16), name="the batch")
    # Marked optional ("tensor?", as in DEFAULT_RULES): dropped for that tensor, with a warning.
    optional = sharding.Partitioner(mesh, (("heads", "tensor"), ("kv_heads", "tensor?"),
                                           ("embed", "fsdp")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sh = model_shardings.param_shardings(cfg, optional)
    assert sh["layers"]["attn"]["k"]["kernel"].spec == P(None, "fsdp", None, None)
    assert sh["layers"]["attn"]["q"]["kernel"].spec == P(None, "fsdp", "tensor", None)
    assert any("attn/k/kernel" in str(w.message) and "'tensor'" in str(w.message) for w in caught)
    with pytest.raises(ConfigError, match=r"mesh axis 'model\?'"):
        sharding.Partitioner(mesh, (("embed", "model?"),))
