"""$ROSSJAX_HOST_HEAP=keep: freed blocks stay mapped, so touching a fresh one of the same size
faults no pages in; glibc's default hands them back and faults them in again."""

import os
import subprocess
import sys

import pytest

PROBE = r"""
import resource, numpy as np
import rossjax.hostheap as h
np._core.multiarray._set_madvise_hugepage(False)  # count 4 KiB pages, as XLA's buffers fault
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
a = np.ones(64 << 18, np.float32); del a          # 64 MiB: over glibc's largest mmap threshold
f0 = faults(); b = np.ones(64 << 18, np.float32); f1 = faults()
print(h.policy(), f1 - f0)
"""


def _run(value):
    env = {k: v for k, v in os.environ.items() if k != "ROSSJAX_HOST_HEAP"}
    if value is not None:
        env["ROSSJAX_HOST_HEAP"] = value
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_keep_reuses_freed_pages_and_default_does_not():
    keep, default = _run("keep"), _run(None)
    assert keep.returncode == 0 and default.returncode == 0, keep.stderr + default.stderr
    policy, kept_faults = keep.stdout.split()
    assert policy == "keep" and int(kept_faults) < 1000          # the 64 MiB came back mapped
    policy, default_faults = default.stdout.split()
    assert policy == "default" and int(default_faults) > 10_000  # 16,384 pages faulted in again


def test_an_unknown_policy_is_refused_by_name():
    r = _run("kep")
    assert r.returncode != 0 and "$ROSSJAX_HOST_HEAP='kep': expected 'keep' or 'default'" in r.stderr
