"""Compile one program for the target devices and read what the TPU compiler says about it.

    figures = compile.analyze(program, chip, mesh)

Memory is `compiled.memory_analysis()` per device, unchanged: arguments + outputs - aliased
(donated state written in place) + temporaries + generated code is the peak the plan compares
with the chip's HBM. Collectives are counted in the compiled HLO text, bytes being each one's
result size per device: `collectives` counts each instruction once, so one inside a loop body
(the layer scan, micro-batches, the LM-head chunks, the compiler's windowed einsums) counts once
however many times it runs; `collectives_per_step` counts it times the trip counts of the loops
around it, what one call moves (docs/tpu.md: on an fsdp mesh most are the collective-permutes of
windowed einsums). FLOPs and bytes accessed are `cost_analysis()`'s, which
also counts a loop body once (the layer scan: measured 4.1 TFLOP per device for a 1B step whose
model FLOPs are 64 TFLOP per device) and never looks inside a Pallas kernel. The step time is a
roofline estimate from the chip's published peaks: compute at peak for the larger of those FLOPs
and the model's (6N per token + attention, x 8/6 with remat recomputing the forward; 2N for a
forward-only program), HBM traffic (the larger of cost_analysis's bytes and the program's
`min_bytes`, the engine decode's weights and cache read every step) at full bandwidth, whichever
is slower; MFU puts the model FLOPs over it. Estimates, not
measurements (docs/deviations.md).
"""

from __future__ import annotations

import re
import time

from rossjax.models.kernels import activations

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 0.5, "u4": 0.5,
          "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
