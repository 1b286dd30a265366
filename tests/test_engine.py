"""The rollout engine: continuous batching over KV-cache slots, shared prefills, hold/extend for
multi-turn rollouts, per-request seeds, stop tokens, bad requests."""

import jax
import numpy as np
import pytest

from rossjax import models
from rossjax.engine import Engine, SamplingParams, kv_slots
from rossjax.sample import generate


@pytest.fixture(scope="module")
def tiny():
    cfg = models.get_preset("tiny_qwen2", initializer_range=0.2)
    params = models.init_params(cfg, jax.random.key(1))
    rng = np.random.RandomState(0)
    prompts = [rng.randint(1, cfg.vocab_size, n).tolist() for n in (3, 9, 20, 5, 1, 14)]
    return cfg, params, prompts


def _drain(eng):
    steps = 0
    while eng.busy:
        eng.step()
        steps += 1
    return steps


def test_more_requests_than_slots_all_finish_equal_to_one_at_a_time(tiny):
    """6 greedy requests of different lengths and budgets through 2 slots: each equals its
    own single-request run (no leak between occupants of a slot), and slots hand over."""
    cfg, params, prompts = tiny
    budgets = [3, 7, 2, 5, 6, 4]
    eng = Engine(cfg, params, slots=2, max_len=64, chunk=4)
    ids = [eng.submit(p, SamplingParams(max_new_tokens=b))[0] for p, b in zip(prompts, budgets)]
    seen_running = []
    while eng.busy:
        eng.step()
        seen_running.append(sum(s.state == "running" for s in eng.seqs.values()))
    assert max(seen_running) <= 2 and len(eng.free) == 2
    one = Engine(cfg, params, slots=1, max_len=64, chunk=4)   # one request at a time
    for sid, p, b in zip(ids, prompts, budgets):
        s, ref = eng.result(sid), one.result(one.submit(p, SamplingParams(max_new_tokens=b))[0])
        _drain(one)
        assert s.tokens == ref.tokens and s.finish_reason == "length" and len(s.tokens) == b
        np.testing.assert_allclose(s.logprobs, ref.logprobs, atol=1e-5, rtol=0)


def test_finished_sequence_frees_its_slot_at_once(tiny):
    """With a request waiting, the decode chunk returns right after the step that ended a
    sequence, and the waiting request is admitted on the next step."""
    cfg, params, prompts = tiny
    eng = Engine(cfg, params, slots=1, max_len=64, chunk=16)
    a = eng.submit(prompts[0], SamplingParams(max_new_tokens=2))[0]
    b = eng.submit(prompts[1], SamplingParams(max_new_tokens=2))[0]
    ups = eng.step()
    assert [(u.seq_id, len(u.tokens), u.finished) for u in ups] == [(a, 2, True)]
    assert eng.seqs[b].state == "waiting" and eng.free == [0]
    ups = eng.step()
    assert [(u.seq_id, len(u.tokens), u.finished) for u in ups] == [(b, 2, True)]


def test_candidates_share_one_prefill_and_seeds_ignore_neighbours(tiny):
    cfg, params, prompts = tiny
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)
    alone = Engine(cfg, params, slots=4, max_len=64)
    ids = alone.submit(prompts[2], sp, n=4)
    _drain(alone)
    # the same request beside others (another slot order) draws the same samples
    crowd = Engine(cfg, params, slots=8, max_len=64)
    crowd.submit(prompts[0], SamplingParams(max_new_tokens=3, temperature=0.7, top_k=5, seed=1), n=3)
    ids2 = crowd.submit(prompts[2], sp, n=4)
    _drain(crowd)
    got = [alone.result(i).tokens for i in ids]
    assert got == [crowd.result(i).tokens for i in ids2]
    assert len({tuple(t) for t in got}) > 1          # candidates diverge


def test_extend_continues_without_reprefill_like_a_fresh_prompt(tiny):
    """Multi-turn: a held sequence takes an observation and decodes on; greedy output equals
    generating from the whole history as one prompt."""
    cfg, params, prompts = tiny
    eng = Engine(cfg, params, slots=2, max_len=128)
    sid = eng.submit(prompts[1], SamplingParams(max_new_tokens=4), hold=True)[0]
    _drain(eng)
    s = eng.result(sid)
    assert s.state == "held" and 0 not in eng.free
    turn1 = list(s.tokens)
    obs = [7, 8, 9, 10, 11]
    eng.extend(sid, obs, max_new_tokens=5)
    _drain(eng)
    turn2 = s.tokens[len(turn1):]
    ref = generate(cfg, params, [prompts[1] + turn1 + obs], 5)
    assert turn2 == ref.tokens[0].tolist()
    eng.release(sid)
    assert sorted(eng.free) == [0, 1]


def test_stop_tokens_and_cancel(tiny):
    cfg, params, prompts = tiny
    greedy = generate(cfg, params, [prompts[3]], 8).tokens[0].tolist()
    stop = greedy[2]
    eng = Engine(cfg, params, slots=2, max_len=64)
    a = eng.submit(prompts[3], SamplingParams(max_new_tokens=8, stop_ids=(stop,)))[0]
    b = eng.submit(prompts[4], SamplingParams(max_new_tokens=40))[0]
    eng.step()
    eng.cancel(b)
    _drain(eng)
    ra = eng.result(a)
    assert ra.tokens == greedy[:greedy.index(stop) + 1] and ra.finish_reason == "stop"
    assert eng.result(b).finish_reason == "cancelled" and sorted(eng.free) == [0, 1]


