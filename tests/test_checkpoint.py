"""Checkpointer round trips, retention, incompatible checkpoints, SIGTERM flag; optimizer recipe."""

import os
import signal

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rossjax.train import checkpoint as ckpt_lib, export as export_lib, optim


def _state(scale=1.0, shape=(3, 4)):
    params = {"dense": {"kernel": jnp.full(shape, scale), "bias": jnp.arange(shape[1], dtype=jnp.float32)}}
    opt = optax.adamw(1e-3)
    return {"params": params, "opt_state": opt.init(params), "step": jnp.array(7, jnp.int32),
            "rng": jax.random.PRNGKey(3), "bad_steps": jnp.array(0, jnp.int32)}


def _abstract(state):
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev), state)


@pytest.mark.parametrize("data_state", [b"\x00\x01grain-bytes\xff", {"pos": 5, "epoch": [1, 2]}, None])
def test_round_trip_restores_state_and_data_state(tmp_path, data_state):
    st = _state(2.5)
    ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"), save_every=1, keep=2)
    assert ck.save(7, st, data_state)
    ck.wait()
    restored, ds = ck.restore(ck.latest_step(), _abstract(st))
    ck.close()
    assert ds == data_state
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(st)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jax.tree.structure(restored) == jax.tree.structure(st)


def test_keeps_last_k_and_saves_on_interval(tmp_path):
    ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"), save_every=2, keep=2, async_save=True)
    for step in range(1, 8):
        ck.save(step, _state(float(step)))
    ck.save(7, _state(7.0), force=True)
    ck.close()
    ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"), save_every=2, keep=2)
    assert ck.latest_step() == 7
    assert sorted(ck._mngr.all_steps()) == [6, 7]
    restored, _ = ck.restore(6, _abstract(_state()))
    assert float(restored["params"]["dense"]["kernel"][0, 0]) == 6.0
    ck.close()


def test_incompatible_checkpoint_is_one_clear_sentence(tmp_path):
    ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"), save_every=1)
    ck.save(1, _state(shape=(3, 4)))
    ck.wait()
    with pytest.raises(ValueError) as e:
        ck.restore(1, _abstract(_state(shape=(5, 4))))
    ck.close()
    msg = str(e.value)
    assert "incompatible" in msg and "['dense']['kernel']" in msg and "(3, 4)" in msg and "(5, 4)" in msg
    assert msg.count(". ") == 0 and "\n" not in msg


def test_params_export_and_restore(tmp_path):
    st = _state(1.5)
    ckpt_lib.save_params(str(tmp_path / "exp"), st["params"])
    back = ckpt_lib.restore_params(str(tmp_path / "exp"), _abstract(st["params"]))
    np.testing.assert_array_equal(back["dense"]["kernel"], st["params"]["dense"]["kernel"])
    with pytest.raises(ValueError, match="incompatible"):
        ckpt_lib.restore_params(str(tmp_path / "exp"), _abstract(_state(shape=(2, 4))["params"]))


def test_export_reads_params_without_knowing_the_optimizer(tmp_path):
    ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"), save_every=1)
    ck.save(3, _state(4.0))
    ck.close()
    step, params = export_lib.restore_params(str(tmp_path / "ck"))
    assert step == 3 and float(params["dense"]["kernel"][1, 1]) == 4.0


def test_sigterm_sets_the_flag_instead_of_killing():
    with ckpt_lib.PreemptionGuard() as guard:
        assert not guard.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.requested
    assert not ckpt_lib.any_process(False) and ckpt_lib.any_process(True)


def test_optimizer_is_the_ross_recipe():
    cfg = optim.default_config()
    assert (cfg.b1, cfg.b2, cfg.peak_lr, cfg.end_lr, cfg.warmup_frac, cfg.weight_decay) == (
        0.9, 0.98, 4e-6, 2e-7, 0.05, 0.1)
    _, sched = optim.make_optimizer(cfg, 1000)
    assert float(sched(0)) == 0.0
    np.testing.assert_allclose(float(sched(25)), 2e-6, rtol=1e-6)   # half-way through warmup
    np.testing.assert_allclose(float(sched(50)), 4e-6, rtol=1e-6)   # peak at 5%
    np.testing.assert_allclose(float(sched(1000)), 2e-7, rtol=1e-6)
    mid = 2e-7 + 0.5 * (4e-6 - 2e-7)                               # cosine half-way point
    np.testing.assert_allclose(float(sched(525)), mid, rtol=1e-5)


def test_optimizer_update_matches_hand_written_adamw():
    cfg = ml_collections.ConfigDict(optim.default_config().to_dict())
    cfg.warmup_steps, cfg.schedule, cfg.clip_norm = 0, "constant", 0.0
    opt, _ = optim.make_optimizer(cfg, 10)
    p = {"w": jnp.array([[1.0, -2.0]]), "b": jnp.array([0.5])}
    g = {"w": jnp.array([[0.1, 0.3]]), "b": jnp.array([-0.2])}
    upd, _ = opt.update(g, opt.init(p), p)
    lr, b1, b2, eps, wd = 4e-6, 0.9, 0.98, 1e-8, 0.1
    for k in p:
        m, v = (1 - b1) * g[k], (1 - b2) * g[k] ** 2
        step = -lr * ((m / (1 - b1)) / (jnp.sqrt(v / (1 - b2)) + eps) + (wd * p[k] if k == "w" else 0))
        np.testing.assert_allclose(upd[k], step, rtol=1e-5)


def test_clipping_is_configurable():
    cfg = optim.default_config()
    cfg.clip_norm = 1.0
    opt, _ = optim.make_optimizer(cfg, 10)
    assert len(opt.init({"w": jnp.ones(2)})) == 2  # clip + adamw
    cfg.clip_norm = 0.0
    opt, _ = optim.make_optimizer(cfg, 10)
    assert len(opt.init({"w": jnp.ones(2)})) == 1
