"""The host heap policy of a CPU run: `ROSSJAX_HOST_HEAP=keep` keeps freed memory in the process.

On CPU, XLA takes every step's temporaries (GBs for a GRPO update) from glibc malloc, which
hands large freed blocks back to the kernel. On a VM that reports free pages to its host
(Firecracker's `page_reporting`, virtio-balloon free page reporting) the next step then pays a
fresh page fault per 4 KiB, far dearer once the host has reclaimed the page: on an Intel Xeon
VM the 8 x 8 x 64 GRPO update spends 1.0 s in the kernel when it runs back to back and 2.5-5 s
when anything else (sampling, the peer's step, a sleep) runs in between (docs/cpu_kinds.md).

`keep` sets glibc's malloc to one arena, no mmap'd blocks and no trimming, so freed pages stay
mapped and the next step reuses them without a fault. The price is that the process never
shrinks and one heap can fragment: the resident size is the run's high-water mark or more (a
TRL step run in the same process after a 16 GB rossjax update took it past 21 GB), so run one
trainer per process under it. It is opt-in, set in the environment before the process starts
(rossjax applies it on import, before jax creates its threads); `rossjax bench` prints which
policy each side ran under. No jax: layer 0."""

from __future__ import annotations

import ctypes
import os
import sys

ENV = "ROSSJAX_HOST_HEAP"
# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8

_applied: str | None = None


def policy() -> str:
    """The policy this process runs under: "keep" or "default" (glibc's own)."""
    return _applied or "default"


def apply_from_env() -> str:
    """Apply $ROSSJAX_HOST_HEAP once per process ("keep" or unset/"default"); returns the policy.
    A value it does not know is an error: a typo must not silently measure the other policy."""
    global _applied
    if _applied is not None:
        return _applied
    want = os.environ.get(ENV, "default").strip().lower() or "default"
    if want not in ("keep", "default"):
        raise ValueError(f"${ENV}={os.environ[ENV]!r}: expected 'keep' or 'default'")
    if want == "keep":
        if not sys.platform.startswith("linux"):
            raise ValueError(f"${ENV}=keep needs glibc's mallopt (Linux); this is {sys.platform}")
        libc = ctypes.CDLL("libc.so.6")
        # the arena cap first: every thread created later shares the main heap, whose top is
        # never trimmed (-1: no threshold) and which never maps a block of its own
        for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)):
            if libc.mallopt(param, value) != 1:
                raise OSError(f"${ENV}=keep: mallopt({param}, {value}) failed")
    _applied = want
    return want
