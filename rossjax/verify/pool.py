"""Run verifiers over many records on CPU worker processes.

Workers are separate processes (spawn: safe even if the parent imported jax) whose verifiers run
in the worker's main thread, where math-verify's signal-based timeouts work. Code verifiers
start their sandboxes from there.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
from typing import Iterable

from rossjax.curate.verifiers.base import Verdict, get, names


def verifier_name(record: dict, default: str | None = None) -> str | None:
    """The record's `verifier.name`, else `task.domain` when that names a verifier, else default."""
    name = (record.get("verifier") or {}).get("name")
    if name:
        return name
    domain = (record.get("task") or {}).get("domain")
    return domain if domain in names() else default


def verify_one(record: dict, name: str | None = None) -> Verdict:
    """Never raises: an unknown verifier or a crash inside one is an undecided verdict."""
    name = name or verifier_name(record)
    if not name:
        return Verdict(None, "the record names no verifier (verifier.name or task.domain)")
    try:
        return get(name)(record)
    except Exception as e:
        return Verdict(None, f"verifier {name} error: {type(e).__name__}: {e}"[:300])


def _job(args):
    return verify_one(*args)


class VerifierPool:
    """`with VerifierPool(2) as pool: verdicts = pool.map(records)`; workers=0 runs inline."""

    def __init__(self, workers: int = 2):
        self.workers = workers
        self._ex = None

    def __enter__(self):
        if self.workers > 0:
            self._ex = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
        return self

    def __exit__(self, *exc):
        if self._ex is not None:
            self._ex.shutdown(cancel_futures=True)
        self._ex = None

    def map(self, records: Iterable[dict], name: str | None = None) -> list[Verdict]:
        jobs = [(r, name) for r in records]
        if self._ex is None:
            return [_job(j) for j in jobs]
        chunk = max(1, min(16, len(jobs) // (4 * self.workers) or 1))
        return list(self._ex.map(_job, jobs, chunksize=chunk))


def verify_many(records: Iterable[dict], workers: int = 2, name: str | None = None) -> list[Verdict]:
    """Verdicts for records in order, verified in parallel over `workers` CPU processes."""
    with VerifierPool(workers) as pool:
        return pool.map(records, name)
