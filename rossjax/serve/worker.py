"""The engine's thread: it owns the rossjax.engine.Engine, takes jobs from the HTTP handlers,
steps the engine while any sequence runs (so concurrent requests share its decode steps), and
hands text deltas back to each job's asyncio queue.

A job is one request: a prompt's token ids, sampling settings, `n` candidates (one prefill),
stop strings. Per candidate the worker decodes text incrementally (UTF-8 split across tokens is
held back until complete) and checks the stop strings; a hit truncates the text there and
cancels the sequence (its slot frees at once). Text that could still be the start of a stop
string is held back until it cannot.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import queue
import threading

from rossjax.engine import Engine, SamplingParams


@dataclasses.dataclass
class Delta:
    index: int                  # candidate
    text: str
    token_ids: list
    logprobs: list
    finish_reason: str | None   # set on the candidate's last delta
    top: list = dataclasses.field(default_factory=list)    # per token [(id, log-prob)], if asked
    cached: int = 0             # on the last delta: prompt tokens the prefix cache supplied


class _Text:
    """One candidate's incremental detokenization and stop-string search."""

    def __init__(self, tok, stops: list[str], stop_ids: tuple):
        self.tok, self.stops, self.stop_ids = tok, stops, stop_ids
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text, self.sent = "", 0
        self.hold = max((len(s) for s in stops), default=1) - 1

    def feed(self, ids: list[int], final: bool) -> tuple[str, bool]:
        """New tokens -> (text safe to send, whether a stop string ended the candidate)."""
        vocab = self.tok.vocab_size
        shown = [t for t in ids if t not in self.stop_ids]     # the end-of-turn token is not text
        data = b"".join(self.tok.token_bytes(t) if t < vocab else b"" for t in shown)
        self.text += self.dec.decode(data, final=final)
        hit = None
        for s in self.stops:
            k = self.text.find(s, max(0, self.sent - len(s) + 1))
            if k >= 0 and (hit is None or k < hit):
                hit = k
        if hit is not None:
            self.text = self.text[:hit]
            final = True
        end = len(self.text) if final else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent:end], end
        return out, hit is not None


class Job:
    def __init__(self, prompt, sp: SamplingParams, n: int, stops: list[str], tok, loop,
                 stream: bool = False):
        self.prompt, self.sp, self.n, self.stops = prompt, sp, n, stops
        self.loop, self.out = loop, asyncio.Queue()
        self.texts = [_Text(tok, stops, sp.stop_ids) for _ in range(n)]
        self.done = [False] * n         # candidate j's last delta is out
        self.stream = stream            # deltas as the decode steps make them, not per chunk
        self.seq_ids: list[int] = []
        self.error: Exception | None = None

    def put(self, item):
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


def _put_all(items):
    for job, item in items:
        job.out.put_nowait(item)


def _send(items):
    """Hand (job, delta) pairs to their event loops, one wake-up per loop."""
    by_loop: dict = {}
    for job, d in items:
        by_loop.setdefault(job.loop, []).append((job, d))
    for loop, group in by_loop.items():
        loop.call_soon_threadsafe(_put_all, group)


class EngineWorker:
    """Runs `Engine` on a daemon thread; `submit(job)` / `cancel(job)` from any thread."""

    def __init__(self, engine: Engine, tokenizer, stream_gap_s: float = 0.02):
        self.engine, self.tok = engine, tokenizer
        self.inbox: queue.Queue = queue.Queue()
        self.jobs: dict[int, tuple[Job, int]] = {}      # seq id -> (job, candidate index)
        self._stop = threading.Event()
        # Streamed jobs get their tokens from inside the decode loop (rossjax.engine.stream);
        # new work in the inbox ends the chunk, so a request waits at most a step or so.
        engine.stream_to(self._on_tokens, stream_gap_s)
        self.thread = threading.Thread(target=self._loop, name="rossjax-engine", daemon=True)
        self.thread.start()

    def submit(self, job: Job):
        self.inbox.put(("submit", job))

    def cancel(self, job: Job):
        self.inbox.put(("cancel", job))

    def close(self):
        self._stop.set()
        self.inbox.put(("noop", None))
        self.thread.join(timeout=10)

    def _take(self, block: bool):
        try:
            cmd, job = self.inbox.get(block=block, timeout=0.5 if block else None)
        except queue.Empty:
            return False
        if cmd == "submit":
            try:
                job.seq_ids = self.engine.submit(job.prompt, job.sp, n=job.n,
                                                 stream=job.stream)
            except Exception as e:   # a request the engine refuses: the handler reports it
                job.error = e
                job.put(None)
                return True
            for j, sid in enumerate(job.seq_ids):
                self.jobs[sid] = (job, j)
        elif cmd == "cancel":
            for sid in job.seq_ids:
                if sid in self.jobs:
                    self.engine.cancel(sid)
                    self._forget(sid)
        return True

    def _forget(self, sid):
        self.jobs.pop(sid, None)
        self.engine.release(sid)

    def _loop(self):
        while not self._stop.is_set():
            # Idle: wait for work; busy: take whatever arrived, then step.
            if self._take(block=not self.engine.busy):
                while self._take(block=False):
                    pass
            if not self.engine.busy:
                continue
            try:
                updates = self.engine.step()
            except Exception as e:       # a device failure ends every live job with it
                for sid, (job, _) in list(self.jobs.items()):
                    job.error = e
                    job.put(None)
                    self._forget(sid)
                continue
            out = []
            for u in updates:
                if u.seq_id not in self.jobs:
                    continue
                job, j = self.jobs[u.seq_id]
                k = u.streamed      # those went out from inside the decode (_on_tokens)
                if u.finished or len(u.tokens) > k:
                    self._deliver(job, j, u.tokens[k:], u.logprobs[k:], u.finished,
                                  u.finish_reason, out, u.top_logprobs[k:])
                if job.done[j]:     # finished, or a stop string ended it (cancelled here)
                    self._forget(u.seq_id)
            _send(out)

    def _deliver(self, job: Job, j: int, ids, lps, finished: bool, reason, out: list, top=()):
        """Candidate j's new tokens -> a delta in `out` (none once it is done); top: per token
        its top log-probs (empty where the request asked for none)."""
        if job.done[j]:
            return
        ids, lps, top = list(ids), list(lps), list(top)
        if job.stops and len(ids) > 1:   # token by token: the delta ends at the stop string
            text, hit = "", False
            for k in range(len(ids)):
                piece, hit = job.texts[j].feed(ids[k:k + 1], finished and k == len(ids) - 1)
                text += piece
                if hit:
                    ids, lps, top = ids[:k + 1], lps[:k + 1], top[:k + 1]
                    break
        else:
            text, hit = job.texts[j].feed(ids, finished)
        reason = "stop" if hit else reason if finished else None
        job.done[j] = reason is not None
        cached = self.engine.result(job.seq_ids[j]).cached_tokens if job.done[j] else 0
        out.append((job, Delta(j, text, ids, lps, reason, top, cached)))

    def _on_tokens(self, by_seq: dict) -> bool:
        """Called from inside a streaming decode (the engine thread waits on it): deltas out
        now; true (end the chunk) when work waits in the inbox or a stop string ended one."""
        out, ended = [], False
        for sid, (ids, lps, *top) in by_seq.items():
            if sid in self.jobs:
                job, j = self.jobs[sid]
                if job.stream:
                    self._deliver(job, j, ids, lps, False, None, out, top[0] if top else ())
                    ended |= job.done[j]
        _send(out)
        return ended or not self.inbox.empty()
