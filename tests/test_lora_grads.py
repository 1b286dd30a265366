"""LoRA's gradients are the chain rule through W + s A B (issue 30 part 3): against dL/dW of the
plain model at the merged weights (an independent path, no adapters), dL/dB = s A^T dL/dW and
dL/dA = s dL/dW B^T per layer; at b = 0 (init) dL/dA is exactly zero. The trained tree the SFT
step differentiates holds the adapters alone, so the base gets no gradient at all."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax import models
from rossjax.models import lora
from rossjax.train.sft import step as sft

ALPHA, RANK = 8.0, 4


@pytest.fixture(scope="module")
def tiny():
    cfg = models.get_preset("tiny_qwen2", dtype="float32")
    return cfg, models.init_params(cfg, jax.random.PRNGKey(0))


def _loss_of(cfg, toks):
    def loss(params):
        logits, _ = models.forward(cfg, params, toks)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 3])
    return loss


def test_adapter_grads_are_the_chain_rule_of_the_merged_kernel(tiny):
    cfg, base = tiny
    toks = np.random.default_rng(0).integers(0, 256, (2, 9)).astype(np.int32)
    loss = _loss_of(cfg, toks)
    ad = lora.init_lora(cfg, jax.random.PRNGKey(2), RANK, ("q", "down"))
    ad = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(3), x.shape), ad)
    # what the SFT step differentiates: the trained tree (adapters) merged into the frozen base
    g_ad = jax.grad(lambda a: loss(sft._model_params(a, base, ALPHA)))(ad)
    assert jax.tree.structure(g_ad) == jax.tree.structure(ad)  # no base leaf in the gradient
    g_w = jax.grad(loss)(lora.merge(base, ad, ALPHA))  # plain model, no adapters in the graph
    s = ALPHA / RANK
    for mod, name in (("attn", "q"), ("mlp", "down")):
        a = np.asarray(ad["layers"][mod][name]["a"], np.float64)
        b = np.asarray(ad["layers"][mod][name]["b"], np.float64)
        gw = np.asarray(g_w["layers"][mod][name]["kernel"], np.float64)
        n_layers = a.shape[0]
        a2, b2 = a.reshape(n_layers, -1, RANK), b.reshape(n_layers, RANK, -1)
        gw2 = gw.reshape(n_layers, a2.shape[1], b2.shape[2])
        want_b = s * np.einsum("lir,lio->lro", a2, gw2)
        want_a = s * np.einsum("lio,lro->lir", gw2, b2)
        got_b = np.asarray(g_ad["layers"][mod][name]["b"]).reshape(want_b.shape)
        got_a = np.asarray(g_ad["layers"][mod][name]["a"]).reshape(want_a.shape)
        # fp32 sums over the contraction: 1e-5 of the largest entry
        np.testing.assert_allclose(got_b, want_b, rtol=0, atol=1e-5 * np.abs(want_b).max())
        np.testing.assert_allclose(got_a, want_a, rtol=0, atol=1e-5 * np.abs(want_a).max())
        assert np.abs(want_b).max() > 0 and np.abs(want_a).max() > 0


def test_zero_init_b_gives_exactly_zero_grad_to_a_and_nonzero_to_b(tiny):
    cfg, base = tiny
    toks = np.random.default_rng(1).integers(0, 256, (2, 9)).astype(np.int32)
    ad = lora.init_lora(cfg, jax.random.PRNGKey(2), RANK, "all")
    g = jax.grad(lambda a: _loss_of(cfg, toks)(sft._model_params(a, base, ALPHA)))(ad)
    for mod, kernels in g["layers"].items():
        for name, ab in kernels.items():
            assert not np.asarray(ab["a"]).any(), (mod, name)  # s dL/dW B^T with B = 0
            assert np.abs(np.asarray(ab["b"])).max() > 0, (mod, name)
