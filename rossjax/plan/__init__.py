"""`rossjax plan`: every program a command compiles, compiled by the TPU compiler for a named
slice on whatever host runs it (a CPU machine is enough), and whether each fits.

    plan = rossjax.plan.run(cfg, "v5e:2x4", num_slices=1, out="plan.json")

topologies.py names slices and their chips (libtpu gives the compile-only devices), programs.py
builds the command's programs with the command's own step builders on abstract inputs (no
weights), compile.py compiles them and reads memory_analysis / cost_analysis / the HLO's
collectives, report.py prints the table and writes plan.json. The mesh and rules are the
config's (`config.mesh`, `config.sharding_rules`), over the slice's devices.
"""

from __future__ import annotations

import importlib.metadata
import time

from rossjax import sharding
from rossjax.plan import compile as compile_lib, programs as programs_lib, topologies


def _libtpu_version() -> str:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def run(cfg, topology: str, *, num_slices: int = 1, prompt_len: int = 512,
        seq_len: int = 4096, config_name: str = "") -> dict:
    """The plan of `cfg` on `topology` (a dict: target, mesh, programs; see report.py).
    prompt_len: grpo's prompt tokens per row; seq_len: extract's row length."""
    devs = topologies.devices(topology, num_slices)
    chip, _ = topologies.parse(topology)
    part = sharding.partitioner_from_config(cfg, devs, num_slices=num_slices)
    t0 = time.perf_counter()
    progs = programs_lib.for_config(cfg, part, prompt_len=prompt_len, seq_len=seq_len)
    # extract's model is a one-string spec (preset:NAME or a folder), not a section
    model = cfg.model if hasattr(cfg.model, "get") else {"path": str(cfg.model)}
    remat = str(model.get("remat_policy", "none")) != "none"
    results = [compile_lib.analyze(p, chip, part.mesh, remat=remat) for p in progs]
    return {"command": programs_lib.command_of(cfg), "config": config_name,
            "model": {"path": model.get("path", ""), "preset": model.get("preset", ""),
                      "remat_policy": model.get("remat_policy", ""),
                      "attention_impl": model.get("attention_impl", "")},
            "target": topologies.describe(topology, devs) | {"slices": int(num_slices)},
            "mesh": dict(part.mesh.shape), "libtpu": _libtpu_version(),
            "programs": results, "wall_s": time.perf_counter() - t0}
