"""The SFT train step: parity with PyTorch autograd, exact accumulation, packing invariance."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rossjax import models, sharding
from rossjax.models import shardings as model_shardings
from rossjax.train import state as state_lib
from rossjax.train.sft import step as sft

SEQ = 24


_MESH = {}
_STEPS = {}  # compiled steps reused across tests (compiles dominate this file's runtime)
_SGD = optax.sgd(1.0)


def _mesh():
    if "m" not in _MESH:
        _MESH["m"] = sharding.make_mesh(data=-1, fsdp=1, tensor=1)
    return _MESH["m"]


@pytest.fixture(scope="module")
def tiny():
    cfg = models.get_preset("tiny_qwen2")
    return cfg, jax.device_get(models.init_params(cfg, jax.random.PRNGKey(1)))


def _run_step(cfg, params, batch, *, micro=1, chunk=8):
    """One step with SGD(lr=1) so that grads = params_before - params_after; returns (loss, grads)."""
    mesh = _mesh()
    p_shard = model_shardings.param_shardings(cfg, mesh)
    params = jax.device_put(params, p_shard)
    before = jax.device_get(params)
    sh = state_lib.state_shardings(p_shard, _SGD, jax.eval_shape(lambda: params), mesh)
    state = state_lib.init_state(params, _SGD, sh)
    shape = batch["input_ids"].shape
    bs = sharding.batch_sharding(mesh, 2, shape=shape)
    key = (cfg, micro, chunk, shape)
    if key not in _STEPS:
        _STEPS[key] = sft.make_train_step(cfg, _SGD, lambda s: 1.0, mesh=mesh, shardings=sh,
                                          batch_sharding=bs, micro_batches=micro, chunk_size=chunk)
    state, m = _STEPS[key](state, jax.device_put(batch, bs))
    after = jax.device_get(state["params"])
    grads = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), before, after)
    return jax.device_get(m), grads


def _batch(rng, rows, seq, vocab, p_mask):
    return {"input_ids": rng.integers(0, vocab, (rows, seq)).astype(np.int32),
            "loss_mask": (rng.random((rows, seq)) < p_mask).astype(np.int32),
            "segment_ids": np.ones((rows, seq), np.int32),
            "positions": np.tile(np.arange(seq, dtype=np.int32), (rows, 1))}


@pytest.fixture(scope="module")
def hf_qwen2(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    conf = transformers.Qwen2Config(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0)
    model = transformers.Qwen2ForCausalLM(conf).float().eval()
    path = tmp_path_factory.mktemp("qwen2")
    model.save_pretrained(path, safe_serialization=True)
    return model, str(path)


def test_one_step_matches_torch_autograd(hf_qwen2, tmp_path):
    import torch

    model, path = hf_qwen2
    cfg, params = models.load_hf(path, dtype="float32")
    rng = np.random.default_rng(0)
    batch = _batch(rng, 4, SEQ, cfg.vocab_size, 0.5)
    batch["loss_mask"][2] = 0  # a row without supervision still shapes nothing
    m, grads = _run_step(cfg, params, batch, micro=2, chunk=7)

    ids = torch.from_numpy(batch["input_ids"]).long()
    labels = torch.where(torch.from_numpy(batch["loss_mask"]) > 0, ids, torch.full_like(ids, -100))
    model.zero_grad()
    out = model(input_ids=ids, labels=labels)  # mean over supervised (shifted) targets
    out.loss.backward()
    n_sup = int((labels[:, 1:] != -100).sum())
    assert m["supervised_tokens"] == n_sup
    assert abs(float(m["loss"]) - out.loss.item()) <= 1e-5

    # Map torch grads to rossjax's layout through the HF loader: save grads as a model.
    gpath = tmp_path / "grads"
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.grad)
    model.save_pretrained(gpath, safe_serialization=True)
    _, tgrads = models.load_hf(str(gpath), dtype="float32")
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(a - np.asarray(b, np.float64)))), grads, tgrads)
    worst = max(jax.tree.leaves(diffs))
    assert worst <= 1e-5, diffs


@pytest.mark.slow
def test_micro_batches_equal_full_batch_with_uneven_supervision(tiny):
    cfg, params = tiny
    rng = np.random.default_rng(3)
    batch = _batch(rng, 8, SEQ, cfg.vocab_size, 0.9)
    # micro-batch m holds rows m and m+4: give them very different supervised counts.
    batch["loss_mask"][[1, 5]] = 0
    batch["loss_mask"][[1], 3] = 1
    batch["loss_mask"][[2, 6]] = (rng.random((2, SEQ)) < 0.1)
    full_m, full_g = _run_step(cfg, params, batch, micro=1)
    acc_m, acc_g = _run_step(cfg, params, batch, micro=4)
    assert full_m["supervised_tokens"] == acc_m["supervised_tokens"]
    np.testing.assert_allclose(acc_m["loss"], full_m["loss"], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(acc_g), jax.tree.leaves(full_g)):
        np.testing.assert_allclose(a, b, atol=2e-7, rtol=1e-5)

    # The naive mean of per-micro-batch means differs: the test can tell the two apart.
    nll = jax.jit(lambda p, mb: sft.batch_nll(cfg, p, mb, 8))
    parts = [nll(params, {k: v[[m, m + 4]] for k, v in batch.items()}) for m in range(4)]
    naive = float(np.mean([float(s) / float(c) for s, c in parts]))
    assert abs(naive - float(full_m["loss"])) > 1e-3


def test_packed_batch_equals_unpacked(tiny):
    cfg, params = tiny
    rng = np.random.default_rng(4)
    lens = [9, 7, 5, 11]
    docs = [(rng.integers(0, cfg.vocab_size, n).astype(np.int32), (rng.random(n) < 0.6).astype(np.int32))
            for n in lens]
    # Unpacked: one doc per row, right-padded with segment id 0.
    unpacked = {k: np.zeros((4, SEQ), np.int32) for k in sft.BATCH_KEYS}
    for i, (ids, lm) in enumerate(docs):
        n = len(ids)
        unpacked["input_ids"][i, :n], unpacked["loss_mask"][i, :n] = ids, lm
        unpacked["segment_ids"][i, :n] = 1
        unpacked["positions"][i, :n] = np.arange(n)
    # Packed: docs 0+1 in row 0, docs 2+3 in row 1, trailing padding; plus two empty rows.
    packed = {k: np.zeros((4, SEQ), np.int32) for k in sft.BATCH_KEYS}
    for row, pair in enumerate([(0, 1), (2, 3)]):
        off = 0
        for seg, d in enumerate(pair, start=1):
            ids, lm = docs[d]
            n = len(ids)
            packed["input_ids"][row, off:off + n], packed["loss_mask"][row, off:off + n] = ids, lm
            packed["segment_ids"][row, off:off + n] = seg
            packed["positions"][row, off:off + n] = np.arange(n)
            off += n
    m_u, g_u = _run_step(cfg, params, unpacked)
    m_p, g_p = _run_step(cfg, params, packed)
    assert m_u["supervised_tokens"] == m_p["supervised_tokens"] > 0
    np.testing.assert_allclose(m_p["loss"], m_u["loss"], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_p), jax.tree.leaves(g_u)):
        np.testing.assert_allclose(a, b, atol=2e-7, rtol=1e-5)


def test_nonfinite_step_is_skipped_and_counted(tiny):
    cfg, params = tiny
    params = jax.tree.map(lambda x: x, params)
    params["final_norm"]["scale"] = jnp.asarray(params["final_norm"]["scale"]).at[0].set(jnp.nan)
    mesh = _mesh()
    p_shard = model_shardings.param_shardings(cfg, mesh)
    params = jax.device_put(params, p_shard)
    sh = state_lib.state_shardings(p_shard, _SGD, jax.eval_shape(lambda: params), mesh)
    state = state_lib.init_state(params, _SGD, sh)
    bs = sharding.batch_sharding(mesh, 2, shape=(8, SEQ))
    key = (cfg, 1, 8, (8, SEQ))
    step = _STEPS.get(key) or sft.make_train_step(cfg, _SGD, lambda s: 1.0, mesh=mesh, shardings=sh,
                                                  batch_sharding=bs, micro_batches=1, chunk_size=8)
    batch = jax.device_put(_batch(np.random.default_rng(0), 8, SEQ, cfg.vocab_size, 0.5), bs)
    before = jax.device_get(state["params"]["embed"]["embedding"])
    for i in range(2):
        state, m = step(state, batch)
        assert int(m["skipped"]) == 1 and int(m["bad_steps"]) == i + 1
    np.testing.assert_array_equal(jax.device_get(state["params"]["embed"]["embedding"]), before)