def test_bad_requests_say_what_is_wrong(tiny):
    cfg, params, _ = tiny
    eng = Engine(cfg, params, slots=2, max_len=32)
    with pytest.raises(ValueError, match="prompt is empty"):
        eng.submit([], SamplingParams())
    with pytest.raises(ValueError, match="outside"):
        eng.submit([1, cfg.vocab_size], SamplingParams())
    with pytest.raises(ValueError, match="cache columns"):
        eng.submit([1, 2], SamplingParams(max_new_tokens=40))
    with pytest.raises(ValueError, match="'n'"):
        eng.submit([1, 2], SamplingParams(), n=3)
    with pytest.raises(ValueError, match="top_p"):
        eng.submit([1, 2], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="stop ids"):
        eng.submit([1, 2], SamplingParams(stop_ids=tuple(range(9))))
    sid = eng.submit([1, 2], SamplingParams(max_new_tokens=2))[0]
    with pytest.raises(ValueError, match="only a finished sequence"):
        eng.extend(sid, [3])
    with pytest.raises(ValueError, match="no sequence"):
        eng.extend(12345, [3])


def test_decode_runs_in_the_model_dtype():
    """A bf16 model decodes with a bf16 slot cache (the loop carries it, nothing upcasts)."""
    cfg = models.get_preset("tiny_qwen2", dtype="bfloat16")
    params = models.init_params(cfg, jax.random.key(0))
    lay = kv_slots.Layout(cfg, 2, 32, 1)
    state = kv_slots.init_state(lay)
    jaxpr = jax.make_jaxpr(lambda p, s: kv_slots.decode(lay, p, s, False, steps=4, mode="plain"))(
        models.decode_params(cfg, params), state)
    loop = next(e for e in jaxpr.eqns if e.primitive.name == "while")
    caches = [v.aval for v in loop.outvars if v.aval.ndim >= 3 and v.aval.shape[-1] == cfg.head_dim]
    assert caches and all(a.dtype == jax.numpy.bfloat16 for a in caches)


def test_on_policy_grpo_skips_the_old_policy_pass_and_updates_alike(tmp_path, monkeypatch):
    """One minibatch, one iteration: the update's own forward stands in for the old-policy
    log-probs (ratio exactly 1), with TIS still against the sampler's log-probs; the params,
    loss, gradient norm, entropy and IS metrics equal a run that computes them separately."""
    from test_grpo import tiny_config

    from rossjax.monitor import read_metrics
    from rossjax.train import grpo, grpo_step

    calls = []
    real = grpo_step.StepFns.logp  # the separate old-policy (and reference) pass
    monkeypatch.setattr(grpo_step.StepFns, "logp",
                        lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    runs = {}
    for name in ("skip", "separate"):
        c = tiny_config(steps=1, contexts=4, group=4, new=16)
        c.grpo.is_mode, c.grpo.is_how = "token", "truncate"
        c.optim.eps = 1e-3   # Adam's g / sqrt(v) would turn rounding noise of ~0 grads into +-lr
        if name == "separate":
            # a different compiled-step key with the same maths (one minibatch: order only)
            c.grpo.shuffle_minibatches = False
            monkeypatch.setattr(grpo_step, "on_policy", lambda g: False)
        calls.clear()
        out = grpo.run(c, str(tmp_path / name))
        runs[name] = (read_metrics(str(tmp_path / name))[-1], len(calls),
                      [np.asarray(x) for x in jax.tree.leaves(out["state"]["params"])])
    (m1, n1, p1), (m2, n2, p2) = runs["skip"], runs["separate"]
    assert n1 == 0 and n2 > 0          # the skipped pass never even ran
    assert m1["ratio_mean"] == 1.0 and m1["grad_norm"] > 0
    for k in ("loss", "pg_loss", "grad_norm", "entropy", "is_weight_mean", "is_outside_frac",
              "clip_frac_low", "clip_frac_high"):
        np.testing.assert_allclose(m1[k], m2[k], rtol=1e-5, atol=1e-7, err_msg=k)
    for a, b in zip(p1, p2):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_bench_grpo_peer_trl_smoke(capsys):
    """`rossjax bench grpo --peer trl` runs both trainers on the same tiny work (no timing
    asserted; TRL is the [bench] extra)."""
    pytest.importorskip("trl")
    from rossjax.bench.grpo import main

    assert main(["--peer", "trl", "--preset", "tiny_qwen2", "--contexts", "2", "--group", "2",
                 "--new_tokens", "4", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "rossjax grpo" in out and "TRL GRPOTrainer" in out and "ratio" in out


def test_a_mostly_idle_pool_decodes_only_its_running_slots(tiny):
    """16 slots, 3 sequences: the chunk runs on 8 gathered rows (compaction) and gives the same
    tokens and log-probs as a pool the sequences fill."""
    cfg, params, prompts = tiny
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, seed=2)
    big = Engine(cfg, params, slots=16, max_len=64, chunk=4)
    ids = [big.submit(p, sp)[0] for p in prompts[:3]]
    big.step()
    assert any(k[0] == "compact" for k in big.progs._decode)
    _drain(big)
    full = Engine(cfg, params, slots=3, max_len=64, chunk=4)
    ids2 = [full.submit(p, sp)[0] for p in prompts[:3]]
    _drain(full)
    for a, b in zip(ids, ids2):
        assert big.result(a).tokens == full.result(b).tokens
        np.testing.assert_allclose(big.result(a).logprobs, full.result(b).logprobs, atol=1e-5, rtol=0)
