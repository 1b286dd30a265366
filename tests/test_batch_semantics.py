"""SFT batch semantics: a step is `global_batch` rollouts (batch_mode="sequences", the paper's
count) packed into as many rows as they need; token_budget mode fills rows instead."""

import jax
import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter

from rossjax.configs import ross_sft
from rossjax.curate.compiled import encode_example
from rossjax.curate.packing import make_loader, micro_major, pack_group
from rossjax.train import accumulate

SEQ = 64


def _docs(n=37, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        length = int(rng.integers(4, SEQ + 1))
        loss = (rng.random(length) < 0.5).astype(np.uint8)
        loss[-1] = 1
        out.append({"id": f"d{k}", "input_ids": (1000 * (k + 1) + np.arange(length)).astype(np.int32),
                    "loss_mask": loss, "eligible_mask": np.ones(length, np.uint8),
                    "provenance": {}, "turn_spans": []})
    return out


@pytest.fixture
def shard(tmp_path):
    docs = _docs()
    w = ArrayRecordWriter(str(tmp_path / "compiled-00000.array_record"), "group_size:1")
    for d in docs:
        w.write(encode_example(d))
    w.close()
    return str(tmp_path), docs


def _doc_ids(batch):
    """First token // 1000 of every document in a batch (docs are numbered by their ids)."""
    out = []
    for ids, seg in zip(batch["input_ids"], batch["segment_ids"]):
        for s in range(1, int(seg.max()) + 1):
            out.append(int(ids[seg == s][0]) // 1000)
    return out


@pytest.mark.parametrize("strategy", ["first_fit", "best_fit"])
def test_sequences_mode_has_exactly_n_rollouts_per_step(shard, strategy):
    path, docs = shard
    S, rows, micro = 8, 8, 4
    batches = list(make_loader([path], SEQ, rows, shuffle=False, strategy=strategy,
                               batch_unit="sequences", sequences=S, micro_batches=micro))
    per_step = [len(_doc_ids(b)) for b in batches]
    assert per_step == [S] * (len(docs) // S) + [len(docs) % S]  # 128 rollouts, not 128 rows
    got = sorted(i for b in batches for i in _doc_ids(b))
    assert got == list(range(1, len(docs) + 1))  # every rollout once
    for b in batches:
        assert b["input_ids"].shape == (rows, SEQ)
        used = (b["segment_ids"] > 0).any(1)
        # real rows fill whole micro-batches first (micro-batch m = rows m, m+micro, ...)
        active = [bool(used[m::micro].any()) for m in range(micro)]
        assert active == sorted(active, reverse=True)
        assert used.sum() < len(_doc_ids(b)) or len(_doc_ids(b)) == 1  # rows are shared
    # the rows mode (token budget) packs a different number of rollouts per step
    rows_mode = list(make_loader([path], SEQ, rows, shuffle=False, strategy=strategy))
    assert {len(_doc_ids(b)) for b in rows_mode[:-1]} != {S}


def test_pack_group_and_layout():
    docs = [{"input_ids": np.zeros(n)} for n in (30, 40, 24, 34)]
    assert pack_group(docs, 64, "first_fit") == [[0, 2], [1], [3]]
    assert pack_group(docs, 64, "best_fit") == [[1, 2], [3, 0]]  # decreasing: 2 rows
    # 3 real rows of 8, 4 micro-batches of 2 rows (rows m, m+4): rows 0,4 | 1
    assert micro_major(3, 8, 4) == [0, 4, 1]
    assert micro_major(3, 6, 4) == [0, 1, 2]  # no clean split: in order


def test_overflowing_group_is_an_error(shard):
    path, _ = shard
    with pytest.raises(ValueError, match="need .* packed rows"):
        list(make_loader([path], SEQ, 2, shuffle=False, batch_unit="sequences", sequences=8))


def test_config_default_is_the_paper_batch():
    c = ross_sft.get_config()
    assert c.train.batch_mode == "sequences" and c.train.global_batch == 128
    assert ross_sft.get_config("token_budget").train.batch_mode == "token_budget"


def test_inactive_micro_batches_are_skipped_and_exact():
    calls = []

    def loss_fn(p, mb):
        calls.append(1)  # traced once per branch; the value counts rows that ran
        return (p["w"] * mb["x"]).sum(), mb["x"].sum()

    params = {"w": np.float32(2.0)}
    micro = {"x": np.array([[1.0, 2.0], [0.0, 0.0], [3.0, 0.0]], np.float32)}
    g, (v, a) = jax.jit(lambda p, m: accumulate.accumulate(
        loss_fn, p, m, np.float32(0), active=lambda mb: mb["x"].sum() > 0))(params, micro)
    assert float(g["w"]) == 6.0 and float(v) == 12.0 and float(a) == 6.0


def test_sequence_batch_step_equals_one_micro_batch_and_counts_rollouts(shard):
    """The loader's sequence batch through the real SFT step: skipping the all-padding
    micro-batches changes nothing (Eq. 4 divides by the step's supervised tokens)."""
    import optax

    from rossjax import models, sharding
    from rossjax.models import shardings as model_shardings
    from rossjax.train import state as state_lib
    from rossjax.train.sft import step as sft

    path, _ = shard
    b = next(iter(make_loader([path], SEQ, 8, shuffle=False, batch_unit="sequences", sequences=4,
                              micro_batches=4)))
    cfg = models.get_preset("tiny_qwen2")
    batch = {k: (v % cfg.vocab_size if k == "input_ids" else v) for k, v in b.items()
             if k in sft.BATCH_KEYS}
    mesh = sharding.make_mesh(data=-1, fsdp=1, tensor=1)
    p_shard = model_shardings.param_shardings(cfg, mesh)
    params = jax.device_put(models.init_params(cfg, jax.random.PRNGKey(0)), p_shard)
    opt = optax.sgd(1.0)
    sh = state_lib.state_shardings(p_shard, opt, jax.eval_shape(lambda: params), mesh)
    bs = sharding.batch_sharding(mesh, 2, shape=batch["input_ids"].shape)
    out = []
    for micro in (1, 4):
        state = state_lib.init_state(jax.tree.map(lambda x: x.copy(), params), opt, sh)
        step = sft.make_train_step(cfg, opt, lambda s: 1.0, mesh=mesh, shardings=sh,
                                   batch_sharding=bs, micro_batches=micro, chunk_size=16)
        state, m = step(state, jax.device_put(batch, bs))
        out.append((jax.device_get(m), jax.device_get(state["params"])))
    (m1, p1), (m4, p4) = out
    assert m1["sequences"] == m4["sequences"] == 4
    assert m1["supervised_tokens"] == m4["supervised_tokens"] > 0
    np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-6)
    for a, c in zip(jax.tree.leaves(p4), jax.tree.leaves(p1)):
        np.testing.assert_allclose(a, c, atol=1e-6, rtol=1e-5)