# `%name = TYPE op(` with op a collective or its async -start half (the -done half is skipped)
_OP = re.compile(r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(.+?)\s+(" + "|".join(COLLECTIVES)
                 + r")(?:-start)?\(", re.M)
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
# Mosaic (Pallas TPU) kernels are custom calls with this target in the compiled HLO.
MOSAIC = 'custom_call_target="tpu_custom_call"'


def _array_bytes(type_text: str) -> int:
    """Largest array in an HLO result type (a -start tuple holds operand and result)."""
    best = 0
    for dt, dims in _ARRAY.findall(type_text):
        if dt not in _BYTES:
            continue
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        best = max(best, int(n * _BYTES[dt]))
    return best


def collectives(hlo_text: str) -> dict:
    out = {op: {"count": 0, "bytes": 0} for op in COLLECTIVES}
    for type_text, op in _OP.findall(hlo_text):
        out[op]["count"] += 1
        out[op]["bytes"] += _array_bytes(type_text)
    return out


# A computation's header line in HLO text (instructions are indented), a while loop's condition
# and body, the computations an instruction calls.
_COMP = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_WHILE = re.compile(r"\swhile\(.*?condition=%([\w.\-]+), body=%([\w.\-]+)")
_CALLS = re.compile(r"(?:calls|to_apply|branch_computations)=\{?((?:%[\w.\-]+,?\s*)+)\}?")


def _computations(hlo_text: str) -> tuple[dict, str]:
    """({computation name: its instruction lines}, the entry computation's name)."""
    comps, cur, entry = {}, None, None
    for line in hlo_text.splitlines():
        m = _COMP.match(line)
        if m and not line.startswith(" "):
            cur = m.group(1)
            comps[cur] = []
            entry = cur if line.startswith("ENTRY") else entry
        elif cur is not None:
            comps[cur].append(line)
    return comps, entry


def _trip_count(cond_lines) -> int:
    """A compiled loop's trip count: the bound its condition compares the counter with (`i < N`,
    the counter from 0, as XLA writes scans and its windowed einsums); 1 where it is not that."""
    body = "\n".join(cond_lines)
    bounds = [int(b) for b in re.findall(r"constant\((\d+)\)", body)]
    return bounds[-1] if bounds and "direction=LT" in body else 1


def collectives_per_step(hlo_text: str) -> dict:
    """Like `collectives`, each instruction counted as often as it runs in one call: times the
    trip counts of the while loops around it (the layer scan, the LM-head chunks, the TPU
    compiler's windowed einsums). A loop whose bound is not a constant counts once."""
    comps, entry = _computations(hlo_text)
    calls = {name: [] for name in comps}
    for name, lines in comps.items():
        for line in lines:
            w = _WHILE.search(line)
            if w:
                calls[name].append((w.group(2), _trip_count(comps.get(w.group(1), []))))
                continue
            for group in _CALLS.findall(line):
                calls[name] += [(c, 1) for c in re.findall(r"%([\w.\-]+)", group)]
    # HLO text defines a computation before its callers: backwards, every caller comes first.
    runs = dict.fromkeys(comps, 0)
    if entry in runs:
        runs[entry] = 1
    for name in reversed(list(comps)):
        for callee, trips in calls[name]:
            if callee in runs:
                runs[callee] += runs[name] * trips
    out = {op: {"count": 0, "bytes": 0} for op in COLLECTIVES}
    for name, lines in comps.items():
        n = runs.get(name) or 1
        for type_text, op in _OP.findall("\n".join(lines)):
            out[op]["count"] += n
            out[op]["bytes"] += n * _array_bytes(type_text)
    return out


def _cost(compiled) -> dict:
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    ca = dict(ca or {})
    return {"flops": float(ca.get("flops", 0.0)),
            "bytes_accessed": float(ca.get("bytes accessed", 0.0)),
            "transcendentals": float(ca.get("transcendentals", 0.0))}


def memory(compiled) -> dict:
    m = compiled.memory_analysis()
    out = {"arguments": int(m.argument_size_in_bytes), "outputs": int(m.output_size_in_bytes),
           "aliased": int(m.alias_size_in_bytes), "temporaries": int(m.temp_size_in_bytes),
           "generated_code": int(m.generated_code_size_in_bytes)}
    out["peak"] = (out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
                   + out["generated_code"])
    return out


def lower_and_compile(program, mesh):
    """(compiled, lower seconds, compile seconds); traced for `mesh`'s devices (kernels pick
    the target's platform, models/kernels/activations.py)."""
    t0 = time.perf_counter()
    with activations.target(mesh):
        lowered = program.jitted.lower(*program.args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    return compiled, t1 - t0, time.perf_counter() - t1


# The TPU compiler refuses a program whose temporaries exceed the chip's HBM, in these words.
_OOM = re.compile(r"memory required for HLO temporaries \(([\d.]+)([KMGT])\) exceeds available "
                  r"HBM \(([\d.]+)([KMGT])\)")
_UNIT = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def _shard_bytes(args) -> int:
    """Per-device bytes of abstract arguments (their shard shapes)."""
    import jax
    import numpy as np

    total = 0
    for x in jax.tree.leaves(args):
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) else x.shape
        total += int(np.prod(shape)) * np.dtype(x.dtype).itemsize
    return total


def _refused(program, message: str):
    """(memory, note) of a program the compiler refused for lack of HBM, or None."""
    m = _OOM.search(message)
    if not m:
        return None
    temps = int(float(m.group(1)) * _UNIT[m.group(2)])
    args = _shard_bytes(program.args)
    mem = {"arguments": args, "outputs": 0, "aliased": 0, "temporaries": temps,
           "generated_code": 0, "peak": args + temps}
    return mem, f"refused by the TPU compiler: {m.group(0)}"


def analyze(program, chip, mesh, *, remat: bool = True) -> dict:
    """The plan's figures for one program (see the module docstring). A program the compiler
    refuses for lack of HBM does not fit: its temporaries are the compiler's figure, its
    arguments their shard sizes, and the rest of the figures are empty."""
    try:
        compiled, lower_s, compile_s = lower_and_compile(program, mesh)
    except Exception as e:   # jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED
        refused = _refused(program, str(e))
        if refused is None:
            raise
        mem, note = refused
        return {"program": program.name, "what": program.what, "memory": mem,
                "hbm": chip.hbm_bytes, "fits": False, "margin": chip.hbm_bytes - mem["peak"],
                "collectives": {op: {"count": 0, "bytes": 0} for op in COLLECTIVES},
                "collectives_per_step": {op: {"count": 0, "bytes": 0} for op in COLLECTIVES},
                "mosaic_kernels": 0, "cost": {"flops": 0.0, "bytes_accessed": 0.0,
                                              "transcendentals": 0.0},
                "model_flops": program.model_flops,
                "estimate": {"step_s": 0.0, "bound": "none", "mfu": 0.0},
                "lower_s": 0.0, "compile_s": 0.0, "knobs": list(program.knobs), "note": note}
    mem = memory(compiled)
    cost = _cost(compiled)
    text = compiled.as_text()
    n = program.devices or mesh.devices.size
    # Roofline (estimate): the slower of compute at peak and HBM traffic at full bandwidth.
    recompute = 8 / 6 if remat and program.training else 1.0
    hw_flops = max(cost["flops"], program.model_flops * recompute / n)
    t_flops = hw_flops / chip.peak_flops
    t_bytes = max(cost["bytes_accessed"], program.min_bytes) / chip.hbm_bw
    step_s = max(t_flops, t_bytes)
    mfu = program.model_flops / n / chip.peak_flops / step_s if step_s > 0 else 0.0
    return {
        "program": program.name, "what": program.what,
        "memory": mem, "hbm": chip.hbm_bytes, "fits": mem["peak"] <= chip.hbm_bytes,
        "margin": chip.hbm_bytes - mem["peak"],
        "collectives": collectives(text),
        "collectives_per_step": collectives_per_step(text),
        "mosaic_kernels": text.count(MOSAIC),
        "cost": cost, "model_flops": program.model_flops,
        "estimate": {"step_s": step_s, "bound": "compute" if t_flops >= t_bytes else "memory",
                     "mfu": mfu},
        "lower_s": lower_s, "compile_s": compile_s, "knobs": list(program.knobs),
    }
