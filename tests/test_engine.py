"""The rollout engine: the scheduler on host state alone (a fake device, nothing compiled), then
the compiled engine: continuous batching over several slots equal to each request alone, shared
prefills, hold/extend for multi-turn rollouts, per-request seeds, stop tokens, bad requests."""

import jax
import numpy as np
import pytest

from rossjax import models
from rossjax.engine import (
    Engine,
    ExecutionOutput,
    FinishReason,
    SamplingParams,
    Scheduler,
    SlotPool,
    Status,
    kv_slots,
)
from rossjax.errors import InputError
from rossjax.sample import generate


@pytest.fixture(scope="module")
def tiny():
    cfg = models.get_preset("tiny_qwen2", initializer_range=0.2)
    params = models.init_params(cfg, jax.random.key(1))
    rng = np.random.RandomState(0)
    prompts = [rng.randint(1, cfg.vocab_size, n).tolist() for n in (3, 9, 20, 5, 1, 14)]
    return cfg, params, prompts


# -- the scheduler, on a fake device ---------------------------------------------------------
class FakeDevice:
    """Runs a plan on host as kv_slots' programs do: a slot prefilled with prompt p emits
    p[0] * 100, p[0] * 100 + 1, ...; its budget or a stop id ends it; with exit_on_free the
    decode returns after the step that ended one."""

    def __init__(self):
        self.rows = {}

    def execute(self, plan):
        for slot in plan.stops:
            self.rows[slot]["active"] = False
        for b in plan.extends:
            for slot, budget in zip(b.slots, b.budgets):
                self.rows[slot].update(active=True, budget=budget)
        for b in plan.prefills:
            for slot, row, sp in zip(b.slots, b.rows, b.sampling):
                self.rows[slot] = {"next": b.prompts[row][0] * 100, "budget": sp.max_new_tokens,
                                   "stop": sp.stop_ids, "active": True}
        d = plan.decode
        toks = {} if d is None else {s: [] for s in d.slots}
        finished = set()
        for _ in range(0 if d is None else d.steps):
            live = [s for s in d.slots if self.rows[s]["active"]]
            for s in live:
                r = self.rows[s]
                t, r["next"], r["budget"] = r["next"], r["next"] + 1, r["budget"] - 1
                toks[s].append(t)
                if t in r["stop"] or r["budget"] <= 0:
                    r["active"] = False
                    finished.add(s)
            if not live or (d.exit_on_free and finished):
                break
        return ExecutionOutput(toks, {s: [0.0] * len(t) for s, t in toks.items()},
                               frozenset(finished))


def _sched(slots=2, **kw):
    return Scheduler(slots=slots, max_len=kw.pop("max_len", 64), n_stop=2, vocab_size=10_000,
                     chunk=kw.pop("chunk", 8), **kw)


def _step(sched, dev):
    plan = sched.schedule()
    return plan, sched.update(plan, dev.execute(plan))


def test_scheduler_admits_waiting_requests_as_slots_free_fifo_all_or_none():
    """2 slots; a (2 tokens) and b (5) start; d (n=2) waits for two free slots and c, behind
    it, does not overtake; each decode returns when a sequence ends while others wait."""
    sched, dev = _sched(), FakeDevice()
    a, b = (sched.submit([p], SamplingParams(max_new_tokens=m))[0] for p, m in ((1, 2), (2, 5)))
    d = sched.submit([4], SamplingParams(max_new_tokens=2), n=2)
    c = sched.submit([3], SamplingParams(max_new_tokens=1))[0]

    plan, ups = _step(sched, dev)
    assert [(p.prompts, p.slots) for p in plan.prefills] == [([[1], [2]], [0, 1])]
    assert plan.decode.exit_on_free and plan.decode.slots == [0, 1]
    assert [(u.seq_id, u.tokens, u.finished) for u in ups] == [(a, [100, 101], True),
                                                              (b, [200, 201], False)]
    assert sched.pool.n_free == 1 and sched.result(d[0]).status is Status.WAITING

    plan, ups = _step(sched, dev)        # one slot free: d needs two, c waits behind d
    assert plan.prefills == [] and plan.decode.slots == [1]
    assert [(u.seq_id, u.tokens, u.finished) for u in ups] == [(b, [202, 203, 204], True)]

    plan, ups = _step(sched, dev)
    assert [(p.prompts, p.slots, p.rows) for p in plan.prefills] == [([[4]], [0, 1], [0, 0])]
    assert [u.seq_id for u in ups] == d and sched.result(c).status is Status.WAITING
    plan, ups = _step(sched, dev)
    assert plan.prefills[0].prompts == [[3]] and not plan.decode.exit_on_free
    assert not sched.busy and sched.pool.n_free == 2
    assert [sched.result(i).finish_reason for i in (a, b, *d, c)] == [FinishReason.LENGTH] * 5
    assert sched.result(b).tokens == (200, 201, 202, 203, 204)


