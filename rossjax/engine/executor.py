"""Execution: a scheduler's plan (rossjax.engine.scheduler) run as the device programs of
rossjax.engine.kv_slots, over the slot state this object owns.

Batches are padded to powers of two (padding rows name slot `slots`, which every program
drops), so a stream of different batch sizes compiles a handful of programs.

Seeds: candidate j of a request with seed s draws from fold_in(key(s), j), token t from
fold_in(that, t): the same request gives the same samples whatever else shares the engine.
"""

from __future__ import annotations

import itertools
import time

import jax
import numpy as np

from rossjax import sharding
from rossjax.engine import kv_slots, stream
from rossjax.engine.scheduler import (
    DecodeBatch,
    ExecutionOutput,
    ExtendBatch,
    ForkBatch,
    PrefillBatch,
    SchedulerOutput,
    pow2,
)
from rossjax.engine.types import MAX_TOP_LOGPROBS, SamplingParams


class Executor:
    """The slot state of one kv_slots.Layout and the params its programs read."""

    def __init__(self, layout: kv_slots.Layout, params):
        self.layout = layout
        self.programs = kv_slots.programs(layout)
        self.params = self.programs.place_params(params)
        self.state = self.programs.new_state()
        # Streaming decodes (plan.decode.stream) hand tokens to listener.sink as they come;
        # one host call per step costs too much on a mesh, where they stay chunk by chunk.
        self.listener = stream.Listener() if layout.partitioner is None else None
        # per slot, how many top log-probs its sequence asked for: a decode computes them (the
        # program with a static k = MAX_TOP_LOGPROBS) only when one of its rows asks
        self.top_n = np.zeros(layout.slots, np.int64)

    def set_params(self, params):
        self.params = self.programs.place_params(params)

    def execute(self, plan: SchedulerOutput) -> ExecutionOutput:
        if plan.stops:
            self.state = dict(self.state, active=self.state["active"].at[
                np.asarray(plan.stops, np.int32)].set(False))
        for b in plan.forks:
            self._fork(b)
        for b in plan.extends:
            self._extend(b)
        for b in plan.prefills:
            self._prefill(b)
        for b in plan.late_forks:
            self._fork(b)
        if plan.decode is None:
            return ExecutionOutput({}, {}, frozenset())
        fresh = bool(plan.extends or plan.prefills or plan.forks)   # first tokens in this decode
        return self._decode(plan.decode, fresh=fresh)

    def _extend(self, b: ExtendBatch):
        e, c = pow2(len(b.slots)), b.length
        tokens = np.zeros((e, c), np.int32)
        valid = np.zeros((e, c), bool)
        slot_idx = np.full((e,), self.layout.slots, np.int32)
        budget = np.zeros((e,), np.int32)
        for i, (slot, ids, left) in enumerate(zip(b.slots, b.token_ids, b.budgets)):
            tokens[i, c - len(ids):], valid[i, c - len(ids):] = ids, True
            slot_idx[i], budget[i] = slot, left
        self.state = self.programs.extend(self.params, self.state, tokens, valid, slot_idx, budget)

    def _prefill(self, b: PrefillBatch):
        n, plen = pow2(len(b.prompts)), b.length
        tokens = np.zeros((n, plen), np.int32)
        positions = np.zeros((n, plen), np.int32)
        valid = np.zeros((n, plen), bool)
        for i, p in enumerate(b.prompts):   # left padding
            tokens[i, plen - len(p):], positions[i, plen - len(p):] = p, np.arange(len(p))
            valid[i, plen - len(p):] = True
        pad = pow2(len(b.slots)) - len(b.slots)
        slot_idx = np.asarray(list(b.slots) + [self.layout.slots] * pad, np.int32)
        src_row = np.asarray(list(b.rows) + [0] * pad, np.int32)
        self._note_top(b.slots, b.sampling)
        self.state = self.programs.insert(self.params, self.state, tokens, positions, valid,
                                          slot_idx, src_row,
                                          self._sampling_columns(b.sampling, b.candidates))

    def _fork(self, b: ForkBatch):
        """Prefix-cache hits: copy each prefix into its slot, then run the rest of its prompt."""
        pad = pow2(len(b.slots)) - len(b.slots)
        col = lambda xs, fill: np.asarray(list(xs) + [fill] * pad, np.int32)
        self._note_top(b.slots, b.sampling)
        self.state = self.programs.fork(
            self.state, col(b.slots, self.layout.slots), col(b.srcs, 0), col(b.ends, 0),
            col(b.n_tokens, 0), self._sampling_columns(b.sampling, b.candidates))
        self._extend(ExtendBatch(b.length, b.slots, b.suffixes, b.budgets))

    def _note_top(self, slots, sampling):
        for slot, sp in zip(slots, sampling):
            self.top_n[slot] = sp.top_logprobs

    def _sampling_columns(self, sampling, candidates) -> dict:
        """Per-slot sampling settings [m] (m = slots padded to a power of two), as insert takes
        them: temp, top_k, top_p, stop [m, n_stop] (-1 = none), key [m, 2], budget."""
        pad = pow2(len(sampling)) - len(sampling)
        stop = np.full((len(sampling) + pad, self.layout.n_stop), -1, np.int32)
        for i, sp in enumerate(sampling):
            stop[i, :len(sp.stop_ids)] = sp.stop_ids
        seeds = [int(sp.seed) % (1 << 64) for sp in sampling] + [0] * pad
        key = np.asarray([[x >> 32, x & 0xFFFFFFFF] for x in seeds], np.uint32)
        # Candidate j's stream: the request seed's key folded with j (threefry; see sampler).
        key = np.asarray(_fold(key, np.asarray(list(candidates) + [0] * pad, np.uint32)))

        def column(field, dtype, fill=0):
            return np.asarray([getattr(sp, field) for sp in sampling] + [fill] * pad, dtype)

        return {"temp": column("temperature", np.float32), "top_k": column("top_k", np.int32),
                "top_p": column("top_p", np.float32, 1.0), "stop": stop, "key": key,
                "budget": column("max_new_tokens", np.int32)}

    def _decode(self, d: DecodeBatch, fresh: bool) -> ExecutionOutput:
        lst = self.listener if d.stream and self.listener is not None else None
        rows = d.rows if d.rows is not None else range(self.layout.slots)
        asked = {slot: int(self.top_n[slot]) for slot in d.slots if self.top_n[slot]}
        top_n = MAX_TOP_LOGPROBS if asked else 0    # one static k: one more program, not 20
        if lst is not None:
            live = set(d.stream)
            lst.begin([int(r) if r in live else -1 for r in rows],
                      [asked.get(int(r), 0) for r in rows])
            # A sequence new in this plan: its first token goes out at step 0; a chunk that
            # ends within the gap anyway makes no call (first call past its last step).
            first = (0 if fresh else lst.gap - 1) if lst.worth(d.steps) else d.steps
            stream_args, t0 = (lst.id, first), time.perf_counter()
        else:
            stream_args = None
        if d.rows is not None:
            idx = np.asarray(d.rows, np.int32)
            self.state, tok, lp, emitted, *top = self.programs.decode_compact(
                self.params, self.state, idx, d.exit_on_free, d.steps, d.mode, stream_args,
                top_n)
            row_of = {int(slot): r for r, slot in enumerate(idx)}
        else:
            self.state, tok, lp, emitted, *top = self.programs.decode(
                self.params, self.state, d.exit_on_free, d.steps, d.mode, stream_args, top_n)
            row_of = {slot: slot for slot in d.slots}
        tok, lp, emitted, active, *top = (sharding.to_host(x) for x in
                                          (tok, lp, emitted, self.state["active"], *top))
        streamed = {}
        if lst is not None:
            if lst.error is not None:
                raise lst.error
            streamed = lst.delivered()
            lst.observe(time.perf_counter() - t0, int(emitted.max(initial=0)))
        tokens, logprobs, tops = {}, {}, {}
        for slot in d.slots:
            r = row_of[slot]
            k = int(emitted[r])
            tokens[slot], logprobs[slot] = tok[r, :k].tolist(), lp[r, :k].tolist()
            if slot in asked:
                tops[slot] = stream.top_pairs(top[0][r, :k], top[1][r, :k], asked[slot])
        return ExecutionOutput(tokens, logprobs,
                               frozenset(slot for slot in d.slots if not active[slot]),
                               {s: streamed.get(s, 0) for s in d.slots}, tops)


