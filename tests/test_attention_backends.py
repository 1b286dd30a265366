"""Fused attention backends equal the dense reference: outputs and gradients on packed rows.

`xla` (jax.nn.dot_product_attention) runs on CPU; Pallas splash runs in interpret mode on CPU
(forward and backward); `cudnn` needs an NVIDIA GPU and is skipped elsewhere.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax.models import (
    ModelConfig,
    attention as att,
    forward,
    hidden_states,
    init_params,
    kernels,
)


def _packed(b, s, rng, min_doc=3, max_doc=40):
    """Packed rows: documents of random length (positions restart per document), then padding
    (segment 0) at the end of some rows."""
    seg = np.zeros((b, s), np.int32)
    pos = np.zeros((b, s), np.int32)
    for r in range(b):
        off, i = 0, 1
        end = s - rng.randint(0, 9)
        while off < end:
            n = min(rng.randint(min_doc, max_doc), end - off)
            seg[r, off:off + n], pos[r, off:off + n] = i, np.arange(n)
            off, i = off + n, i + 1
        pos[r, end:] = np.arange(s - end)
    return seg, pos


def _inputs(seed, b=2, s=150, nkv=2, g=2, hd=32, window=0):
    rng = np.random.RandomState(seed)
    q = jnp.asarray(rng.normal(size=(b, s, nkv * g, hd)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, s, nkv, hd)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, s, nkv, hd)), jnp.float32)
    seg, pos = _packed(b, s, rng)
    idx = jnp.arange(s, dtype=jnp.int32)
    m = att.MaskSpec(jnp.asarray(seg), jnp.asarray(seg), idx, idx, jnp.asarray(pos), jnp.asarray(pos),
                     jnp.int32(window))
    ct = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
    return q, k, v, m, ct


def _out_and_grads(impl, q, k, v, m, ct, windows):
    def f(q, k, v):
        return att.attend(q, k, v, m, impl=impl, windows=windows)
    out, vjp = jax.vjp(jax.jit(f), q, k, v)
    return (out, *vjp(ct))


def _check(impl, window, atol):
    q, k, v, m, ct = _inputs(window + 1, window=window)
    ref = _out_and_grads("dense", q, k, v, m, ct, (window,))
    got = _out_and_grads(impl, q, k, v, m, ct, (window,))
    for name, a, b in zip(("out", "dq", "dk", "dv"), ref, got):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=atol, rtol=0, err_msg=name)


@pytest.mark.parametrize("window", [0, 7])
def test_xla_backend_matches_dense(window):
    _check("xla", window, 2e-5)


@pytest.mark.parametrize("window", [0, 7])
def test_splash_interpret_matches_dense(window):
    # s = 150 pads to one 256-slot block: padded slots must stay out of real rows.
    _check("splash", window, 2e-5)


@pytest.mark.skipif(not (jax.default_backend() == "gpu" and kernels._is_nvidia()),
                    reason="cuDNN flash attention needs an NVIDIA GPU (run this file on a device)")
def test_cudnn_matches_dense_in_bf16():
    q, k, v, m, ct = _inputs(3)
    q, k, v, ct = (x.astype(jnp.bfloat16) for x in (q, k, v, ct))
    ref = _out_and_grads("dense", q, k, v, m, ct, (0,))
    got = _out_and_grads("cudnn", q, k, v, m, ct, (0,))
    for a, b in zip(ref, got):
        np.testing.assert_allclose(np.asarray(b, np.float32), np.asarray(a, np.float32), atol=3e-2)


def test_splash_switches_window_per_layer():
    """A traced window (the layer scan carries it) picks the matching static kernel."""
    q, k, v, m, ct = _inputs(5, window=7)
    qg = q.reshape(q.shape[0], q.shape[1], 2, 2, q.shape[-1])
    for w in (0, 7):
        mw = m._replace(window=jnp.int32(w))
        got = jax.jit(lambda m: kernels.attend("splash", qg, k, v, m, (0, 7)))(mw)
        np.testing.assert_allclose(np.asarray(got), np.asarray(att.dense(qg, k, v, mw)), atol=2e-5)


@pytest.mark.parametrize("impl", ["xla", "splash"])
def test_model_with_fused_backend_equals_dense(impl):
    """Whole model on packed rows, a full and a sliding-window layer: logits and param grads."""
    base = ModelConfig(model_type="qwen3", qk_norm=True, sliding_window=6, initializer_range=0.2,
                       layer_types=("full_attention", "sliding_attention"))
    dense_cfg, fused_cfg = base.replace(attention_impl="dense"), base.replace(attention_impl=impl)
    params = init_params(dense_cfg, jax.random.key(0))
    rng = np.random.RandomState(1)
    seg, pos = _packed(2, 40, rng, max_doc=17)
    tokens = rng.randint(0, base.vocab_size, seg.shape)
    ld, _ = forward(dense_cfg, params, tokens, pos, seg)
    lf, _ = forward(fused_cfg, params, tokens, pos, seg)
    np.testing.assert_allclose(np.asarray(lf), np.asarray(ld), atol=1e-4, rtol=0)
    w = jnp.asarray(rng.normal(size=(2, 40, base.d_model)), jnp.float32)
    grad = lambda cfg: jax.grad(lambda p: jnp.sum(hidden_states(cfg, p, tokens, pos, seg) * w))(params)
    for a, b in zip(jax.tree.leaves(grad(dense_cfg)), jax.tree.leaves(grad(fused_cfg))):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(b - a)) <= 1e-5 * max(1.0, np.max(np.abs(a)))


class _Device:
    """A device of another platform (what a compile-only TPU topology device reports)."""
    def __init__(self, platform):
        self.platform = platform
        self.client = type("Client", (), {"platform_version": "cuda 12"})()


def test_auto_picks_by_the_target_platform_and_cache_paths_stay_pure(monkeypatch):
    from rossjax.models.kernels import activations

    assert att.backend("auto", 512, 512, 512, jnp.float32) in ("dense", "splash", "cudnn")
    # the host's default backend decides nothing: only the devices the program is traced for
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with activations.target(_Device("cpu")):
        assert att.backend("auto", 4096, 4096, 512, jnp.float32) == "blockwise"
    monkeypatch.undo()
    with activations.target(_Device("tpu")):
        assert activations.target_platform() == "tpu"
        assert att.backend("auto", 4096, 4096, 512, jnp.float32) == "splash"
        assert att.backend("auto", 1, 4096, 512, jnp.float32) == "dense"          # decode
        assert att.backend("auto", 4096, 4096, 512, jnp.float32,
                           self_attention=False) == "blockwise"
        assert att.backend("splash", 8, 4096, 512, jnp.float32, self_attention=False) == "dense"
    with activations.target(_Device("gpu")):
        assert att.backend("auto", 4096, 4096, 512, jnp.bfloat16) == "cudnn"
        assert att.backend("auto", 4096, 4096, 512, jnp.float32) == "blockwise"   # cuDNN: half only
    with activations.target(_Device("cpu")):
        assert att.backend("auto", 4096, 4096, 512, jnp.bfloat16) == "blockwise"
        assert att.backend("xla", 4096, 4096, 512, jnp.float32) == "xla"
    assert activations.TARGET.get() is None


def test_the_target_is_the_traced_mesh_not_the_host():
    """Inside shard_activations the activation context's mesh names the target devices."""
    from rossjax.models import transformer
    from rossjax.models.kernels import activations

    part = _mesh_2x2x2()
    with transformer.shard_activations(part):
        assert activations.target_device() is part.mesh.devices.flat[0]
    assert activations.target_device() is jax.devices()[0]


