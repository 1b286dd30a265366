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
    def __init__(self, prompt, sp: SamplingParams, n: int, stops: list[str], tok, loop):
        self.prompt, self.sp, self.n, self.stops = prompt, sp, n, stops
        self.loop, self.out = loop, asyncio.Queue()
        self.texts = [_Text(tok, stops, sp.stop_ids) for _ in range(n)]
        self.seq_ids: list[int] = []
        self.error: Exception | None = None

    def put(self, item):
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class EngineWorker:
    """Runs `Engine` on a daemon thread; `submit(job)` / `cancel(job)` from any thread."""

    def __init__(self, engine: Engine, tokenizer):
        self.engine, self.tok = engine, tokenizer
        self.inbox: queue.Queue = queue.Queue()
        self.jobs: dict[int, tuple[Job, int]] = {}      # seq id -> (job, candidate index)
        self._stop = threading.Event()
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
                job.seq_ids = self.engine.submit(job.prompt, job.sp, n=job.n)
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
            for u in updates:
                if u.seq_id not in self.jobs:
                    continue
                job, j = self.jobs[u.seq_id]
                text, hit = job.texts[j].feed(u.tokens, u.finished)
                reason = "stop" if hit else u.finish_reason if u.finished else None
                if hit and not u.finished:
                    self.engine.cancel(u.seq_id)
                job.put(Delta(j, text, u.tokens, u.logprobs, reason))
                if reason is not None:
                    self._forget(u.seq_id)
