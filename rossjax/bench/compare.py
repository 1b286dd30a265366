"""What makes a benchmark's two sides comparable: the machine, both sides' settings on one line,
the sameness check each bench asserts (pure functions: a sentence when it fails, None when it
holds), and the work of each side's step (FLOPs and bytes), hardware-independent.

Work: rossjax's from XLA's cost analysis of the compiled program (`compiled.cost_analysis()`:
every HLO op's FLOPs, and the bytes each op reads and writes after fusion); the peer's from
torch's FLOP counter (`FlopCounterMode`: matmuls and attention) with the bytes each aten op
reads and writes (no fusion in eager torch). XLA's count takes a loop body once whatever its
trip count, so the benches cost a loop-free variant of the same step (layers unrolled, one
micro-batch, one loss chunk, dense attention: the same arithmetic) and say so when a loop is
left. Both sides count attention as the full square (the FLOP counter's convention).
"""

from __future__ import annotations

import os
import platform

# The instruction-set flags that decide XLA:CPU's and MKL/oneDNN's kernels.
ISA = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
       "amx_bf16", "amx_tile")


def cpu_info(path: str = "/proc/cpuinfo") -> tuple[str, list[str]]:
    """(CPU model name, the ISA flags it has, in ISA's order)."""
    name, flags = "", set()
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("model name") and not name:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return name or platform.processor() or platform.machine(), [f for f in ISA if f in flags]


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_line() -> str:
    """The CPU every figure below was measured on: model, ISA flags, cores, load."""
    name, flags = cpu_info()
    return (f"machine: {name} ({' '.join(flags) or 'no AVX'}), {cores()} cores, load average "
            f"{os.getloadavg()[0]:.1f}")


def settings_line(*, peer_shares_heap: bool = True, **sides: dict) -> str:
    """One line: each side's settings, e.g. settings_line(rossjax={...}, torch={...}), and the
    host heap policy ($ROSSJAX_HOST_HEAP, rossjax/hostheap.py): the peer runs under it too when
    it runs in a process that imports rossjax (peer_shares_heap), else under glibc's default."""
    from rossjax import hostheap

    heap = hostheap.policy()
    who = "both sides" if peer_shares_heap or heap == "default" else "rossjax; the peer default"
    return "settings: " + " | ".join(
        f"{name} " + ", ".join(f"{k} {v}" for k, v in s.items()) for name, s in sides.items()
    ) + f" | host heap {heap} ({who})"


def xla_threads() -> str:
    # XLA:CPU's intra-op pool takes every schedulable core (tsl MaxParallelism).
    return f"{cores()} (all cores)"


def close(what: str, ours: float, theirs: float, *, rtol: float, atol: float = 0.0) -> str | None:
    """None when |ours - theirs| <= atol + rtol * |theirs|, else the sentence saying by how much."""
    if abs(ours - theirs) <= atol + rtol * abs(theirs):
        return None
    rel = abs(ours - theirs) / max(abs(theirs), 1e-30)
    return (f"{what}: rossjax {ours:.6g} vs peer {theirs:.6g} differ by {rel:.2%} (tolerance "
            f"{rtol:g} relative + {atol:g} absolute), so the two sides did not do the same work")


def at_least(what: str, value: float, least: float) -> str | None:
    """None when value >= least, else the sentence."""
    if value >= least:
        return None
    return (f"{what} is {value:.1%}, below the {least:.0%} that says both sides computed the "
            f"same thing")


def verdict(prog: str, failures) -> int:
    """Prints each failed check (one sentence each, on stderr) and returns the exit status."""
    import sys

    bad = [f for f in failures if f]
    for f in bad:
        print(f"{prog}: sameness check failed: {f}.", file=sys.stderr)
    if not bad:
        print(f"{prog}: sameness checks passed")
    return 1 if bad else 0


def xla_work(compiled) -> dict:
    """{'flops', 'bytes', 'loops'} of a compiled program; loops: whether a while loop of more
    than one trip is left (XLA removes one-trip loops; a body is counted once: a lower bound)."""
    ca = compiled.cost_analysis()
    ca = (ca[0] if ca else {}) if isinstance(ca, (list, tuple)) else (ca or {})
    # threefry's loop (random-key arithmetic, a few integer ops) is no model work
    loops = any(" while(" in line and "threefry" not in line
                for line in compiled.as_text().splitlines())
    return {"flops": float(ca.get("flops", 0.0)), "bytes": float(ca.get("bytes accessed", 0.0)),
            "loops": loops}


def torch_work(fn):
    """(fn(), {'flops', 'bytes'}): fn run once under torch's FLOP counter and a byte counter
    (the bytes of every tensor an aten op reads or writes; views move none)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    _register_cpu_sdpa()
    seen = {"bytes": 0}

    def nbytes(x):
        return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0

    class Bytes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view:
                flat = torch.utils._pytree.tree_leaves((args, kwargs, out))
                seen["bytes"] += sum(nbytes(x) for x in flat)
            return out

    with FlopCounterMode(display=False) as fc, Bytes():
        result = fn()
    return result, {"flops": float(fc.get_total_flops()), "bytes": float(seen["bytes"])}


_REGISTERED = []


def _register_cpu_sdpa():
    """torch's counter knows the GPU attention kernels, not the CPU flash one sdpa runs here:
    the same count (2 matmuls of b x h x s_q x s_k x d forward, 4 backward; GQA counted over
    the query heads)."""
    if _REGISTERED:
        return
    import torch
    from torch.utils.flop_counter import register_flop_formula

    aten = torch.ops.aten

    def sq(q, k):
        b, h, s_q, d = q
        return 2 * b * h * s_q * k[2] * d

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
    def _fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
        return 2 * sq(query_shape, key_shape)

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
    def _bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
             **kwargs):
        return 4 * sq(query_shape, key_shape)

    _REGISTERED.append(True)


def work_line(what: str, ours: dict, peer: dict, peer_name: str, *, per: float = 1.0,
              unit: str = "step") -> str:
    """Both sides' FLOPs and bytes per `unit` (each figure divided by `per`) and the ratios
    peer / rossjax (> 1: rossjax does less work)."""
    f = lambda d, k: d[k] / per
    note = "; rossjax's program keeps a loop, counted once: a lower bound" if ours.get("loops") else ""
    return (f"  work per {unit} ({what}): rossjax {f(ours, 'flops') / 1e9:.4g} GFLOP, "
            f"{f(ours, 'bytes') / 1e9:.4g} GB | {peer_name} {f(peer, 'flops') / 1e9:.4g} GFLOP, "
            f"{f(peer, 'bytes') / 1e9:.4g} GB | ratio {peer_name} / rossjax: FLOPs "
            f"{peer['flops'] / max(ours['flops'], 1.0):.2f}x, bytes "
            f"{peer['bytes'] / max(ours['bytes'], 1.0):.2f}x{note}")