def _mesh_2x2x2():
    if jax.device_count() < 8:
        pytest.skip("needs 8 (simulated) devices")
    from rossjax import sharding
    return sharding.Partitioner(sharding.make_mesh(data=2, fsdp=2, tensor=2))


def test_splash_on_a_mesh_runs_per_shard_and_matches_dense():
    """Rows split over data x fsdp, kv heads over tensor: forward and gradients equal the dense
    reference, and the compiled program moves no q/k/v (or gradients) between devices."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from rossjax.models.transformer import shard_activations

    part = _mesh_2x2x2()
    q, k, v, m, ct = _inputs(11, b=4, s=128, window=0)
    ref = _out_and_grads("dense", q, k, v, m, ct, (0,))
    heads = NamedSharding(part.mesh, P(("data", "fsdp"), None, "tensor", None))
    rows = NamedSharding(part.mesh, P(("data", "fsdp"), None))

    def loss(q, k, v, seg, ct):
        mm = m._replace(q_seg=seg, kv_seg=seg)
        out, vjp = jax.vjp(lambda q, k, v: att.attend(q, k, v, mm, impl="splash", windows=(0,)),
                           q, k, v)
        return (out, *vjp(ct))

    with shard_activations(part):
        step = jax.jit(loss, in_shardings=(heads, heads, heads, rows, heads))
        args = [jax.device_put(x, s) for x, s in zip((q, k, v, m.q_seg, ct),
                                                      (heads, heads, heads, rows, heads))]
        text = step.lower(*args).compile().as_text()
        got = step(*args)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ref, got):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5, rtol=0, err_msg=name)
        assert b.sharding.is_equivalent_to(heads, b.ndim), name
    for op in ("all-gather", "all-to-all", "collective-permute", "all-reduce"):
        assert op not in text, op


def test_shard_activations_takes_the_batch_axes_from_the_rules():
    from jax.sharding import NamedSharding, PartitionSpec as P

    from rossjax import sharding
    from rossjax.models import transformer
    from rossjax.models.kernels import activations

    base = _mesh_2x2x2()
    with transformer.shard_activations(base):
        act = activations.current()
        assert (act.batch, act.kv_heads) == (("data", "fsdp"), ("tensor",))
    rules = (("batch", "fsdp"), ("kv_heads", None)) + sharding.DEFAULT_RULES
    part = sharding.Partitioner(base.mesh, rules)
    with transformer.shard_activations(part):
        act = activations.current()
        assert (act.batch, act.kv_heads) == (("fsdp",), ())
    with transformer.shard_activations(base.mesh, batch_axes=("data",)):
        assert activations.current().batch == ("data",)
    assert activations.current() is None
    # the model's rows follow the custom rule (fsdp only: data holds replicas)
    cfg = ModelConfig(attention_impl="dense")
    params = init_params(cfg, jax.random.key(0))
    tokens = np.zeros((4, 8), np.int32)
    h = jax.jit(transformer.under_mesh(lambda p, t: hidden_states(cfg, p, t), part))(params, tokens)
    assert h.sharding.is_equivalent_to(NamedSharding(part.mesh, P("fsdp")), 3), h.sharding
