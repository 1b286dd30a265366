"""Checkpointer round trips, retention, incompatible checkpoints, checksums and the fall-back from
a damaged step, SIGTERM flag; optimizer recipe."""

import io
import json
import os
import signal

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rossjax.errors import InputError
from rossjax.train import checkpoint as ckpt_lib, optim
from rossjax.train.export import model as export_lib


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


def test_clipping_clips_the_global_norm():
    """clip_norm=1 scales gradients of global norm 10 by 1/10 before AdamW; 0 leaves them. With
    eps = 1 the first Adam step, -lr * g / (|g| + 1), shows the gradient's scale."""
    cfg = ml_collections.ConfigDict(optim.default_config().to_dict())
    cfg.warmup_steps, cfg.schedule, cfg.eps, cfg.weight_decay = 0, "constant", 1.0, 0.0
    p = {"w": jnp.zeros((2,)), "b": jnp.zeros((1,))}
    g = {"w": jnp.array([6.0, 0.0]), "b": jnp.array([8.0])}  # global norm 10
    lr = cfg.peak_lr
    for clip, scale in ((1.0, 0.1), (0.0, 1.0), (20.0, 1.0)):
        cfg.clip_norm = clip
        opt, _ = optim.make_optimizer(cfg, 10)
        upd, _ = opt.update(g, opt.init(p), p)
        for k in p:
            gk = np.asarray(g[k]) * scale
            np.testing.assert_allclose(upd[k], -lr * gk / (np.abs(gk) + 1.0), rtol=1e-6)


# ---------------------------------------------------------------- integrity (issue 22 item 4)

def _random_state(seed, shape=(64, 64)):
    st = _state(1.0, shape)
    st["params"]["dense"]["kernel"] = jax.random.normal(jax.random.PRNGKey(seed), shape)
    return st


