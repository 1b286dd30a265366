"""Tokens handed to the host while a decode chunk runs (serve's per-token streaming).

A streaming decode (kv_slots.decode with stream=True) calls the host from inside its loop, right
after a step samples its tokens and before that step's forward pass: the first call of a chunk
that admitted a sequence is at its step 0, so a new sequence's first token leaves as soon as its
prefill is done, not after the chunk. The call gets the chunk's token buffer and how many tokens
each row has emitted so far; it answers (halt, gap): halt ends the chunk after this step (new
work waits on the host: a request to admit, a cancellation), gap is how many steps until the
next call.

A host call costs about 0.1 ms on XLA:CPU whatever the model (measured 1-5 ms of stall on a
loaded 2-core machine), so `Listener` spaces the calls at least `min_gap_s` apart (from the step
time it measures): every step of a model whose step takes longer than that gets its own call
(each token its own delta); a chunk that ends within `min_gap_s` anyway makes no call at all
(a toy model streams chunk by chunk, as before, at no cost).

The compiled program names its listener by an integer operand (the programs are shared by every
engine of one layout), which `_hook` looks up in the registry.
"""

from __future__ import annotations

import itertools
import math
import threading
import time

import numpy as np

_REGISTRY: dict[int, Listener] = {}
_IDS = itertools.count(1)
_LOCK = threading.Lock()


def hook(listener, emitted, tokens, logprobs, *top):
    """The io_callback target: (halt, gap) as numpy scalars. top: a decode with top log-probs
    also passes their ids and log-probs [rows, steps, k]."""
    lst = _REGISTRY.get(int(listener))
    if lst is None:
        return np.bool_(False), np.int32(1 << 30)
    return lst.called(np.asarray(emitted), np.asarray(tokens), np.asarray(logprobs),
                      *(np.asarray(x) for x in top))


class Listener:
    """One executor's end of the hook: maps a decode's rows to slots, hands each slot's new
    tokens to `sink({slot: (tokens, logprobs)}) -> halt` (with a third entry where the slot's
    sequence asked for top log-probs: per token the [(id, log-prob)] of its top_n likeliest),
    and spaces the calls."""

    def __init__(self, min_gap_s: float = 0.02):
        self.min_gap_s = float(min_gap_s)
        self.sink = None
        self.step_s: float | None = None    # measured seconds per decode step
        self.error: BaseException | None = None
        self._rows: list[int] = []
        self._top_n: list[int] = []
        self._delivered = np.zeros(0, np.int64)
        self._last = None                   # (time, step count) of the previous call
        with _LOCK:
            self.id = next(_IDS)
            _REGISTRY[self.id] = self

    def close(self):
        with _LOCK:
            _REGISTRY.pop(self.id, None)

    @property
    def gap(self) -> int:
        """Steps between calls: 1 until a step time is measured."""
        if not self.step_s:
            return 1
        return max(1, math.ceil(self.min_gap_s / self.step_s))

    def worth(self, steps: int) -> bool:
        """Whether a chunk of `steps` should call the host at all: only where the chunk takes
        longer than min_gap_s (a toy model's 16 steps end sooner than a call would help, and
        its calls, halts and extra deltas would cost it throughput)."""
        return self.step_s is None or self.step_s * steps > self.min_gap_s

    def observe(self, seconds: float, steps: int):
        """A whole decode's wall time: keeps the step time current where no call measures it."""
        if steps > 0:
            dt = seconds / steps
            self.step_s = dt if self.step_s is None else 0.7 * self.step_s + 0.3 * dt

    def begin(self, row_slots: list[int], top_n: list[int] | None = None):
        """A decode over rows whose slots are `row_slots` (-1: a padding row) starts; top_n:
        per row, how many top log-probs its sequence asked for."""
        self._rows = list(row_slots)
        self._top_n = list(top_n) if top_n is not None else [0] * len(row_slots)
        self._delivered = np.zeros(len(row_slots), np.int64)
        self._last = None
        self.error = None

    def delivered(self) -> dict[int, int]:
        """slot -> how many of its tokens in this chunk went out through the sink."""
        return {s: int(d) for s, d in zip(self._rows, self._delivered) if s >= 0}

    def called(self, emitted, tokens, logprobs, top_ids=None, top_lps=None):
        now = time.perf_counter()
        step = int(emitted.max(initial=0))
        if self._last is not None and step > self._last[1]:
            dt = (now - self._last[0]) / (step - self._last[1])
            self.step_s = dt if self.step_s is None else 0.7 * self.step_s + 0.3 * dt
        self._last = (now, step)
        halt = False
        try:
            new = {}
            for r, slot in enumerate(self._rows):
                a, b = int(self._delivered[r]), int(emitted[r])
                if slot >= 0 and b > a:
                    k = self._top_n[r] if top_ids is not None else 0
                    new[slot] = (tokens[r, a:b].tolist(), logprobs[r, a:b].tolist()) + (
                        (top_pairs(top_ids[r, a:b], top_lps[r, a:b], k),) if k else ())
                    self._delivered[r] = b
            if new and self.sink is not None:
                halt = bool(self.sink(new))
        except BaseException as e:     # raised again by the executor after the decode
            self.error, halt = e, True
        return np.bool_(halt), np.int32(self.gap)


def top_pairs(ids, lps, k: int) -> list:
    """[steps, >= k] top ids and log-probs -> per step [(id, log-prob)] of the first k."""
    ids, lps = np.asarray(ids)[:, :k].tolist(), np.asarray(lps)[:, :k].tolist()
    return [list(zip(i, p)) for i, p in zip(ids, lps)]
