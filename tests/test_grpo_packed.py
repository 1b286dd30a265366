"""GRPO's packed shared-prompt layout (train/rl/packed_prompt.py): each group's completions packed
into rows after its prompt, each its own document. The plan places every completion token exactly
once; log-probs, entropies and gradients equal the row-wise pass on a real sampled batch (stop
tokens: completions of many lengths), in the dense kernel and in the block-wise one (whose tile
skipping must keep the prompt's tiles), per micro-batch too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax import models
from rossjax.sample import generate
from rossjax.train import accumulate
from rossjax.train.rl import grpo_step, packed_prompt

G, T = 4, 24


@pytest.fixture(scope="module")
def sampled():
    cfg = models.get_preset("tiny_qwen2", vocab_size=64)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    rng = np.random.RandomState(0)
    prompts = [rng.randint(1, 64, n).tolist() for n in (9, 17, 5, 12, 3, 20)]
    gen = generate(cfg, params, prompts, T, temperature=1.0, num_samples=G, seed=0,
                   stop_ids=(3, 5, 7, 11))
    lengths = gen.lengths.tolist()
    assert len(set(lengths)) > 5 and max(lengths) == T and min(lengths) < T // 3
    s = grpo_step.round_up(max(map(len, prompts)) + T, 16)
    batch = grpo_step.completion_batch(prompts, gen, G, s)
    assert grpo_step.shared_prompt_ok(batch, G, T)
    return cfg, params, batch


def _lp(cfg, params, b, packed, with_entropy=True):
    b = {k: jnp.asarray(v) for k, v in b.items()}
    if packed:
        return packed_prompt.logprobs(cfg, params, b, 8, with_entropy, 0.7, G, T)
    return grpo_step.token_logprobs(cfg, params, b, 8, with_entropy, 0.7)


def test_the_plan_places_every_completion_token_once(sampled):
    _, _, batch = sampled
    pk = packed_prompt.plan(batch, G, T)
    b, s = batch["tokens"].shape
    m = batch["mask"] > 0
    rows, cols = pk["pk_row"], pk["pk_col"]
    assert np.all(rows[m] >= 0)                          # every trained position has a slot
    assert len({(int(r), int(c)) for r, c in zip(rows[rows >= 0], cols[rows >= 0])}) == \
        int((rows >= 0).sum())                           # and no slot holds two
    for key in ("tokens", "positions", "targets"):
        assert np.array_equal(pk[f"pk_{key}"][rows[m], cols[m]], batch[key][m])
    # a packed row holds one group's completions only, and fewer slots than one row per completion
    grp = np.broadcast_to(np.arange(b)[:, None] // G, (b, s))
    assert np.array_equal(pk["pk_group"][rows[m]], grp[m])
    assert len(pk["pk_group"]) * (T + 1) <= packed_prompt.MAX_SHARE * b * (T + 1)
    assert [packed_prompt.rows_bucket(x) for x in (3, 9, 33, 58)] == [3, 12, 48, 64]
    assert packed_prompt.rows_bucket(9, floor=16) == 16
    # nothing to gain: without stop tokens every completion is max_new long
    prompts = [[5, 9, 2], [7, 1]]
    gen = generate(sampled[0], sampled[1], prompts, T, temperature=1.0, num_samples=G, seed=0)
    assert packed_prompt.plan(grpo_step.completion_batch(prompts, gen, G, 32), G, T) is None


@pytest.mark.parametrize("kernel", ["dense", "blockwise"])
def test_packed_logprobs_equal_rowwise(sampled, kernel):
    cfg, params, batch = sampled
    # block-wise with 8-slot tiles: a tile of prompt keys holds no key of the packed documents,
    # only the shared prefix, and must not be skipped. Tiles are skipped for all rows at once,
    # so the groups here are those whose prompts (17 and 20 tokens) fill the slots [8, 16).
    pcfg = cfg if kernel == "dense" else cfg.replace(attention_impl="blockwise", attention_block=8)
    if kernel == "blockwise":
        keep = np.r_[G:2 * G, 5 * G:6 * G]
        batch = {k: v[keep] for k, v in batch.items()}
    m = batch["mask"] > 0
    lp, ent = _lp(cfg, params, batch, False)
    lp2, ent2 = _lp(pcfg, params, {**batch, **packed_prompt.plan(batch, G, T)}, True)
    np.testing.assert_allclose(np.where(m, lp2, 0), np.where(m, lp, 0), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.where(m, ent2, 0), np.where(m, ent, 0), atol=2e-5, rtol=1e-5)


def test_packed_gradients_equal_rowwise(sampled):
    # the dense kernel: the block-wise one's backward reads the same mask tiles as its forward
    # (checked above), and its compile under the tests' -O0 took ~25 s on 2 busy cores
    cfg, params, batch = sampled
    full = {**batch, **packed_prompt.plan(batch, G, T)}
    w = jnp.asarray(np.random.default_rng(1).normal(size=batch["mask"].shape)) * batch["mask"]
    loss = lambda p, packed: jnp.sum(_lp(cfg, p, full if packed else batch, packed, False) * w)
    g_row, g_pk = jax.grad(loss)(params, False), jax.grad(loss)(params, True)
    for a, c in zip(jax.tree.leaves(g_row), jax.tree.leaves(g_pk)):
        scale = float(jnp.max(jnp.abs(a)))
        np.testing.assert_allclose(np.asarray(c), np.asarray(a), atol=1e-5 * scale + 1e-7)


def test_each_micro_batch_gets_its_own_packed_rows(sampled):
    cfg, params, batch = sampled
    n = 2
    fed = {k: v[accumulate.block_order(np.arange(len(v)), n)] for k, v in batch.items()}
    pk = packed_prompt.plan(fed, G, T, n_micro=n)
    micro = {k: np.asarray(accumulate.split_micro(jnp.asarray(v), n)) for k, v in {**fed, **pk}.items()}
    for i in range(n):
        one = {k: v[i] for k, v in micro.items()}
        keep = one["mask"] > 0
        lp = _lp(cfg, params, {k: one[k] for k in grpo_step.BATCH_KEYS}, False, False)
        lp2 = _lp(cfg, params, one, True, False)
        np.testing.assert_allclose(np.where(keep, lp2, 0), np.where(keep, lp, 0), atol=2e-5,
                                   rtol=1e-5)


def test_the_packed_update_equals_the_shared_prompt_one(sampled):
    """StepFns on one device packs this batch (grpo.pack_completions) and its update gives the
    same loss, metrics and SGD params as the shared-prompt update with packing off. Two
    micro-batches (each packed on its own) cover the one-micro-batch path's steps too; each
    parameter here cost ~20 s of compiling in CI."""
    micro = 2
    import ml_collections
    import optax

    from rossjax import sharding
    from rossjax.models import shardings as model_shardings
    from rossjax.train import state as state_lib

    cfg, params, batch = sampled
    part = sharding.Partitioner(sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    opt = optax.sgd(0.5)
    p_shard = model_shardings.param_shardings(cfg, part)
    s_shard = state_lib.state_shardings(p_shard, opt, jax.eval_shape(lambda: params), part)
    adv = np.random.default_rng(3).normal(size=len(batch["mask"])).astype(np.float32)
    z = np.zeros_like(batch["sampler_logp"])
    full = {**batch, "adv": adv, "old_logp": z, "ref_logp": z, "is_weights": z}
    outs = []
    for pack in (True, False):
        c = ml_collections.ConfigDict(dict(
            agg="token_mean", beta=0.0, eps_low=0.2, eps_high=0.28, is_mode="none",
            policy_loss="ppo_clip", kl="k3", temperature=0.7, contexts=6, group_size=G,
            num_iterations=1, minibatch=0, minibatches=1, micro_batches=micro,
            pack_completions=pack))
        fns = grpo_step.StepFns(cfg, opt, lambda s: 0.5, partitioner=part, param_shardings=p_shard,
                                state_shardings=s_shard, base_shardings={}, lora_alpha=None,
                                loss_cfg=c, chunk=8, max_new=T)
        put = fns.put_rows(full)
        assert fns.update_inputs(put)[0] == ("packed" if pack else True)
        state = state_lib.init_state(jax.tree.map(jnp.copy, params), opt, s_shard)
        state, m = fns.update(state, {}, put)
        outs.append((jax.device_get(m), jax.device_get(state["params"])))
    (mp, pp), (ms, ps) = outs
    for k in ("loss", "pg_loss", "grad_norm", "entropy", "ratio_mean"):
        np.testing.assert_allclose(mp[k], ms[k], rtol=1e-5, atol=1e-7, err_msg=k)
    assert ms["grad_norm"] > 0
    p0 = jax.device_get(params)
    for a0, a, b_ in zip(jax.tree.leaves(p0), jax.tree.leaves(pp), jax.tree.leaves(ps)):
        d1, d2 = a - a0, b_ - a0
        tol = max(1e-5 * np.abs(d2).max(), 4 * np.finfo(np.float32).eps * np.abs(a0).max())
        np.testing.assert_allclose(d1, d2, rtol=1e-5, atol=tol)
