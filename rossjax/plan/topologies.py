"""TPU slices by name, as abstract devices the TPU compiler targets from any host.

    devices = topologies.devices("v5e:2x4")            # 8 compile-only "TPU v5 lite" devices
    chip = topologies.chip("v5e")                       # HBM, peak bf16 FLOP/s, HBM bandwidth

A name is GENERATION:SHAPE, the chip grid of the slice ("v5e:2x4", "v5p:4x4x4", "v6e:16x16",
"v4:2x2x2"); "v5e-8"-style names (GENERATION-CHIPS) pick the usual shape for that count. Hosts
hold 2x2x1 chips (v4, v5p: 4 chips; v5e, v6e: a 2x2 quarter of the 8-chip host board, the unit
the topology API takes), so a slice of more chips than that is multi-host. v4 and v5p run as
megacore (one device per chip), as Cloud TPU VMs do.

The devices come from libtpu (the `jax[tpu]` extra); `missing()` says why they cannot when it is
not installed. The chip table holds published figures (Cloud TPU documentation, per chip);
roofline estimates in the plan are built on them (docs/deviations.md).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os

from rossjax.errors import ConfigError

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
    generation: str
    device_kind: str       # what jax reports for its devices
    hbm_bytes: int         # per chip
    peak_flops: float      # dense bf16 FLOP/s per chip (published)
    hbm_bw: float          # bytes/s per chip (published)
    dims: int              # 2 (torus-free 2D) or 3
    chip_config: str = "default"


# Published per-chip figures: cloud.google.com/tpu/docs/{v4,v5e,v5p,v6e}.
CHIPS = {
    "v4": Chip("v4", "TPU v4", 32 * GIB, 275e12, 1228e9, 3, "megacore"),
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GIB, 197e12, 819e9, 2),
    "v5p": Chip("v5p", "TPU v5", 95 * GIB, 459e12, 2765e9, 3),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GIB, 918e12, 1640e9, 2),
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e", "trillium": "v6e"}
# GENERATION-CHIPS -> shape (the slice shapes Cloud TPU offers for the common counts).
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
              256: "16x16"}
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
              256: "4x8x8", 512: "8x8x8"}
HOST_BOUNDS = (2, 2, 1)


def missing() -> str | None:
    """Why TPU topologies are unavailable here, or None when libtpu is installed."""
    if importlib.util.find_spec("libtpu") is None:
        return ("libtpu is not installed (the TPU compiler): pip install 'rossjax[tpu]', or "
                "`make .tpu/.installed` for the tests")
    return None


def parse(name: str) -> tuple[Chip, str]:
    """'v5e:2x4' or 'v5e-8' -> (chip, '2x4'); a ConfigError names the known forms."""
    raw = name.strip().lower()
    gen, sep, rest = raw.partition(":") if ":" in raw else raw.partition("-")
    gen = _ALIASES.get(gen, gen)
    if gen not in CHIPS or not sep or not rest:
        raise ConfigError(f"--topology={name!r}: use GENERATION:SHAPE (v5e:2x4, v5p:4x4x4, "
                          f"v6e:16x16) or GENERATION-CHIPS (v5e-8, v5p-64); generations "
                          f"{', '.join(CHIPS)}.")
    chip = CHIPS[gen]
    if sep == "-":
        n = int(rest) if rest.isdigit() else 0
        if gen in ("v4", "v5p") and n % 2 == 0 and n // 2 in _SHAPES_3D:
            n //= 2   # v4-8 / v5p-8 count TensorCores: two per (megacore) chip
        shapes = _SHAPES_3D if chip.dims == 3 else _SHAPES_2D
        if n not in shapes:
            raise ConfigError(f"--topology={name!r}: no standard {gen} slice of {rest}; give "
                              f"the shape, e.g. {gen}:{next(iter(shapes.values()))}.")
        return chip, shapes[n]
    dims = rest.split("x")
    if not all(d.isdigit() and int(d) > 0 for d in dims) or len(dims) not in (2, 3):
        raise ConfigError(f"--topology={name!r}: the shape {rest!r} is not AxB or AxBxC.")
    if len(dims) != chip.dims and not (chip.dims == 2 and len(dims) == 3 and dims[2] == "1"):
        raise ConfigError(f"--topology={name!r}: {gen} slices are {chip.dims}-D "
                          f"({'AxBxC' if chip.dims == 3 else 'AxB'}).")
    return chip, "x".join(dims[:chip.dims])


def num_chips(shape: str) -> int:
    return math.prod(int(d) for d in shape.split("x"))


def _quiet_libtpu():
    """libtpu looks for a TPU VM's metadata when it loads and prints warnings to stderr on any
    other host; there is no TPU to run on here, so tell it so (before its first load). It also
    takes /tmp/libtpu_lockfile, one process per chip set: compile-only devices own no chip, so
    several plans (test workers) may load it at once."""
    for k, v in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_ACCELERATOR_TYPE", "v5litepod-8"),
                 ("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_WORKER_ID", "0"),
                 ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
        os.environ.setdefault(k, v)


def devices(name: str, num_slices: int = 1):
    """The compile-only devices of the named slice (x num_slices, joined by DCN)."""
    why = missing()
    if why:
        raise ConfigError(f"the TPU compiler is missing: {why}.")
    chip, shape = parse(name)
    _quiet_libtpu()
    from jax.experimental import topologies

    dims = [int(d) for d in shape.split("x")] + [1] * (3 - chip.dims)
    # a host holds at most HOST_BOUNDS of the slice (all of a smaller one)
    bounds = tuple(min(d, b) for d, b in zip(dims, HOST_BOUNDS))
    topo_name = f"{chip.generation}:{shape}"
    try:
        desc = topologies.get_topology_desc(
            platform="tpu", topology_name=topo_name, chip_config_name=chip.chip_config,
            chips_per_host_bounds=bounds, num_slices=int(num_slices))
    except Exception as e:  # the topology API's errors are plain RuntimeErrors/XlaRuntimeErrors
        raise ConfigError(f"--topology={name!r} (num_slices {num_slices}): the TPU topology API "
                          f"refused it: {str(e).splitlines()[0]}") from None
    return list(desc.devices)


def describe(name: str, devs) -> dict:
    chip, shape = parse(name)
    hosts = len({d.process_index for d in devs})
    slices = len({getattr(d, "slice_index", 0) for d in devs})
    return {"topology": f"{chip.generation}:{shape}", "device_kind": devs[0].device_kind,
            "devices": len(devs), "hosts": hosts, "slices": slices,
            "hbm_per_device": chip.hbm_bytes, "peak_flops_per_device": chip.peak_flops,
            "hbm_bw_per_device": chip.hbm_bw}
