"""One pool of CPU worker processes, shared by curation (verify every row) and GRPO (score the
candidates of a step while the device computes).

Workers are separate processes (spawn: safe even if the parent imported jax) and each job runs in
a worker's main thread, where math-verify's signal-based timeouts work; code verifiers start
their sandboxes from there. Results always come back in input order. workers=0 runs every job in
this process (lazily, for `submit`). `Worker` is one such process holding one stateful object
(an agent environment) between calls, killed and replaced when a call overruns its limit.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import threading
import time
import weakref
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


# How long a worker process may take to spawn, import and build its object. Generous: 32 env
# workers spawning at once on 2 busy cores took over 60 s; a start that hangs is still bounded.
START_TIMEOUT_S = 300.0

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


class WorkerError(RuntimeError):
    """The hosted object raised: `kind` is the exception's class name, the message its text."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class WorkerDied(RuntimeError):
    """The worker process is gone (it exited, was killed, or overran a call's timeout)."""


class WorkerTimeout(WorkerDied):
    """A call overran its timeout; the process was killed (a running call cannot be stopped)."""


def _serve(conn, parent: int, factory: Callable, args: tuple, kwargs: dict, attrs: tuple):
    """A Worker's process: build the object, report `attrs`, then answer calls until told to stop
    (None) or the pipe closes. Calls run in this main thread, one at a time."""
    _exit_with_parent(parent)
    try:
        obj = factory(*args, **kwargs)
        conn.send(("ok", {a: getattr(obj, a, None) for a in attrs}))
    except Exception as e:
        conn.send(("err", type(e).__name__, str(e)[:2000]))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        name, a, kw = msg
        try:
            v = getattr(obj, name)
            conn.send(("ok", v(*a, **kw) if callable(v) else v))
        except Exception as e:  # includes a result that does not pickle
            conn.send(("err", type(e).__name__, str(e)[:2000]))


def _stop(proc, conn):
    try:
        conn.send(None)
    except (OSError, ValueError):
        pass
    proc.join(2.0)
    if proc.is_alive():
        proc.kill()
        proc.join(5.0)
    conn.close()


class Worker:
    """One spawned CPU process (as the pool's workers: spawn, exits with its parent, never
    imports jax unless the hosted code does) that holds ONE stateful object, built there by
    `factory(*args, **kwargs)`, and runs its methods by name: `w.call("step", calls, timeout=5)`.
    For state a pool job cannot keep (an agent environment between steps). A call past its
    timeout kills the process and raises WorkerTimeout; a process that dies raises WorkerDied;
    the object's own exception raises WorkerError (the worker lives on). Arguments and results
    must pickle. After WorkerDied the worker is spent: make a new one."""

    def __init__(self, factory: Callable, args: tuple = (), kwargs: dict | None = None,
                 attrs: tuple = ()):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        # daemon: never outlives this process (its object may not start multiprocessing children)
        self._proc = ctx.Process(target=_serve, daemon=True, name="rossjax-worker",
                                 args=(child, os.getpid(), factory, tuple(args), dict(kwargs or {}),
                                       tuple(attrs)))
        self._proc.start()
        child.close()
        self._info = None
        self.dead = ""              # why the worker is spent ("" while it is usable)
        self._fin = weakref.finalize(self, _stop, self._proc, self._conn)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def info(self, timeout: float) -> dict:
        """The `attrs` of the built object (waits for the process to start and build it)."""
        if self._info is None:
            try:
                self._info = self._recv(timeout, "start")
            except WorkerError as e:  # the factory raised; the process has returned
                self._lose(f"building the worker's object raised {e}")
                raise
        return self._info

    def call(self, name: str, *args, timeout: float, **kwargs):
        if self._info is None:
            self.info(max(timeout, START_TIMEOUT_S))  # start-up is not the call's time
        if self.dead:
            raise WorkerDied(self.dead)
        try:
            self._conn.send((name, args, kwargs))
        except (OSError, ValueError) as e:
            self._lose(f"the worker's pipe is closed ({e})")
            raise WorkerDied(self.dead) from None
        return self._recv(timeout, name)

    def _recv(self, timeout: float, what: str):
        if self.dead:
            raise WorkerDied(self.dead)
        try:
            ready = self._conn.poll(max(0.0, timeout))
            msg = self._conn.recv() if ready else None
        except (EOFError, OSError):
            self._proc.join(5.0)
            self._lose(f"the worker process (pid {self.pid}) exited with code {self._proc.exitcode} "
                       f"during {what}")
            raise WorkerDied(self.dead) from None
        if msg is None:
            self._lose(f"{what} took longer than {timeout:.3g} s; the worker (pid {self.pid}) "
                       "was killed")
            raise WorkerTimeout(self.dead)
        if msg[0] == "err":
            raise WorkerError(msg[1], msg[2])
        return msg[1]

    def _lose(self, why: str):
        self.dead = self.dead or why
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(5.0)

    def close(self):
        """Stop the process (it finishes the call it runs, for at most 2 s)."""
        self.dead = self.dead or "closed"
        self._fin()