def _flip_bit(step_dir):
    """Flip one bit in the middle of the step's largest array file (raw float bytes)."""
    files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs
             if os.sep + "d" + os.sep in os.path.join(r, f)]
    big = max(files, key=os.path.getsize)
    data = bytearray(open(big, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(big, "wb").write(bytes(data))
    return big


def _saved(tmp_path, states, keep=3):
    ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"), save_every=1, keep=keep)
    for step, st in states.items():
        ck.save(step, st, {"step": step})
    ck.close()
    return ckpt_lib.Checkpointer(str(tmp_path / "ck"), save_every=1, keep=keep)


def test_every_finished_step_carries_a_checksum_manifest(tmp_path):
    ck = _saved(tmp_path, {1: _random_state(0), 2: _random_state(1)})
    for step in (1, 2):
        man = json.load(open(tmp_path / "ck" / str(step) / ckpt_lib.MANIFEST))
        listed = {k for k in man["files"]}
        on_disk = {os.path.relpath(os.path.join(r, f), tmp_path / "ck" / str(step))
                   for r, _, fs in os.walk(tmp_path / "ck" / str(step)) for f in fs}
        assert listed == on_disk - {ckpt_lib.MANIFEST} and any("ocdbt" in k for k in listed)
        assert ck.verify(step) is True
    ck.close()


def test_a_flipped_bit_falls_back_to_the_previous_step(tmp_path):
    st1, st2 = _random_state(0), _random_state(1)
    ck = _saved(tmp_path, {1: st1, 2: st2})
    flipped = _flip_bit(tmp_path / "ck" / "2")
    ck.log = io.StringIO()
    step, restored, ds = ck.restore_latest(_abstract(st1), "train")
    assert step == 1 and ds == {"step": 1} and ck.restored_step == 1
    np.testing.assert_array_equal(restored["params"]["dense"]["kernel"], st1["params"]["dense"]["kernel"])
    msg = ck.log.getvalue().strip()
    assert msg.startswith("rossjax train: checkpoint step 2 of ") and "\n" not in msg
    assert os.path.basename(flipped) in msg and "does not match its sha256" in msg
    assert "falling back to step 1." in msg
    moved = os.listdir(tmp_path / ckpt_lib.SET_ASIDE)
    assert len(moved) == 1 and moved[0].startswith("2-") and sorted(os.listdir(tmp_path / "ck")) == ["1"]
    assert ck.save(2, st2, {"step": 2})  # the step is redone and saved again, not skipped
    ck.close()
    ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"))
    assert ck.latest_step() == 2 and ck.verify(2)
    ck.close()


def test_non_finite_state_and_unreadable_steps_fall_back_and_then_stop(tmp_path):
    bad = _random_state(1)
    bad["opt_state"][0].mu["dense"]["kernel"] = bad["opt_state"][0].mu["dense"]["kernel"].at[3, 4].set(jnp.nan)
    ck = _saved(tmp_path, {1: _random_state(0), 2: _random_state(2), 3: bad})
    os.remove(tmp_path / "ck" / "2" / ckpt_lib.MANIFEST)   # unsealed (a kill before sealing) ...
    for r, _, fs in os.walk(tmp_path / "ck" / "2" / "state"):  # ... and cut short
        for f in fs:
            if os.sep + "d" in r:
                open(os.path.join(r, f), "wb").close()
    ck.log = io.StringIO()
    step, _, _ = ck.restore_latest(_abstract(bad), "grpo")
    lines = ck.log.getvalue().strip().splitlines()
    assert step == 1 and len(lines) == 2
    assert "step 3 " in lines[0] and "non-finite values ([0].mu['dense']['kernel']" in lines[0].replace(
        "['opt_state']", "")
    assert "step 2 " in lines[1] and "does not restore" in lines[1] and "falling back to step 1." in lines[1]
    ck.close()
    _flip_bit(tmp_path / "ck" / "1")
    ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"))
    ck.log = io.StringIO()
    with pytest.raises(ckpt_lib.CheckpointError) as e:
        ck.restore_latest(_abstract(bad), "grpo")
    assert "no earlier checkpoint is left" in ck.log.getvalue()
    msg = str(e.value)
    assert msg.startswith(f"no checkpoint in {tmp_path / 'ck'} can be resumed (steps 1 are damaged")
    assert "give a new --workdir" in msg and "\n" not in msg
    assert ck.restore_latest(_abstract(bad), "grpo") == (None, None, None)  # nothing left to try
    ck.close()


def test_another_model_is_refused_not_set_aside(tmp_path):
    ck = _saved(tmp_path, {1: _state(shape=(3, 4))})
    with pytest.raises(InputError, match="incompatible"):
        ck.restore_latest(_abstract(_state(shape=(5, 4))), "train")
    assert os.listdir(tmp_path / "ck") == ["1"] and not (tmp_path / ckpt_lib.SET_ASIDE).exists()
    ck.close()


def test_a_non_finite_first_step_after_a_resume_sets_the_step_aside_and_stops(tmp_path):
    ck = _saved(tmp_path, {1: _random_state(0), 2: _random_state(1)})
    ck.log = io.StringIO()
    assert ck.restore_latest(_abstract(_random_state(0)), "train")[0] == 2
    ck.check_resumed_step(2, 1.5, "train")      # finite: nothing happens, and only once
    ck.check_resumed_step(2, float("nan"), "train")
    assert ck.latest_step() == 2
    assert ck.restore_latest(_abstract(_random_state(0)), "train")[0] == 2
    ck.check_resumed_step(5, float("nan"), "train")  # not the first step after the restore
    with pytest.raises(ckpt_lib.CheckpointError) as e:
        ck.check_resumed_step(2, float("inf"), "train")
    msg = str(e.value)
    assert msg.startswith("the first step after resuming from checkpoint step 2 gave a non-finite loss")
    assert "rerun `rossjax train` with the same --workdir to resume from step 1." in msg
    assert ck.latest_step() == 1 and os.listdir(tmp_path / ckpt_lib.SET_ASIDE)[0].startswith("2-")
    ck.close()