def test_prefills_run_in_power_of_two_groups_within_the_token_cap():
    """11 prompts of one bucket prefill as 8 + 2 + 1 rows (no padded rows), a request's n
    candidates stay with their prompt, and a group holds at most PREFILL_TOKENS tokens; each
    slot still takes its own prompt's first tokens (the fake device reads rows per group)."""
    from rossjax.engine import scheduler as sch

    sched, dev = _sched(slots=16, prefill_tokens=sch.PREFILL_TOKENS), FakeDevice()
    ids = [sched.submit([i + 1] * 10, SamplingParams(max_new_tokens=1), n=2 if i == 9 else 1)
           for i in range(11)]
    plan, ups = _step(sched, dev)
    assert [(len(b.prompts), b.length) for b in plan.prefills] == [(8, 16), (2, 16), (1, 16)]
    assert plan.prefills[1].rows == [0, 1, 1] and len(plan.prefills[1].slots) == 3
    assert {u.seq_id: u.tokens[0] for u in ups} == {
        sid: (i + 1) * 100 for i, seq in enumerate(ids) for sid in seq}
    assert [len(g) for g in sch.prefill_groups(list(range(11)), 16, 64)] == [4, 4, 2, 1]
    assert [len(g) for g in sch.prefill_groups(list(range(3)), 512, 64)] == [1, 1, 1]
    assert [len(g) for g in sch.prefill_groups(list(range(40)), 512)] == [32, 8]   # no cap


def test_scheduler_finish_reasons_stop_length_eos_cancelled():
    sched, dev = _sched(slots=4), FakeDevice()
    eos = 601
    stop = sched.submit([5], SamplingParams(max_new_tokens=9, stop_ids=(502,)))[0]
    end = sched.submit([6], SamplingParams(max_new_tokens=9, stop_ids=(eos,)))[0]
    length = sched.submit([7], SamplingParams(max_new_tokens=2, stop_ids=(999,)))[0]
    running = sched.submit([8], SamplingParams(max_new_tokens=40))[0]
    waiting = sched.submit([9], SamplingParams(max_new_tokens=2), n=4)[0]
    _step(sched, dev)                      # 2 steps: `end` and `length` finish
    assert sched.pool.n_free == 2
    sched.cancel(running)
    sched.cancel(waiting)
    assert sched.pool.n_free == 3          # a cancelled slot frees at once ...
    plan, _ = _step(sched, dev)
    assert plan.stops == [3]               # ... and its device row stops before anything else
    while sched.busy:
        _step(sched, dev)
    got = {i: (sched.result(i).finish_reason, sched.result(i).tokens)
           for i in (stop, end, length)}
    assert got == {stop: ("stop", (500, 501, 502)), end: ("stop", (600, 601)),
                   length: ("length", (700, 701))}
    assert sched.result(running).finish_reason is FinishReason.CANCELLED
    assert sched.result(waiting).status is Status.DONE and sched.pool.n_free == 4


