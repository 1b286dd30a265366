"""XLA_FLAGS for the test processes and the CLI subprocesses they start.

The suite compiles thousands of tiny programs, most run a few times, so compile time is what
counts: XLA:CPU's older elemental fusion emitters (--xla_cpu_use_fusion_emitters=false) compile
them in about a third of the time the MLIR fusion emitters take (test_grpo.py + test_losses.py,
cold cache: 95 -> 34 compile s, 94 -> 56 CPU s; the same tests pass). Users' runs keep XLA's
defaults; only the tests set this.
"""

COMPILE_FAST = "--xla_cpu_use_fusion_emitters=false"


def xla_flags(devices: int | None = None) -> str:
    """XLA_FLAGS with `devices` simulated CPU devices (None: jax's default, one)."""
    dev = "" if devices is None else f"--xla_force_host_platform_device_count={devices} "
    return dev + COMPILE_FAST

