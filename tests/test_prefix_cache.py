"""Prefix caching across requests (issue 43 item 5, rossjax.engine.prefix): prompts that share a
long prefix with what a slot's cache holds (a finished sequence's free slot, or a running one's)
reuse it; greedy answers and log-probs are those of the engine without the cache; the tokens
saved are counted; new weights forget the cache; a block-hash match is checked token by token."""

import jax
import numpy as np
import pytest

from rossjax import models
from rossjax.engine import Engine, SamplingParams
from rossjax.engine.prefix import BLOCK, PrefixIndex

SYSTEM = np.random.RandomState(3).randint(1, 250, 40).tolist()     # 2 whole blocks + 8


@pytest.fixture(scope="module")
def tiny():
    cfg = models.get_preset("tiny_qwen2", initializer_range=0.2)
    return cfg, models.init_params(cfg, jax.random.key(1))


def _answers(eng, prompts, sp, together=False, n=1):
    ids = []
    for p in prompts:
        ids.append(eng.submit(p, sp, n=n))
        if not together:
            eng.run()
    eng.run()
    return [[(eng.result(i).tokens, eng.result(i).logprobs) for i in g] for g in ids]


def _check_same(got, want):
    for g, w in zip(got, want):
        for (t, lp), (t0, lp0) in zip(g, w):
            assert t == t0
            np.testing.assert_allclose(lp, lp0, atol=2e-5, rtol=0)


def test_shared_system_prompt_is_reused_and_greedy_answers_are_identical(tiny):
    cfg, params = tiny
    turns = [[7, 8, 9], [11, 3, 5, 200, 6, 1, 2], [9] * 20, [4]]
    prompts = [SYSTEM + t for t in turns] + [SYSTEM[:33]]     # one prompt is the prefix itself
    sp = SamplingParams(max_new_tokens=9)
    want = _answers(Engine(cfg, params, slots=4, max_len=128, chunk=8), prompts, sp)
    eng = Engine(cfg, params, slots=4, max_len=128, chunk=8, prefix_cache=True)
    got = _answers(eng, prompts, sp)
    _check_same(got, want)
    st = eng.prefix_stats
    # the first prompt is prefilled; each later one reuses the system prompt's 2 whole blocks
    assert st["hit_tokens"] == 2 * BLOCK * (len(prompts) - 1)
    assert st["hit_tokens"] + st["computed_tokens"] == sum(map(len, prompts))
    # all at once (a burst of clients), into a fresh engine: admitted in one plan, the first
    # is prefilled and the others fork its slot after that prefill (late forks)
    eng = Engine(cfg, params, slots=4, max_len=128, chunk=8, prefix_cache=True)
    _check_same(_answers(eng, prompts[:4], sp, together=True), want[:4])
    assert eng.prefix_stats["hit_tokens"] == 2 * BLOCK * 3


def test_a_multi_turn_history_reuses_the_last_answer_and_a_live_slot_is_copied(tiny):
    cfg, params = tiny
    sp = SamplingParams(max_new_tokens=12)
    plain = Engine(cfg, params, slots=4, max_len=160, chunk=8)
    eng = Engine(cfg, params, slots=4, max_len=160, chunk=8, prefix_cache=True)
    first = SYSTEM + [5, 5, 5]
    (a0,), = _answers(plain, [first], sp)
    (a1,), = _answers(eng, [first], sp)
    assert a0[0] == a1[0]
    # turn 2: the history (prompt + answer) plus a new user turn: its prefix is in the cache,
    # answer tokens included
    second = first + list(a0[0]) + [9, 8, 7]
    _check_same(_answers(eng, [second], sp), _answers(plain, [second], sp))
    assert eng.prefix_stats["hit_tokens"] >= 3 * BLOCK
    # several requests admitted while the holder still decodes (a held slot: copied, not
    # taken), with n=2 candidates sampled: the same samples as without the cache
    samp = SamplingParams(max_new_tokens=10, temperature=1.0, seed=5)
    hold_p, hold_e = plain.submit(first, sp, hold=True), eng.submit(first, sp, hold=True)
    plain.run(), eng.run()
    prompts = [SYSTEM + [1, 2], SYSTEM + [3]]
    _check_same(_answers(eng, prompts, samp, together=True, n=2),
                _answers(plain, prompts, samp, together=True, n=2))
    assert eng.result(hold_e[0]).tokens == plain.result(hold_p[0]).tokens
    before = eng.prefix_stats["hit_tokens"]
    eng.set_params(params)          # new weights: nothing cached survives
    _answers(eng, [SYSTEM + [2]], sp)
    assert eng.prefix_stats["hit_tokens"] == before


def test_the_index_matches_whole_blocks_and_checks_tokens():
    idx = PrefixIndex()
    idx.set(0, list(range(40)), range(10, 50))
    idx.set(1, list(range(20)) + [99] * 20, range(0, 40))
    m = idx.lookup(list(range(45)))
    assert (m.slot, m.tokens, m.end) == (0, 32, 42)
    assert idx.lookup(list(range(16))) is None          # the last token always runs
    assert idx.lookup(list(range(17))).tokens == 16
    assert idx.lookup([5] * 40) is None
    assert idx.lookup(list(range(45)), exclude={0}).slot == 1
    # a colliding hash (forced here) is caught by the token check
    idx.content[1].hashes = list(idx.content[0].hashes)
    assert idx.lookup(list(range(45)), exclude={0}).tokens == 16