def test_scheduler_hold_extend_release():
    """A held sequence keeps its slot; extend queues its tokens (cache columns move by the
    bucketed length); release frees it; releasing a live sequence cancels it first."""
    sched, dev = _sched(), FakeDevice()
    sid = sched.submit([1, 2, 3], SamplingParams(max_new_tokens=2), hold=True)[0]
    while sched.busy:
        _step(sched, dev)
    r = sched.result(sid)
    assert r.status is Status.HELD and r.cache_used == 16 + 2 and sched.pool.n_free == 1
    sched.extend(sid, [7, 8], max_new_tokens=3)
    plan, ups = _step(sched, dev)
    assert [(e.slots, e.token_ids, e.budgets, e.length) for e in plan.extends] == \
        [([0], [[7, 8]], [3], 16)]
    assert ups[0].tokens == [102, 103, 104] and sched.result(sid).cache_used == 18 + 16 + 3
    sched.release(sid)
    assert sched.pool.n_free == 2
    live = sched.submit([4], SamplingParams(max_new_tokens=30))[0]
    _step(sched, dev)
    sched.release(live)
    # slot 1: the released slot 0 went to the back of the free line
    assert sched.pool.n_free == 2 and sched.schedule().stops == [1]


def test_scheduler_refuses_what_cannot_fit_in_one_sentence():
    sched = _sched(max_len=64)
    with pytest.raises(InputError) as e:
        sched.submit(list(range(1, 40)), SamplingParams(max_new_tokens=10))
    msg = str(e.value)
    assert msg == ("engine: the request needs 74 cache columns (bucketed length + max_new_tokens) "
                   "but slots hold 64 (field 'max_len').")
    assert msg.count(". ") == 0 and not sched.busy


def test_scheduler_compacts_a_mostly_idle_pool():
    """16 slots, 3 running: the decode gathers 8 rows (running first, then idle); unsharded
    only, and never when most slots run; with min_rows=1 (a server) 1 running row is 1 row
    and 3 are 4."""
    for compact, n, want, floor in ((True, 3, [0, 1, 2, 3, 4, 5, 6, 7], 8), (False, 3, None, 8),
                                    (True, 9, None, 8), (True, 1, [0], 1),
                                    (True, 3, [0, 1, 2, 3], 1)):
        sched = _sched(slots=16, compact=compact, min_rows=floor)
        for p in range(1, n + 1):
            sched.submit([p], SamplingParams(max_new_tokens=4))
        assert sched.schedule().decode.rows == want


def test_slot_pool_allocates_all_or_none_and_refuses_a_double_free():
    pool = SlotPool(3)
    assert pool.allocate(2) == [0, 1] and pool.allocate(2) is None and pool.n_free == 1
    pool.free([1])
    assert pool.free_slots() == [2, 1]
    with pytest.raises(ValueError, match="slot 1 is not an allocated slot"):
        pool.free([1])
    with pytest.raises(ValueError, match="slot 7"):
        pool.free([7])


# -- the compiled engine ---------------------------------------------------------------------
def _drain(eng):
    steps = 0
    while eng.busy:
        eng.step()
        steps += 1
    return steps


def test_continuous_batching_three_slots_equals_each_request_alone(tiny):
    """5 greedy requests of different lengths and budgets through 3 slots: each equals its
    run alone (no leak between occupants of a slot); while requests wait, a decode returns
    right after the step that ended a sequence (every running one emitted as many tokens),
    and the freed slot is prefilled on the next step."""
    cfg, params, prompts = tiny
    budgets = [2, 9, 5, 7, 3]
    eng = Engine(cfg, params, slots=3, max_len=64, chunk=16)
    ids = [eng.submit(p, SamplingParams(max_new_tokens=b))[0] for p, b in zip(prompts, budgets)]
    admitted_late = 0
    while eng.busy:
        plan = eng.scheduler.schedule()
        admitted = {slot for p in plan.prefills for slot in p.slots}
        admitted_late += bool(admitted and set(plan.decode.slots) - admitted)
        ups = eng.scheduler.update(plan, eng.executor.execute(plan))
        assert eng.count(Status.RUNNING) + eng.free_slots == 3
        if plan.decode.exit_on_free:
            assert any(u.finished for u in ups)
            assert len({len(u.tokens) for u in ups}) == 1, [(u.seq_id, u.tokens) for u in ups]
    assert admitted_late == 2 and eng.free_slots == 3
    alone = Engine(cfg, params, slots=3, max_len=64, chunk=16)   # same programs, one at a time
    for sid, p, b in zip(ids, prompts, budgets):
        ref = alone.submit(p, SamplingParams(max_new_tokens=b))[0]
        _drain(alone)
        s, r = eng.result(sid), alone.result(ref)
        assert s.tokens == r.tokens and len(s.tokens) == b and s.finish_reason == "length"
        np.testing.assert_allclose(s.logprobs, r.logprobs, atol=1e-5, rtol=0)


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
    assert len(set(got)) > 1          # candidates diverge


