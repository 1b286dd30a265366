"""Engine: continuous batching over a fixed pool of KV-cache slots, one scheduler (host) and one
executor (device) stepped together.

    eng = Engine(cfg, params, slots=16, max_len=512)
    ids = eng.submit(prompt_ids, SamplingParams(max_new_tokens=64, temperature=1.0, seed=3), n=8)
    while eng.busy:
        for u in eng.step():          # Update(seq_id, tokens, logprobs, finished, finish_reason)
            ...
    eng.result(ids[0])                # SequenceResult(status, tokens, logprobs, finish_reason, ...)

prefix_cache=True: a prompt whose prefix some slot's cache holds reuses it (rossjax.engine.prefix).
min_rows: the fewest rows a decode over a mostly idle pool runs (1 for a server, where a lone
stream's step at 1 row took 6.5-7.7 ms against 13.4-13.8 at 8 on CPU; the default 8 spares
batch generation the programs of 1, 2 and 4 rows for its last sequences).

A step is `scheduler.schedule()` -> `executor.execute(plan)` -> `scheduler.update(plan, out)`
(rossjax.engine.scheduler says what a plan holds and when slots free).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import jax

from rossjax import sharding
from rossjax.engine import kv_slots
from rossjax.engine.executor import Executor, warm
from rossjax.engine.scheduler import (
    BUCKETS,
    MIN_COMPACT,
    PREFILL_TOKENS,
    Scheduler,
    bucket_length,
    prefill_groups,
)
from rossjax.engine.types import (
    MAX_TOP_LOGPROBS,
    SamplingParams,
    SequenceResult,
    Status,
    Update,
)
from rossjax.errors import ConfigError


def _single_device(part):
    """None for a partitioner whose mesh is the default device alone (a one-device trainer):
    sharding there is a no-op, and the unsharded layout is the fast one on CPU (per-layer cache
    and decode_params weights, compaction); measured 3x faster sampling for `rossjax grpo` with
    mesh.num_devices = 1. Any other mesh keeps its shardings."""
    if part is not None and part.mesh.devices.size == 1 and \
            part.mesh.devices.flat[0] == jax.devices()[0]:
        return None
    return part


class Engine:
    """Continuous batching over `slots` KV-cache rows of `max_len` columns each."""

    def __init__(self, cfg, params, *, slots: int = 8, max_len: int = 1024, partitioner=None,
                 n_stop: int = 4, chunk: int = 32, prefix_cache: bool = False,
                 min_rows: int = MIN_COMPACT):
        part = _single_device(sharding.as_partitioner(partitioner))
        mult = 1 if part is None else part.batch_size_multiple()
        if slots < 1 or slots % mult:
            raise ConfigError(f"engine: field 'slots' ({slots}) must be a positive multiple of the "
                              f"mesh's batch shards ({mult}).")
        self.cfg = cfg
        self.layout = kv_slots.Layout(cfg, int(slots), int(max_len), int(n_stop), part)
        self.executor = Executor(self.layout, params)
        # Compaction gathers rows of an unsharded cache only (a sharded one keeps its layout).
        self.scheduler = Scheduler(slots=slots, max_len=max_len, n_stop=n_stop,
                                   vocab_size=cfg.vocab_size, chunk=chunk, compact=part is None,
                                   prefix_cache=prefix_cache, min_rows=min_rows,
                                   prefill_tokens=PREFILL_TOKENS if self.layout.per_layer else 0)
        self._seq_of_slot: dict[int, int] = {}

    # -- capacity ------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return self.layout.slots

    @property
    def max_len(self) -> int:
        """Cache columns per slot: bucketed prompt + every turn's tokens must fit."""
        return self.layout.max_len

    @property
    def max_stop_ids(self) -> int:
        return self.layout.n_stop

    @property
    def free_slots(self) -> int:
        return self.scheduler.pool.n_free

    @property
    def busy(self) -> bool:
        return self.scheduler.busy

    def set_params(self, params):
        """New weights (a GRPO step); live sequences continue under them. Cached prefixes
        were computed under the old ones: forgotten."""
        self.executor.set_params(params)
        if self.scheduler.prefix is not None:
            self.scheduler.prefix.clear()

    @property
    def prefix_stats(self) -> dict:
        """Prompt tokens taken from the prefix cache and prompt tokens computed (prefill
        or suffix) since the engine started; {} without the cache."""
        p = self.scheduler.prefix
        return {} if p is None else {"hit_tokens": p.hit_tokens, "computed_tokens": p.miss_tokens}

    def warmup(self, modes=("greedy", "plain"), stream: bool = True,
               top_logprobs: bool = True) -> int:
        """Compile now the programs a load can meet (each compiles on first use otherwise, 1-3 s
        on CPU, stalling every running sequence): prefills of 1, 2, 4, ... prompts of every
        length bucket that fits, and decodes of every row count, in `modes` (rossjax.engine.sampler:
        greedy; plain: temperature without top-k/top-p), streamed or not, with and without
        top log-probs. Not covered: n > 1 candidates, prefix-cache hits and extensions,
        top-k/top-p. Before the first request; returns how many programs ran."""
        sch, lengths = self.scheduler, []
        length = BUCKETS[0]
        while length < self.max_len:
            lengths.append(length)
            length = bucket_length(length + 1)
        prefill = []
        for length in lengths:       # the largest group a burst of prompts makes, and below
            top = len(prefill_groups(list(range(self.slots)), length, sch.prefill_tokens)[0])
            prefill += [(r, length) for r in _pow2_upto(top)]
        decode = [self.slots]
        if sch.compact and self.slots >= 2 * sch.min_rows:
            decode += [k for k in _pow2_upto(self.slots // 2) if k >= sch.min_rows]
        return warm(self.executor, chunk=sch.chunk, prefill_rows=prefill, decode_rows=decode,
                    modes=modes, streams=(False, True) if stream else (False,),
                    tops=(0, MAX_TOP_LOGPROBS) if top_logprobs else (0,))

    # -- requests --------------------------------------------------------------------------
    def submit(self, prompt: Seq[int], sampling: SamplingParams, n: int = 1,
               hold: bool = False, stream: bool = False) -> list[int]:
        """Queue `n` candidates of one prompt; returns their sequence ids. stream: while it
        decodes, its tokens go to `on_tokens` as the steps make them (see stream_to)."""
        return self.scheduler.submit(prompt, sampling, n, hold, stream)

    def stream_to(self, on_tokens, min_gap_s: float | None = None):
        """While a stream=True sequence decodes, call `on_tokens({seq_id: (tokens, logprobs)})`
        (a third entry, per token [(id, log-prob)], where it asked for top_logprobs) from inside the decode loop, right after a step samples (a new sequence's first token
        right after its prefill), at most every `min_gap_s` (rossjax.engine.stream); a true
        answer ends the chunk after that step (so the caller can submit or cancel). Each
        Update's `streamed` counts its tokens already given. Tokens and results are the same
        with or without it. No-op on a mesh (tokens come chunk by chunk)."""
        lst = self.executor.listener
        if lst is None:
            return
        if min_gap_s is not None:
            lst.min_gap_s = float(min_gap_s)

        def sink(by_slot):
            seq_of = self._seq_of_slot
            return on_tokens({seq_of[slot]: v for slot, v in by_slot.items() if slot in seq_of})

        lst.sink = None if on_tokens is None else sink

    def extend(self, seq_id: int, token_ids: Seq[int], max_new_tokens: int | None = None):
        """Append tokens (e.g. a tool observation) to a held sequence and let it decode again
        (up to `max_new_tokens`, default its request's) from where its cache ends."""
        self.scheduler.extend(seq_id, token_ids, max_new_tokens)

    def release(self, seq_id: int):
        """Free a held (or finished) sequence's slot and forget it."""
        self.scheduler.release(seq_id)

    def cancel(self, seq_id: int):
        """Stop a waiting or running sequence now (its slot frees at once)."""
        self.scheduler.cancel(seq_id)

    def result(self, seq_id: int) -> SequenceResult:
        return self.scheduler.result(seq_id)

    def count(self, status: Status) -> int:
        """How many sequences the engine holds in `status`."""
        return self.scheduler.count(status)

    # -- the loop --------------------------------------------------------------------------
    def step(self) -> list[Update]:
        """Extensions, admissions, then one decode chunk; what each sequence emitted."""
        plan = self.scheduler.schedule()
        d = plan.decode
        self._seq_of_slot = {} if d is None else dict(zip(d.slots, d.seq_ids))
        return self.scheduler.update(plan, self.executor.execute(plan))

    def run(self) -> None:
        while self.busy:
            self.step()


def _pow2_upto(n: int) -> list[int]:
    """1, 2, 4, ... up to n."""
    return [1 << i for i in range(max(1, n).bit_length())]
