"""The host half of the engine: requests, sequences and the decision of what each step runs.

One engine step is schedule -> execute -> update (as vLLM v1's SchedulerOutput, JetStream's
prefill / insert / generate verbs):

    plan = scheduler.schedule()        # host state only: which extensions, prefills, decode rows
    out = executor.execute(plan)       # rossjax.engine.executor: the device programs
    updates = scheduler.update(plan, out)   # append tokens, finish sequences, free slots

so scheduling is tested with a fake `execute` and no compiled program.

A request's `n` candidates share one prefill and take n slots together (it waits until n are
free; FIFO). A plan runs pending extensions, then prefills the admitted requests (per
prompt-length bucket, in power-of-two groups: `prefill_groups`), then decodes up to `chunk`
steps over the running slots; while requests wait, the decode returns right after the step
that ended a sequence (`exit_on_free`), whose slot is free at once, or kept for a `hold=True`
request until `release`, so a multi-turn
rollout can `extend(seq_id, observation_ids)` it without a new prefill.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Sequence as Seq

from rossjax.engine.prefix import ForkBatch, PrefixIndex, fork_batch
from rossjax.engine.sampler import mode_for
from rossjax.engine.slot_pool import SlotPool
from rossjax.engine.types import (
    FinishReason,
    SamplingParams,
    SequenceResult,
    Status,
    Update,
    check_token_ids,
)
from rossjax.errors import ConfigError, InputError

# Prompt (and extension) lengths round up to one of these, then to multiples of 512, so a stream
# of different lengths compiles a handful of programs, not one per length.
BUCKETS = (16, 32, 64, 128, 256, 512)

# Below this many running sequences a decode is not compacted further (the default of
# `min_rows`: batch generation's tail compiles no programs of 1, 2 or 4 rows).
MIN_COMPACT = 8


def bucket_length(n: int) -> int:
    for b in BUCKETS:
        if n <= b:
            return b
    return -(-n // 512) * 512


def pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# On CPU (the engine's unsharded layout there) a prefill program runs at most this many prompt
# tokens (rows x bucketed length; one longer prompt runs alone): larger batches ran no faster
# per token (2.2k tokens/s at 32 x 256 against 2.7k at 4 x 256, AMD EPYC) and compile longer.
# An accelerator or a mesh takes a bucket's prompts in one group (0: no cap).
PREFILL_TOKENS = 2048


def prefill_groups(items: list, length: int, max_tokens: int = 0) -> list[list]:
    """Split one length bucket's prompts into groups of power-of-two size, largest first, each
    at most max_tokens tokens (0: any): the executor pads a batch's rows to a power of two, so
    11 prompts run as 8 + 2 + 1 rows (the programs of those sizes), not as 16 with 5 rows of
    padding."""
    cap = max(1, max_tokens // length) if max_tokens else len(items)
    cap = 1 << (max(1, cap).bit_length() - 1)
    out, i = [], 0
    while i < len(items):
        k = min(cap, 1 << ((len(items) - i).bit_length() - 1))
        out.append(items[i:i + k])
        i += k
    return out


# -- the plan ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ExtendBatch:
    """Token ids appended to live slots (left-padded to `length`); each then decodes `budget`."""
    length: int
    slots: list
    token_ids: list
    budgets: list


@dataclasses.dataclass(frozen=True)
class PrefillBatch:
    """Prompts (left-padded to `length`) prefilled once each; slot m takes prompt rows[m]'s
    cache with sampling[m] and candidate index candidates[m] (its random stream)."""
    length: int
    prompts: list
    slots: list
    rows: list
    sampling: list
    candidates: list


@dataclasses.dataclass(frozen=True)
class DecodeBatch:
    """Up to `steps` decode steps over the running `slots` (of `seq_ids`). `rows`: the slots
    to gather when compacting (running first, padded with idle ones), None for every slot."""
    slots: list
    seq_ids: list
    steps: int
    mode: str
    exit_on_free: bool
    rows: list | None = None
    stream: tuple = ()              # slots of streaming sequences: tokens out step by step


@dataclasses.dataclass(frozen=True)
class SchedulerOutput:
    """Run in this order: stop the cancelled rows, forks (with their suffix extensions),
    extensions, prefills, late forks (of prompts prefilled in this plan), then the decode."""
    stops: list
    extends: list
    prefills: list
    decode: DecodeBatch | None
    forks: list = ()
    late_forks: list = ()


@dataclasses.dataclass(frozen=True)
class ExecutionOutput:
    """What a decode emitted, per running slot, and which slots stopped decoding in it."""
    tokens: dict
    logprobs: dict
    finished: frozenset
    streamed: dict = dataclasses.field(default_factory=dict)    # slot -> tokens already streamed
    top_logprobs: dict = dataclasses.field(default_factory=dict)  # slot -> per token [(id, lp)]


def _prefill_batch(length: int, reqs: list) -> PrefillBatch:
    seqs = [s for r in reqs for s in r.seqs]
    return PrefillBatch(length, [r.prompt for r in reqs], [s.slot for s in seqs],
                        [i for i, r in enumerate(reqs) for _ in r.seqs],
                        [s.sampling for s in seqs], [s.candidate for s in seqs])


# -- host records --------------------------------------------------------------------------
@dataclasses.dataclass
class _Sequence:
    id: int
    sampling: SamplingParams
    candidate: int                  # index within its request (selects its random stream)
    hold: bool
    stream: bool = False            # its tokens go to the engine's on_tokens as they come
    status: Status = Status.WAITING
    slot: int = -1
    cache_used: int = 0             # host mirror of the slot's next write column
    budget: int = 0
    tokens: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)
    finish_reason: FinishReason | None = None
    cached_tokens: int = 0          # prompt tokens the prefix cache supplied (prefix.fork_batch)


@dataclasses.dataclass
class _Request:
    prompt: list
    seqs: list


class Scheduler:
    """Requests and sequences over `slots` KV-cache rows of `max_len` columns; no device."""

    def __init__(self, *, slots: int, max_len: int, n_stop: int, vocab_size: int, chunk: int,
                 compact: bool = True, prefix_cache: bool = False,
                 min_rows: int = MIN_COMPACT, prefill_tokens: int = 0):
        self.max_len, self.n_stop, self.vocab_size = int(max_len), int(n_stop), int(vocab_size)
        self.chunk = int(chunk)
        self.compact = compact          # decode may gather only the running rows (unsharded)
        self.min_rows = max(1, int(min_rows))     # the fewest rows a compacted decode runs
        self.prefill_tokens = int(prefill_tokens)  # a prefill group's token cap (0: none)
        self.pool = SlotPool(slots)
        self._seqs: dict[int, _Sequence] = {}
        self._waiting: deque[_Request] = deque()
        self._extensions: list = []     # (sequence, token ids, budget)
        self._stops: list[int] = []     # slots of sequences cancelled while decoding
        self._ids = itertools.count()
        self.prefix = PrefixIndex() if prefix_cache else None   # what each slot's cache holds

    @property
    def slots(self) -> int:
        return self.pool.capacity

    # -- requests --------------------------------------------------------------------------
    def _check_tokens(self, ids: Seq[int], what: str) -> list[int]:
        return check_token_ids(ids, self.vocab_size, f"engine: {what}")

    def _check_sampling(self, sampling: SamplingParams, need_cols: int, what: str):
        sampling.check()
        if len(sampling.stop_ids) > self.n_stop:
            raise ConfigError(f"engine: {what} has {len(sampling.stop_ids)} stop ids; this engine "
                              f"takes at most {self.n_stop} (field 'n_stop').")
        if need_cols > self.max_len:
            raise InputError(f"engine: {what} needs {need_cols} cache columns (bucketed length + "
                             f"max_new_tokens) but slots hold {self.max_len} (field 'max_len').")

    def submit(self, prompt: Seq[int], sampling: SamplingParams, n: int = 1,
               hold: bool = False, stream: bool = False) -> list[int]:
        prompt = self._check_tokens(prompt, "the prompt")
        if not 1 <= n <= self.slots:
            raise ConfigError(f"engine: field 'n' ({n}) must be in [1, slots={self.slots}].")
        self._check_sampling(sampling, bucket_length(len(prompt)) + sampling.max_new_tokens,
                             "the request")
        seqs = [_Sequence(next(self._ids), sampling, j, hold, stream) for j in range(n)]
        for s in seqs:
            self._seqs[s.id] = s
        self._waiting.append(_Request(prompt, seqs))
        return [s.id for s in seqs]

    def extend(self, seq_id: int, token_ids: Seq[int], max_new_tokens: int | None = None):
        s = self._seq(seq_id)
        if s.status is not Status.HELD:
            raise InputError(f"engine: sequence {seq_id} is {s.status}; only a finished sequence "
                             f"of a hold=True request can be extended.")
        ids = self._check_tokens(token_ids, f"the extension of sequence {seq_id}")
        budget = int(max_new_tokens or s.sampling.max_new_tokens)
        self._check_sampling(dataclasses.replace(s.sampling, max_new_tokens=budget),
                             s.cache_used + bucket_length(len(ids)) + budget,
                             f"sequence {seq_id}'s extension")
        s.status, s.finish_reason = Status.RUNNING, None
        self._extensions.append((s, ids, budget))

    def release(self, seq_id: int):
        """Forget a sequence; a held one's slot frees, a live one is cancelled first."""
        s = self._seqs.get(seq_id)
        if s is not None and s.status in (Status.WAITING, Status.RUNNING):
            self.cancel(seq_id)
        self._seqs.pop(seq_id, None)
        if s is not None and s.status is Status.HELD:
            self.pool.free([s.slot])

    def cancel(self, seq_id: int):
        """Stop a waiting or running sequence now: its slot frees at once (the device row stops
        at the start of the next plan, before anything can take the slot)."""
        s = self._seq(seq_id)
        if s.status is Status.RUNNING:
            self._extensions = [e for e in self._extensions if e[0] is not s]
            self._stops.append(s.slot)
            self._finish(s, FinishReason.CANCELLED, keep=False)
        elif s.status is Status.WAITING:
            for r in self._waiting:
                if s in r.seqs:
                    r.seqs.remove(s)
            self._waiting = deque(r for r in self._waiting if r.seqs)
            s.status, s.finish_reason = Status.DONE, FinishReason.CANCELLED

    def _seq(self, seq_id) -> _Sequence:
        if seq_id not in self._seqs:
            raise InputError(f"engine: no sequence {seq_id}.")
        return self._seqs[seq_id]

    def result(self, seq_id: int) -> SequenceResult:
        s = self._seq(seq_id)
        return SequenceResult(s.id, s.status, tuple(s.tokens), tuple(s.logprobs), s.finish_reason,
                              s.cache_used, s.cached_tokens)

    def count(self, status: Status) -> int:
        return sum(s.status is status for s in self._seqs.values())

    @property
    def busy(self) -> bool:
        return bool(self._waiting or self._extensions or self.count(Status.RUNNING))

    # -- schedule ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """What the next step runs, decided from host state (and marked in it: slots taken,
        cache columns the plan will have written)."""
        stops, self._stops = self._stops, []
        extends = self._take_extensions()
        prefills, forks, late = self._admit()
        return SchedulerOutput(stops, extends, prefills, self._decode_batch(), forks, late)

    def _take_extensions(self) -> list[ExtendBatch]:
        by_len: dict[int, list] = {}
        for e in self._extensions:
            by_len.setdefault(bucket_length(len(e[1])), []).append(e)
        self._extensions = []
        out = []
        for length, group in by_len.items():
            for s, ids, budget in group:
                if self.prefix is not None:
                    self.prefix.append(s.slot, ids, s.cache_used + length - len(ids))
                s.cache_used += length
                s.budget = budget
            out.append(ExtendBatch(length, [s.slot for s, _, _ in group],
                                   [ids for _, ids, _ in group], [b for _, _, b in group]))
        return out

    def _admit(self) -> tuple[list[PrefillBatch], list[ForkBatch], list[ForkBatch]]:
        """Waiting requests, in order, while the first one's n slots are free: a prompt whose
        prefix a slot holds forks it (prefix cache; a late fork when that slot is prefilled in
        this same plan), any other is prefilled."""
        by_len: dict[int, list[_Request]] = {}
        forks: dict[tuple, list] = {}
        taken: set[int] = set()     # slots given out in this plan: their content is changing
        pending = PrefixIndex()     # what this plan's prefills will have written
        while self._waiting:
            r = self._waiting[0]
            hit, late = self._prefix_hit(r, taken, pending)
            slots = self._allocate(len(r.seqs), hit)
            if slots is None:
                break
            self._waiting.popleft()
            taken.update(slots)
            for s, slot in zip(r.seqs, slots):
                s.slot, s.status = slot, Status.RUNNING
            if hit is None:
                length = bucket_length(len(r.prompt))
                by_len.setdefault(length, []).append(r)
                if self.prefix is not None:
                    self.prefix.miss_tokens += len(r.prompt)
                    pending.set(slots[0], r.prompt, range(length - len(r.prompt), length))
            else:
                key = (late, bucket_length(len(r.prompt) - hit.tokens))
                forks.setdefault(key, []).append((r, hit))
        out = []
        for length, reqs in by_len.items():
            for r in reqs:
                for s in r.seqs:
                    s.cache_used, s.budget = length, s.sampling.max_new_tokens
                    if self.prefix is not None:
                        self.prefix.set(s.slot, r.prompt, range(length - len(r.prompt), length))
            out += [_prefill_batch(length, group)
                    for group in prefill_groups(reqs, length, self.prefill_tokens)]
        batches = {key: fork_batch(self.prefix, key[1], group) for key, group in forks.items()}
        return (out, [b for (late, _), b in batches.items() if not late],
                [b for (late, _), b in batches.items() if late])

    def _prefix_hit(self, r: _Request, taken, pending):
        """(the cached prefix request r reuses, whether its slot is prefilled in this plan), or
        (None, False): no prefix cache, no match, or the prefix's columns + the rest + the
        budget do not fit a slot."""
        if self.prefix is None:
            return None, False
        fits = lambda h: h is not None and h.end + bucket_length(len(r.prompt) - h.tokens) + \
            r.seqs[0].sampling.max_new_tokens <= self.max_len
        hit, new = self.prefix.lookup(r.prompt, exclude=taken), pending.lookup(r.prompt)
        hit, new = (hit if fits(hit) else None), (new if fits(new) else None)
        if new is not None and (hit is None or new.tokens > hit.tokens):
            return new, True
        return hit, False

    def _allocate(self, n: int, hit):
        """n free slots; the one holding a hit's prefix first when it is free (no copy)."""
        if hit is None or hit.slot not in self.pool.free_slots():
            return self.pool.allocate(n)
        if n > self.pool.n_free:
            return None
        self.pool.take(hit.slot)
        return [hit.slot] + self.pool.allocate(n - 1)

    def _decode_batch(self) -> DecodeBatch | None:
        running = {s.slot: s for s in self._seqs.values() if s.status is Status.RUNNING}
        if not running:
            return None
        mode = mode_for(*zip(*[(s.sampling.temperature, s.sampling.top_k, s.sampling.top_p)
                               for s in running.values()]))
        k, rows = pow2(len(running)), None
        if self.compact and self.slots >= 2 * self.min_rows and k <= self.slots // 2:
            # Most slots idle: decode only the running ones, padded with idle slots to a power
            # of two (so a few programs serve every occupancy).
            k = max(k, self.min_rows)
            idle = [i for i in range(self.slots) if i not in running]
            rows = sorted(running) + idle[:k - len(running)]
        return DecodeBatch(list(running), [s.id for s in running.values()], self.chunk, mode,
                           bool(self._waiting), rows,
                           tuple(slot for slot, s in running.items() if s.stream))

    # -- update ----------------------------------------------------------------------------
    def update(self, plan: SchedulerOutput, out: ExecutionOutput) -> list[Update]:
        """Apply what the decode emitted; a sequence that stopped finishes (its slot frees
        unless it is held)."""
        if plan.decode is None:
            return []
        updates = []
        for slot, sid in zip(plan.decode.slots, plan.decode.seq_ids):
            s = self._seqs[sid]
            toks, lps = list(out.tokens[slot]), list(out.logprobs[slot])
            if self.prefix is not None:     # every emitted token's KV is in its slot
                self.prefix.append(slot, toks, s.cache_used)
            s.tokens += toks
            s.logprobs += lps
            s.cache_used += len(toks)
            s.budget -= len(toks)
            done = slot in out.finished
            if done:
                hit = bool(toks) and toks[-1] in s.sampling.stop_ids
                self._finish(s, FinishReason.STOP if hit else FinishReason.LENGTH, keep=s.hold)
            updates.append(Update(s.id, toks, lps, done, s.finish_reason,
                                  out.streamed.get(slot, 0), out.top_logprobs.get(slot, [])))
        return updates

    def _finish(self, s: _Sequence, reason: FinishReason, keep: bool):
        s.finish_reason = reason
        if keep:
            s.status = Status.HELD
        else:
            s.status = Status.DONE
            self.pool.free([s.slot])