def warm(ex: Executor, *, chunk: int, prefill_rows: list, decode_rows: list, modes,
         streams, tops=(0,)) -> int:
    """Run every listed program once on no-op inputs (prefill rows that name no slot, decodes
    with no active row: the state is unchanged), so each compiles now, not under a request.
    prefill_rows: (rows, length) pairs; decode_rows: row counts (the slot count: the whole
    pool, fewer: compacted); tops: 0 and/or MAX_TOP_LOGPROBS (the decode of a batch in which a
    request asked for top log-probs). Returns how many programs ran."""
    lay, n = ex.layout, 0
    if bool(np.asarray(sharding.to_host(ex.state["active"])).any()):
        raise RuntimeError("engine: warm-up runs before the first request, not beside one.")
    for rows, length in prefill_rows:
        ids = np.zeros((rows, length), np.int32)
        settings = ex._sampling_columns([SamplingParams()] * rows, [0] * rows)
        ex.state = ex.programs.insert(ex.params, ex.state, ids, ids, ids.astype(bool),
                                      np.full(rows, lay.slots, np.int32), ids[:, 0], settings)
        n += 1
    for k, mode, streaming, top in itertools.product(decode_rows, modes, streams, tops):
        stream = (ex.listener.id, chunk) if streaming and ex.listener else None
        if streaming and stream is None:
            continue
        if k == lay.slots:
            ex.state = ex.programs.decode(ex.params, ex.state, False, chunk, mode, stream, top)[0]
        else:
            ex.state = ex.programs.decode_compact(ex.params, ex.state, np.arange(k, dtype=np.int32),
                                                  False, chunk, mode, stream, top)[0]
        n += 1
    jax.block_until_ready(ex.state)
    return n


def _fold(keys: np.ndarray, data: np.ndarray):
    return jax.vmap(jax.random.fold_in)(keys, data)
