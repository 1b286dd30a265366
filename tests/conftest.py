"""Test set-up: 8 simulated CPU devices (set before jax is imported anywhere), offline hub, and
JAX's persistent compilation cache shared by every test process and the CLI subprocesses they
start (the suite compiles the same tiny programs in many processes; a fresh clone starts empty)."""

import os

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from xla_flags import xla_flags  # noqa: E402  (tests/ is on sys.path: pytest put it there)

os.environ.setdefault("XLA_FLAGS", xla_flags(8))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Environment variables, not jax.config: subprocesses (`python -m rossjax.cli ...`) inherit them.
# Every program is cached (no minimum compile time or size): most of the suite's programs compile
# in well under jax's default 1 s threshold, yet there are thousands of them.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_ROOT, "build", "jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# A size cap turns on jax's file lock around every cache read and write: without it an entry is
# written in place, and the other worker compiling the same program can read it half-written.
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))
# The suite's programs are tiny and most run a few times, so XLA's backend optimization costs more
# than it saves: LLVM at -O0 without its expensive passes (jax_disable_most_optimizations; HLO
# fusion and layouts are unchanged). Measured on test_grpo, test_mixed_precision and
# test_models_attention, cold cache: 218 -> 142 CPU seconds, the same 31 passes. The repro runs,
# which train for hundreds of steps, take it out (tests/repro_quick.py).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

pytest_plugins = ["suite_plugin"]  # slowest modules first; XLA compile counts in the summary


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_leaked_rossjax_env():
    """A test that runs a CLI in-process (parse_config sets $ROSSJAX_SANDBOX_REQUIRE for the
    sandboxes it starts) must not change later tests on the same xdist worker: every ROSSJAX_*
    variable is put back as it was."""
    before = {k: v for k, v in os.environ.items() if k.startswith("ROSSJAX_")}
    yield
    for k in [k for k in os.environ if k.startswith("ROSSJAX_")]:
        if k not in before:
            del os.environ[k]
    os.environ.update(before)
