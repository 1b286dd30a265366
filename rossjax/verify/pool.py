"""One pool of CPU worker processes, shared by curation (verify every row) and GRPO (score the
candidates of a step while the device computes).

Workers are separate processes (spawn: safe even if the parent imported jax) and each job runs in
a worker's main thread, where math-verify's signal-based timeouts work; code verifiers start
their sandboxes from there. Results always come back in input order. workers=0 runs every job in
this process (lazily, for `submit`).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import threading
import time
from typing import Callable, Iterable

from rossjax.verify.base import verify_one
from rossjax.verify.verdict import Verdict


def _exit_with_parent(parent: int) -> None:
    """A worker whose parent was killed (OOM, SIGKILL, a crashed Beam worker) would wait on its
    queue forever: a daemon thread ends it once the parent is gone."""
    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


class WorkerPool:
    """`with WorkerPool(2) as pool: out = pool.map(items, fn)` (ordered, blocking), or
    `thunk = pool.submit(a, items)` -> `thunk()` is `fn(a, items)` computed on the workers in
    chunks (the asynchronous use: submit, do other work, collect). `fn` given here is the default
    for both; it must be a picklable module-level function."""

    def __init__(self, workers: int = 2, fn: Callable | None = None):
        self.workers, self.fn = max(0, int(workers)), fn
        self._ex = (cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                           initializer=_exit_with_parent, initargs=(os.getpid(),))
                    if self.workers > 0 else None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._ex is not None:
            self._ex.shutdown(cancel_futures=True)
        self._ex = None

    def map(self, items: Iterable, fn: Callable | None = None) -> list:
        """[fn(x) for x in items], spread over the workers in small chunks."""
        fn = fn or self.fn
        items = list(items)
        if self._ex is None:
            return [fn(x) for x in items]
        chunk = max(1, min(16, len(items) // (4 * self.workers) or 1))
        return list(self._ex.map(fn, items, chunksize=chunk))

    def submit(self, *args, fn: Callable | None = None) -> Callable[[], list]:
        """Start `fn(*args)` where the last argument is a list that `fn` maps to a list of the same
        length: the list is cut into about 2 x workers chunks, one job each. Returns a thunk that
        waits and concatenates the results in order."""
        fn = fn or self.fn
        *lead, items = args
        if self._ex is None:
            return lambda: fn(*lead, items)
        per = max(1, -(-len(items) // (2 * self.workers)))
        futs = [self._ex.submit(fn, *lead, items[i:i + per]) for i in range(0, len(items), per)]
        return lambda: [x for f in futs for x in f.result()]


def _verify_job(args) -> Verdict:
    return verify_one(*args)


def verify_records(pool: WorkerPool, records: Iterable[dict], name: str | None = None) -> list[Verdict]:
    """Verdicts for records in order, each by `name` or the verifier the record names."""
    return pool.map([(r, name) for r in records], _verify_job)


def verify_many(records: Iterable[dict], workers: int = 2, name: str | None = None) -> list[Verdict]:
    """Verdicts for records in order, verified in parallel over `workers` CPU processes."""
    with WorkerPool(workers) as pool:
        return verify_records(pool, records, name)