def test_warmup_compiles_what_a_load_meets_and_changes_nothing(tiny):
    """A server-like engine (min_rows=1) warmed up: a burst of prompts of three lengths, then
    stragglers, greedy and sampled, streamed and not, some asking for top log-probs, compiles
    no further program, and every answer equals a cold engine's."""
    cfg, params, prompts = tiny
    load = [(p, SamplingParams(max_new_tokens=3 + i, temperature=0.0 if i % 2 else 1.0, seed=i,
                               top_logprobs=2 if i % 4 == 1 else 0))
            for i, p in enumerate(prompts * 2)]

    def run(eng):
        eng.stream_to(lambda by_seq: False, 0.0)
        ids = [eng.submit(p, sp, stream=i % 3 == 0) for i, (p, sp) in enumerate(load[:7])]
        eng.step()
        ids += [eng.submit(p, sp) for p, sp in load[7:]]
        _drain(eng)
        return [eng.result(i[0]).tokens for i in ids]

    warm = Engine(cfg, params, slots=4, max_len=48, chunk=4, min_rows=1)
    assert warm.warmup() > 10
    progs = warm.executor.programs
    jitted = lambda: [f._cache_size() for f in (progs._insert, *progs._decode.values())]
    before = (len(progs._decode), jitted())
    got = run(warm)
    assert (len(progs._decode), jitted()) == before
    cold = Engine(cfg, params, slots=4, max_len=48, chunk=4, min_rows=1)
    assert got == run(cold) and all(got)
    cold.submit(prompts[0], SamplingParams(max_new_tokens=20))
    cold.step()
    with pytest.raises(RuntimeError, match="before the first request"):
        cold.warmup()


def test_extend_continues_without_reprefill_like_a_fresh_prompt(tiny):
    """Multi-turn: a held sequence takes an observation and decodes on; greedy output equals
    generating from the whole history as one prompt."""
    cfg, params, prompts = tiny
    eng = Engine(cfg, params, slots=2, max_len=128)
    sid = eng.submit(prompts[1], SamplingParams(max_new_tokens=4), hold=True)[0]
    _drain(eng)
    s = eng.result(sid)
    assert s.status is Status.HELD and eng.free_slots == 1
    turn1 = list(s.tokens)
    obs = [7, 8, 9, 10, 11]
    eng.extend(sid, obs, max_new_tokens=5)
    _drain(eng)
    turn2 = list(eng.result(sid).tokens[len(turn1):])
    ref = generate(cfg, params, [prompts[1] + turn1 + obs], 5)
    assert turn2 == ref.tokens[0].tolist()
    eng.release(sid)
    assert eng.free_slots == 2


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
    assert list(ra.tokens) == greedy[:greedy.index(stop) + 1] and ra.finish_reason == "stop"
    assert eng.result(b).finish_reason is FinishReason.CANCELLED and eng.free_slots == 2


def test_bad_requests_say_what_is_wrong(tiny):
    cfg, params, _ = tiny
    eng = Engine(cfg, params, slots=2, max_len=32)
    assert (eng.slots, eng.max_len, eng.max_stop_ids, eng.free_slots) == (2, 32, 4, 2)
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
    layout = kv_slots.Layout(cfg, 2, 32, 1)
    state = kv_slots.init_state(layout)
    jaxpr = jax.make_jaxpr(lambda p, s: kv_slots.decode(layout, p, s, False, steps=4,
                                                        mode="plain"))(
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
    from rossjax.train.rl import grpo, grpo_step

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
    plan = big.scheduler.schedule()
    assert len(plan.decode.rows) == 8          # gathered rows, not all 16
    big.scheduler.update(plan, big.executor.execute(plan))
    _drain(big)
    full = Engine(cfg, params, slots=3, max_len=64, chunk=4)
    ids2 = [full.submit(p, sp)[0] for p in prompts[:3]]
    _drain(full)
    for a, b in zip(ids, ids2):
        assert big.result(a).tokens == full.result(b).tokens
        np.testing.assert_allclose(big.result(a).logprobs, full.result(b).logprobs, atol=1e-5, rtol=0)
