"""The plan as a table (stdout), plan.json, and the one sentence when a program does not fit."""

from __future__ import annotations

import json
import os

GIB = 2 ** 30


def _gib(b) -> str:
    return f"{b / GIB:.3g}"


def _bytes(b) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{int(b)} B"


def table(plan: dict) -> str:
    t = plan["target"]
    head = (f"rossjax plan: {plan['command']} ({plan['config']}) on {t['topology']} x "
            f"{t['slices']} slice(s): {t['devices']} x {t['device_kind']} devices, {t['hosts']} "
            f"host(s), mesh {plan['mesh']}, {_gib(t['hbm_per_device'])} GiB HBM per device "
            f"(TPU compiler, libtpu {plan['libtpu']}).")
    lines = [head, ""]
    cols = ("program", "args", "out", "alias", "temps", "code", "peak GiB", "fits", "margin GiB",
            "step s*", "MFU*", "compile s")
    rows = []
    for p in plan["programs"]:
        m = p["memory"]
        rows.append((p["program"], _gib(m["arguments"]), _gib(m["outputs"]), _gib(m["aliased"]),
                     _gib(m["temporaries"]), _gib(m["generated_code"]), _gib(m["peak"]),
                     "FITS" if p["fits"] else "DOES NOT FIT", _gib(p["margin"]),
                     f"{p['estimate']['step_s']:.3g}", f"{100 * p['estimate']['mfu']:.0f}%",
                     f"{p['compile_s']:.0f}"))
    widths = [max(len(str(r[i])) for r in rows + [cols]) for i in range(len(cols))]
    fmt = lambda r: "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w)
                              for i, (v, w) in enumerate(zip(r, widths)))
    lines += [fmt(cols), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    lines.append("")
    for p in plan["programs"]:
        if p.get("note"):
            lines.append(f"{p['program']}: {p['what']}; {p['note']}.")
            continue
        c = p["collectives"]
        coll = ", ".join(f"{op} {v['count']} ({_bytes(v['bytes'])})" for op, v in c.items()
                         if v["count"])
        runs = ", ".join(f"{op} {v['count']} ({_bytes(v['bytes'])})"
                         for op, v in p.get("collectives_per_step", {}).items() if v["count"])
        cost = p["cost"]
        lines.append(f"{p['program']}: {p['what']}; {cost['flops'] / 1e12:.3g} TFLOP and "
                     f"{_bytes(cost['bytes_accessed'])} per device per call "
                     f"({p['estimate']['bound']}-bound); Mosaic kernels {p['mosaic_kernels']}; "
                     f"collectives in the HLO: {coll or 'none'}; run per call: "
                     f"{runs or 'none'}.")
    lines.append("* estimates, not measurements: a roofline from the chip's published peak "
                 "FLOP/s and HBM bandwidth over max(cost_analysis FLOPs, model FLOPs with remat) "
                 "and cost_analysis bytes (which count a loop body once; the engine decode's "
                 "steps read at least the weights and the cache each); MFU = model FLOPs (6N "
                 "per token + attention, 2N forward-only) over that time. Collectives 'in the HLO' count instructions "
                 "(a loop body once), 'run per call' times the loops' trip counts; bytes are "
                 "result sizes per device.")
    return "\n".join(lines)


def not_fit_sentence(plan: dict) -> str | None:
    """One sentence naming each program that does not fit and the fields that would help."""
    bad = [p for p in plan["programs"] if not p["fits"]]
    if not bad:
        return None
    parts = [f"{p['program']} needs {_gib(p['memory']['peak'])} GiB per device of "
             f"{_gib(p['hbm'])} GiB (temporaries {_gib(p['memory']['temporaries'])} GiB)"
             for p in bad]
    knobs = list(dict.fromkeys(k for p in bad for k in p["knobs"]))
    return (f"rossjax plan: DOES NOT FIT on {plan['target']['topology']}: {'; '.join(parts)}; "
            f"try {', '.join('--config.' + k for k in knobs)} "
            f"(or a larger slice).")


def write_json(plan: dict, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(plan, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path
