"""The host half of the engine: requests, sequences, slot assignment and continuous batching.

    eng = Engine(cfg, params, slots=16, max_len=512)
    ids = eng.submit(prompt_ids, SamplingParams(max_new_tokens=64, temperature=1.0, seed=3), n=8)
    while eng.busy:
        for u in eng.step():          # Update(seq_id, tokens, logprobs, finished, finish_reason)
            ...

A request's `n` candidates share one prefill and take n slots together (it waits until n are
free). Between decode chunks the scheduler runs pending extensions, admits waiting requests
into free slots (FIFO; one prefill per prompt-length bucket), then decodes up to `chunk` steps
in one jitted loop; when requests are waiting, the loop returns right after the step that ended
a sequence, whose slot is free at once (or kept, for a `hold=True` request, until `release`, so
a multi-turn rollout can `extend(seq_id, observation_ids)` it without a new prefill).

Seeds: candidate j of a request with seed s draws from fold_in(key(s), j), token t from
fold_in(that, t): the same request gives the same samples whatever else shares the engine.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Sequence as Seq

import jax
import numpy as np

from rossjax import sharding
from rossjax.engine import kv_slots, sampler
from rossjax.errors import ConfigError, InputError

# Prompt (and extension) lengths round up to one of these, then to multiples of 512, so a stream
# of different lengths compiles a handful of programs, not one per length.
BUCKETS = (16, 32, 64, 128, 256, 512)


def bucket_length(n: int) -> int:
    for b in BUCKETS:
        if n <= b:
            return b
    return -(-n // 512) * 512


# Below this many running sequences a decode chunk is not compacted further.
_MIN_COMPACT = 8


def _single_device(part):
    """None for a partitioner whose mesh is the default device alone (a one-device trainer):
    sharding there is a no-op, and the unsharded layout is the fast one on CPU (per-layer cache
    and decode_params weights, compaction); measured 3x faster sampling for `rossjax grpo` with
    mesh.num_devices = 1. Any other mesh keeps its shardings."""
    if part is not None and part.mesh.devices.size == 1 and \
            part.mesh.devices.flat[0] == jax.devices()[0]:
        return None
    return part


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 0.0          # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                    # 0 = off
    stop_ids: tuple = ()
    seed: int = 0

    def check(self, where: str = "engine"):
        if self.max_new_tokens < 1:
            raise ConfigError(f"{where}: field 'max_new_tokens' must be >= 1.")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ConfigError(f"{where}: need temperature >= 0, 0 < top_p <= 1 and top_k >= 0.")


@dataclasses.dataclass
class Update:
    seq_id: int
    tokens: list
    logprobs: list
    finished: bool
    finish_reason: str | None       # "stop" | "length" | "cancelled" once finished


@dataclasses.dataclass
class _Seq:
    id: int
    sp: SamplingParams
    sub: int                        # candidate index within its request
    hold: bool
    state: str = "waiting"          # waiting | running | held | done
    slot: int = -1
    col: int = 0                    # host mirror of the slot's next cache column
    budget: int = 0
    tokens: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)
    finish_reason: str | None = None


@dataclasses.dataclass
class _Request:
    prompt: list
    seqs: list


class Engine:
    """Continuous batching over `slots` KV-cache rows of `max_len` columns each."""

    def __init__(self, cfg, params, *, slots: int = 8, max_len: int = 1024, partitioner=None,
                 n_stop: int = 4, chunk: int = 32):
        part = _single_device(sharding.as_partitioner(partitioner))
        mult = 1 if part is None else part.batch_size_multiple()
        if slots < 1 or slots % mult:
            raise ConfigError(f"engine: field 'slots' ({slots}) must be a positive multiple of the "
                              f"mesh's batch shards ({mult}).")
        self.cfg, self.chunk = cfg, int(chunk)
        self.lay = kv_slots.Layout(cfg, int(slots), int(max_len), int(n_stop), part)
        self.progs = kv_slots.programs(self.lay)
        self.params = self.progs.place_params(params)
        self.state = self.progs.new_state()
        self.free = list(range(slots))
        self.seqs: dict[int, _Seq] = {}
        self.waiting: deque[_Request] = deque()
        self.pending_ext: list = []                 # (seq, token ids, budget)
        self._ids = itertools.count()

    def set_params(self, params):
        """New weights (a GRPO step); live sequences continue under them."""
        self.params = self.progs.place_params(params)

    # -- requests --------------------------------------------------------------------------
    def _check_tokens(self, ids: Seq[int], what: str) -> list[int]:
        ids = [int(t) for t in ids]
        if not ids:
            raise InputError(f"engine: {what} is empty; it needs at least one token.")
        if min(ids) < 0 or max(ids) >= self.cfg.vocab_size:
            raise InputError(f"engine: {what} holds a token id outside [0, {self.cfg.vocab_size}).")
        return ids

    def _check_sp(self, sp: SamplingParams, need_cols: int, what: str):
        sp.check()
        if len(sp.stop_ids) > self.lay.n_stop:
            raise ConfigError(f"engine: {what} has {len(sp.stop_ids)} stop ids; this engine takes "
                              f"at most {self.lay.n_stop} (field 'n_stop').")
        if need_cols > self.lay.max_len:
            raise InputError(f"engine: {what} needs {need_cols} cache columns (bucketed length + "
                             f"max_new_tokens) but slots hold {self.lay.max_len} (field 'max_len').")

    def submit(self, prompt: Seq[int], sp: SamplingParams, n: int = 1, hold: bool = False) -> list[int]:
        """Queue `n` candidates of one prompt; returns their sequence ids."""
        prompt = self._check_tokens(prompt, "the prompt")
        if not 1 <= n <= self.lay.slots:
            raise ConfigError(f"engine: field 'n' ({n}) must be in [1, slots={self.lay.slots}].")
        self._check_sp(sp, bucket_length(len(prompt)) + sp.max_new_tokens, "the request")
        seqs = [_Seq(next(self._ids), sp, j, hold) for j in range(n)]
        for s in seqs:
            self.seqs[s.id] = s
        self.waiting.append(_Request(prompt, seqs))
        return [s.id for s in seqs]

    def extend(self, seq_id: int, token_ids: Seq[int], max_new_tokens: int | None = None):
        """Append tokens (e.g. a tool observation) to a held sequence and let it decode again
        (up to `max_new_tokens`, default its request's) from where its cache ends."""
        s = self._seq(seq_id)
        if s.state != "held":
            raise InputError(f"engine: sequence {seq_id} is {s.state}; only a finished sequence of "
                             f"a hold=True request can be extended.")
        ids = self._check_tokens(token_ids, f"the extension of sequence {seq_id}")
        budget = int(max_new_tokens or s.sp.max_new_tokens)
        self._check_sp(dataclasses.replace(s.sp, max_new_tokens=budget),
                       s.col + bucket_length(len(ids)) + budget, f"sequence {seq_id}'s extension")
        s.state, s.finish_reason = "running", None
        self.pending_ext.append((s, ids, budget))

    def release(self, seq_id: int):
        """Free a held (or finished) sequence's slot and forget it."""
        s = self.seqs.pop(seq_id, None)
        if s is not None and s.state == "held":
            self.free.append(s.slot)

    def cancel(self, seq_id: int):
        """Stop a waiting or running sequence now (its slot frees at once)."""
        s = self._seq(seq_id)
        if s.state == "running":
            self.state = dict(self.state, active=self.state["active"].at[s.slot].set(False))
            self.pending_ext = [e for e in self.pending_ext if e[0] is not s]
            self._finish(s, "cancelled", keep=False)
        elif s.state == "waiting":
            for r in self.waiting:
                if s in r.seqs:
                    r.seqs.remove(s)
            self.waiting = deque(r for r in self.waiting if r.seqs)
            s.state, s.finish_reason = "done", "cancelled"

    def _seq(self, seq_id):
        if seq_id not in self.seqs:
            raise InputError(f"engine: no sequence {seq_id}.")
        return self.seqs[seq_id]

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.pending_ext or
                    any(s.state == "running" for s in self.seqs.values()))

    def result(self, seq_id: int) -> _Seq:
        return self._seq(seq_id)

    # -- the loop --------------------------------------------------------------------------
    def step(self) -> list[Update]:
        """Extensions, admissions, then one decode chunk; what each sequence emitted."""
        self._run_extensions()
        self._admit()
        running = {s.slot: s for s in self.seqs.values() if s.state == "running"}
        if not running:
            return []
        mode = sampler.mode_for(*zip(*[(s.sp.temperature, s.sp.top_k, s.sp.top_p)
                                       for s in running.values()]))
        k = _pow2(len(running))
        if self.lay.partitioner is None and self.lay.slots >= 2 * _MIN_COMPACT and \
                k <= self.lay.slots // 2:
            # Most slots idle: decode only the running ones (padded with idle slots to a
            # power of two, so a few programs serve every occupancy).
            k = max(k, _MIN_COMPACT)
            idle = [i for i in range(self.lay.slots) if i not in running]
            idx = np.asarray(sorted(running) + idle[:k - len(running)], np.int32)
            self.state, tok, lp, emitted = self.progs.decode_compact(
                self.params, self.state, idx, bool(self.waiting), self.chunk, mode)
            rows = {int(slot): r for r, slot in enumerate(idx)}
        else:
            self.state, tok, lp, emitted = self.progs.decode(self.params, self.state,
                                                             bool(self.waiting), self.chunk, mode)
            rows = {slot: slot for slot in running}
        tok, lp, emitted, active = (sharding.to_host(x) for x in
                                    (tok, lp, emitted, self.state["active"]))
        out = []
        for slot, s in running.items():
            r = rows[slot]
            k = int(emitted[r])
            new_t, new_lp = tok[r, :k].tolist(), lp[r, :k].tolist()
            s.tokens += new_t
            s.logprobs += new_lp
            s.col += k
            s.budget -= k
            done = not active[slot]
            if done:
                hit = bool(new_t) and new_t[-1] in s.sp.stop_ids
                self._finish(s, "stop" if hit else "length", keep=s.hold)
            out.append(Update(s.id, new_t, new_lp, done, s.finish_reason))
        return out

    def _finish(self, s: _Seq, reason: str, keep: bool):
        s.finish_reason = reason
        if keep:
            s.state = "held"
        else:
            s.state = "done"
            self.free.append(s.slot)

    def run(self) -> None:
        while self.busy:
            self.step()

    def _knobs(self, seqs) -> dict:
        m = _pow2(len(seqs))
        pad = m - len(seqs)
        stop = np.full((m, self.lay.n_stop), -1, np.int32)
        for i, s in enumerate(seqs):
            stop[i, :len(s.sp.stop_ids)] = s.sp.stop_ids
        seeds = [int(s.sp.seed) % (1 << 64) for s in seqs] + [0] * pad
        key = np.asarray([[x >> 32, x & 0xFFFFFFFF] for x in seeds], np.uint32)
        sub = np.asarray([s.sub for s in seqs] + [0] * pad, np.uint32)
        # Candidate j's stream: the request seed's key folded with j (threefry; see sampler).
        key = np.asarray(_fold(key, sub))
        col = lambda f, dt: np.asarray([f(s) for s in seqs] + [0] * pad, dt)
        return {"temp": col(lambda s: s.sp.temperature, np.float32),
                "top_k": col(lambda s: s.sp.top_k, np.int32),
                "top_p": np.asarray([s.sp.top_p for s in seqs] + [1.0] * pad, np.float32),
                "stop": stop, "key": key, "budget": col(lambda s: s.sp.max_new_tokens, np.int32)}

    def _admit(self):
        taken = []
        while self.waiting and len(self.waiting[0].seqs) <= len(self.free):
            r = self.waiting.popleft()
            for s in r.seqs:
                s.slot, s.state = self.free.pop(0), "running"
            taken.append(r)
        by_len: dict[int, list[_Request]] = {}
        for r in taken:
            by_len.setdefault(bucket_length(len(r.prompt)), []).append(r)
        for plen, reqs in by_len.items():
            n = _pow2(len(reqs))
            tokens = np.zeros((n, plen), np.int32)
            positions = np.zeros((n, plen), np.int32)
            valid = np.zeros((n, plen), bool)
            for i, r in enumerate(reqs):
                k = len(r.prompt)
                tokens[i, plen - k:], positions[i, plen - k:] = r.prompt, np.arange(k)
                valid[i, plen - k:] = True
            seqs = [s for r in reqs for s in r.seqs]
            src = [i for i, r in enumerate(reqs) for _ in r.seqs]
            m = _pow2(len(seqs))
            slot_idx = np.asarray([s.slot for s in seqs] + [self.lay.slots] * (m - len(seqs)), np.int32)
            src_row = np.asarray(src + [0] * (m - len(seqs)), np.int32)
            for s in seqs:
                s.col, s.budget = plen, s.sp.max_new_tokens
            self.state = self.progs.insert(self.params, self.state, tokens, positions, valid,
                                           slot_idx, src_row, self._knobs(seqs))

    def _run_extensions(self):
        by_len: dict[int, list] = {}
        for e in self.pending_ext:
            by_len.setdefault(bucket_length(len(e[1])), []).append(e)
        self.pending_ext = []
        for c, group in by_len.items():
            e = _pow2(len(group))
            tokens = np.zeros((e, c), np.int32)
            valid = np.zeros((e, c), bool)
            slot_idx = np.full((e,), self.lay.slots, np.int32)
            budget = np.zeros((e,), np.int32)
            for i, (s, ids, b) in enumerate(group):
                tokens[i, c - len(ids):], valid[i, c - len(ids):] = ids, True
                slot_idx[i], budget[i] = s.slot, b
                s.col += c
                s.budget = b
            self.state = self.progs.extend(self.params, self.state, tokens, valid, slot_idx, budget)


def _fold(keys: np.ndarray, data: np.ndarray):
    return jax.vmap(jax.random.fold_in)(keys, data)
