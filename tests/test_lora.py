"""LoRA: zero-init adapters leave logits unchanged; the merge equals x W + s x A B; the
reference is the base with adapters off; gradients flow to adapters only; sharding specs fit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax import models, sharding
from rossjax.models import lora


@pytest.fixture(scope="module")
def tiny():
    cfg = models.get_preset("tiny_qwen2", dtype="float32")
    return cfg, models.init_params(cfg, jax.random.PRNGKey(0))


def _tokens():
    return np.random.default_rng(0).integers(0, 256, (2, 9)).astype(np.int32)


def test_zero_init_same_logits(tiny):
    cfg, base = tiny
    ad = lora.init_lora(cfg, jax.random.PRNGKey(1), rank=4, targets="all")
    a, _ = models.forward(cfg, base, _tokens())
    b, _ = models.forward(cfg, lora.merge(base, ad, alpha=8.0), _tokens())
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_merge_is_low_rank_update(tiny):
    cfg, base = tiny
    ad = lora.init_lora(cfg, jax.random.PRNGKey(1), rank=2, targets=("q", "o", "down"))
    ad = jax.tree.map(lambda x: x + 0.1, ad)  # non-zero b
    merged = lora.merge(base, ad, alpha=4.0)
    for mod, name in (("attn", "q"), ("attn", "o"), ("mlp", "down")):
        w = np.asarray(base["layers"][mod][name]["kernel"])
        a = np.asarray(ad["layers"][mod][name]["a"])
        b = np.asarray(ad["layers"][mod][name]["b"])
        for layer in range(w.shape[0]):
            a2 = a[layer].reshape(-1, 2)
            b2 = b[layer].reshape(2, -1)
            want = w[layer] + (4.0 / 2) * (a2 @ b2).reshape(w[layer].shape)
            np.testing.assert_allclose(np.asarray(merged["layers"][mod][name]["kernel"][layer]),
                                       want, rtol=1e-5, atol=1e-6)
    # untouched kernels are the same arrays; the base tree itself is not modified
    assert merged["layers"]["attn"]["k"]["kernel"] is base["layers"]["attn"]["k"]["kernel"]
    assert not np.allclose(np.asarray(merged["layers"]["attn"]["q"]["kernel"]),
                           np.asarray(base["layers"]["attn"]["q"]["kernel"]))


def test_reference_is_adapters_off_and_grads_only_to_adapters(tiny):
    cfg, base = tiny
    ad = jax.tree.map(lambda x: x + 0.05, lora.init_lora(cfg, jax.random.PRNGKey(2), 4, "attn"))
    toks = _tokens()
    ref, _ = models.forward(cfg, base, toks)
    pol, _ = models.forward(cfg, lora.merge(base, ad, 8.0), toks)
    ref_off, _ = models.forward(cfg, lora.merge(base, None, 8.0), toks)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(ref_off))
    assert float(jnp.max(jnp.abs(ref - pol))) > 1e-4

    def loss(adapters):
        logits, _ = models.forward(cfg, lora.merge(base, adapters, 8.0), toks)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 3])

    g = jax.grad(loss)(ad)
    assert jax.tree.structure(g) == jax.tree.structure(ad)
    assert all(float(jnp.abs(x).sum()) > 0 for x in jax.tree.leaves(g))


def test_sharding_specs_and_errors(tiny):
    cfg, _ = tiny
    ad = lora.init_lora(cfg, jax.random.PRNGKey(1), rank=4, targets="all")
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    sh = lora.shardings(cfg, ad, mesh)
    placed = jax.device_put(ad, sh)
    assert placed["layers"]["mlp"]["up"]["b"].sharding.spec[-1] == "tensor"
    assert lora.num_params(ad) == sum(x.size for x in jax.tree.leaves(ad))
    with pytest.raises(ValueError, match="targets"):
        lora.init_lora(cfg, jax.random.PRNGKey(0), 4, ("qq",))
