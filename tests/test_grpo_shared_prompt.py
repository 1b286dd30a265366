"""GRPO's shared-prompt log-probs (grpo_step.shared_prompt_logprobs): each group's prompt runs
once and its G completions continue from its KV cache. Log-probs, entropies and gradients equal
the row-wise pass on a real sampled batch (stop tokens: rows of different lengths), and the host
layout check refuses every batch the shared path would get wrong."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax import models
from rossjax.sample import generate
from rossjax.train.rl import grpo_step

G, T = 4, 12


@pytest.fixture(scope="module")
def sampled():
    cfg = models.get_preset("tiny_qwen2", vocab_size=64)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    rng = np.random.RandomState(0)
    prompts = [rng.randint(1, 64, n).tolist() for n in (9, 17, 5)]
    gen = generate(cfg, params, prompts, T, temperature=1.0, num_samples=G, seed=0,
                   stop_ids=(3, 5, 7, 11))
    assert len(set(gen.lengths.tolist())) > 2          # rows really end at different lengths
    s = grpo_step.round_up(max(map(len, prompts)) + T, 16)
    return cfg, params, grpo_step.completion_batch(prompts, gen, G, s)


def _both(cfg, params, batch, with_entropy=True, temperature=1.0):
    b = {k: jnp.asarray(batch[k]) for k in grpo_step.BATCH_KEYS}
    row = grpo_step.token_logprobs(cfg, params, b, 8, with_entropy, temperature)
    shared = grpo_step.shared_prompt_logprobs(cfg, params, b, 8, with_entropy, temperature, G, T)
    return row, shared


def test_shared_prompt_logprobs_equal_rowwise(sampled):
    cfg, params, batch = sampled
    assert grpo_step.shared_prompt_ok(batch, G, T)
    m = batch["mask"] > 0
    (lp, ent), (lp2, ent2) = _both(cfg, params, batch, temperature=0.7)
    # float32 forward: the two paths differ only in summation order
    np.testing.assert_allclose(np.where(m, lp2, 0), np.where(m, lp, 0), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.where(m, ent2, 0), np.where(m, ent, 0), atol=2e-5, rtol=1e-5)
    before = np.arange(m.shape[1])[None] < np.argmax(m, axis=1)[:, None]
    assert np.all(np.asarray(lp2)[before] == 0)         # prompt positions: never computed


def test_shared_prompt_gradients_equal_rowwise(sampled):
    cfg, params, batch = sampled
    b = {k: jnp.asarray(batch[k]) for k in grpo_step.BATCH_KEYS}
    w = jnp.asarray(np.random.default_rng(1).normal(size=batch["mask"].shape)) * b["mask"]

    def loss(p, shared):
        lp = (grpo_step.shared_prompt_logprobs(cfg, p, b, 8, False, 1.0, G, T) if shared
              else grpo_step.token_logprobs(cfg, p, b, 8))
        return jnp.sum(lp * w)

    g_row = jax.grad(loss)(params, False)
    g_sh = jax.grad(loss)(params, True)
    for a, c in zip(jax.tree.leaves(g_row), jax.tree.leaves(g_sh)):
        scale = float(jnp.max(jnp.abs(a)))
        np.testing.assert_allclose(np.asarray(c), np.asarray(a), atol=1e-5 * scale + 1e-7)


def test_shared_prompt_layout_check_refuses_other_batches(sampled):
    _, _, batch = sampled
    ok = lambda **ch: grpo_step.shared_prompt_ok({**batch, **ch}, G, T)
    assert ok()
    tok = batch["tokens"].copy()
    tok[1, 0] = (tok[1, 0] + 1) % 64                     # a group's prompts differ
    assert not ok(tokens=tok)
    pos = batch["positions"].copy()
    pos[G + 2, 1] += 1                                   # same tokens, other positions
    assert not ok(positions=pos)
    mask = batch["mask"].copy()
    mask[2] = np.roll(mask[2], 1)                        # a row trains from another position
    assert not ok(mask=mask)
    seg = batch["segment_ids"].copy()
    seg[0, 2:4] = 2                                      # two segments in a row
    assert not ok(segment_ids=seg)
    assert not grpo_step.shared_prompt_ok(batch, G, T + 20)     # no room for the prefix
    assert not grpo_step.shared_prompt_ok(batch, 5, T)          # groups do not divide the rows
    assert not grpo_step.shared_prompt_ok(batch, G, 3)          # blocks longer than max_new + 1
    empty = batch["mask"].copy()
    empty[G:2 * G] = 0                                   # a group with nothing trained is fine
    assert ok(mask=empty)


def test_a_shuffled_minibatch_is_regrouped(sampled):
    """grpo.shuffle_minibatches permutes rows; StepFns._order puts each prompt's rows side by
    side again (the one-micro-batch update is a sum over rows), or refuses when it cannot."""
    import types

    _, _, batch = sampled
    fns = types.SimpleNamespace(group=G, max_new=T)
    perm = np.random.default_rng(0).permutation(len(batch["tokens"]))
    shuffled = {k: v[perm] for k, v in batch.items()}
    shared, order, _ = grpo_step.StepFns._order(fns, shuffled)
    assert shared and order is not None
    assert grpo_step.shared_prompt_ok({k: v[order] for k, v in shuffled.items()}, G, T)
    assert grpo_step.StepFns._order(fns, batch)[:2] == (True, None)       # already grouped
    tok = shuffled["tokens"].copy()
    tok[0, 0] = (tok[0, 0] + 1) % 64                    # a prompt of its own: groups of 3 and 1
    assert grpo_step.StepFns._order(fns, {**shuffled, "tokens": tok})[:2] == (False, None)
    # rows with nothing to train (DAPO's overlong filter zeroes their mask) in two groups: each
    # joins the prompt it starts with, and the regrouped batch keeps the shared layout
    mask = shuffled["mask"].copy()
    gone = [int(np.flatnonzero(perm == r)[0]) for r in (1, G + 2)]
    mask[gone] = 0
    shared, order, host = grpo_step.StepFns._order(fns, {**shuffled, "mask": mask})
    assert shared and grpo_step.shared_prompt_ok(host, G, T)
    groups = {tuple(sorted(perm[order[i:i + G]] // G)) for i in range(0, len(order), G)}
    assert groups == {(g,) * G for g in range(len(order) // G)}


def test_micro_batches_each_get_whole_groups(sampled):
    """With micro-batches the update keeps the shared prompt: StepFns._update_order spreads the
    grouped rows so that split_micro's strided split hands each micro-batch whole groups, and
    falls back to row-wise when the group size does not divide a micro-batch's rows."""
    import types

    from rossjax.train import accumulate

    _, _, batch = sampled                                    # 3 prompts x G rows
    b = len(batch["tokens"])
    perm = np.random.default_rng(1).permutation(b)
    shuffled = {k: v[perm] for k, v in batch.items()}
    fns = types.SimpleNamespace(group=G, max_new=T, n_micro=3)
    fns._order = types.MethodType(grpo_step.StepFns._order, fns)
    shared, order, _ = grpo_step.StepFns._update_order(fns, shuffled)
    assert shared and sorted(order.tolist()) == list(range(b))
    micro = {k: np.asarray(accumulate.split_micro(jnp.asarray(v[order]), 3))
             for k, v in shuffled.items()}
    assert micro["tokens"].shape[:2] == (3, G)
    for m in range(3):
        one = {k: v[m] for k, v in micro.items()}
        assert grpo_step.shared_prompt_ok(one, G, T), m
        assert len({one["tokens"][r, :5].tobytes() for r in range(G)}) == 1   # one prompt each
    fns.n_micro = 2                                           # 6 rows a micro-batch: no
    assert grpo_step.StepFns._update_order(fns, shuffled)[:2] == (False, None)
    fns.n_micro = 1                                           # _order's answer, unchanged
    s1, o1, _ = grpo_step.StepFns._update_order(fns, shuffled)
    assert s1 and np.array_equal(o1, grpo_step.StepFns._order(fns, shuffled)[1])
