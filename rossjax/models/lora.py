"""LoRA: low-rank adapters as a separate params tree, merged into the base functionally.

    adapters = init_lora(cfg, rng, rank=16, targets=("q", "v"))
    params = merge(base, adapters, alpha=32)        # W + (alpha / rank) A @ B, inside jit
    logits, _ = models.forward(cfg, params, tokens)

Adapter layout: {"layers": {"attn": {"q": {"a": [L, *in, r], "b": [L, r, *out]}, ...},
                            "mlp": {"gate": ...}}}
where *in / *out are the kernel's input / output dims (q/k/v: [d] -> [heads, head_dim],
o: [heads, head_dim] -> [d], gate/up: [d] -> [ffn], down: [ffn] -> [d]), so adapters carry the
same logical axis names as their kernel and shard with it. `b` starts at zero: an untouched
adapter leaves the model exactly as it was. The base tree is never modified or copied by the
caller: the reference model for a KL penalty is simply `base` with the adapters left off.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from rossjax.errors import ConfigError
from rossjax.sharding import as_partitioner

# target name -> (module, kernel name, number of input dims of the (unstacked) kernel)
TARGETS = {"q": ("attn", 1), "k": ("attn", 1), "v": ("attn", 1), "o": ("attn", 2),
           "gate": ("mlp", 1), "up": ("mlp", 1), "down": ("mlp", 1)}
GROUPS = {"attn": ("q", "k", "v", "o"), "mlp": ("gate", "up", "down"),
          "all": ("q", "k", "v", "o", "gate", "up", "down")}


def resolve_targets(targets) -> tuple[str, ...]:
    if isinstance(targets, str):
        targets = [t for t in targets.split(",") if t]
    out = []
    for t in targets:
        for name in GROUPS.get(t, (t,)):
            if name not in TARGETS:
                raise ConfigError(f"lora: field 'targets' entry {t!r} is not one of "
                                 f"{', '.join([*TARGETS, *GROUPS])}.")
            if name not in out:
                out.append(name)
    if not out:
        raise ConfigError("lora: field 'targets' is empty.")
    return tuple(out)


def _kernel_shapes(cfg):
    from rossjax.models import transformer

    return jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))["layers"]


def init_lora(cfg, rng, rank: int = 16, targets=("q", "k", "v", "o"), dtype=jnp.float32):
    """Adapters for `targets`: a ~ N(0, 1/rank) (Kaiming-like), b = 0."""
    if rank < 1:
        raise ConfigError(f"lora: field 'rank' must be >= 1, got {rank}.")
    layers = _kernel_shapes(cfg)
    out: dict = {"layers": {}}
    for i, name in enumerate(resolve_targets(targets)):
        mod, n_in = TARGETS[name]
        shape = layers[mod][name]["kernel"].shape          # [L, *in, *out]
        n_layers, ins, outs = shape[0], shape[1:1 + n_in], shape[1 + n_in:]
        a = jax.random.normal(jax.random.fold_in(rng, i), (n_layers, *ins, rank), dtype)
        a = a * (1.0 / rank) ** 0.5
        b = jnp.zeros((n_layers, rank, *outs), dtype)
        out["layers"].setdefault(mod, {})[name] = {"a": a, "b": b}
    return out


def delta(a, b, scale: float):
    """scale * A @ B with the kernel's shape [L, *in, *out] (contraction over the rank)."""
    n_layers, rank = a.shape[0], a.shape[-1]
    ins, outs = a.shape[1:-1], b.shape[2:]
    flat = jnp.einsum("lir,lro->lio", a.reshape(n_layers, -1, rank), b.reshape(n_layers, rank, -1))
    return (scale * flat).reshape(n_layers, *ins, *outs)


def merge(base, adapters, alpha: float):
    """Base params with every adapted kernel replaced by W + (alpha / rank) A @ B (functional)."""
    if not adapters:
        return base
    layers = dict(base["layers"])
    for mod, kernels in adapters["layers"].items():
        sub = dict(layers[mod])
        for name, ab in kernels.items():
            rank = ab["a"].shape[-1]
            w = sub[name]["kernel"]
            d = delta(ab["a"].astype(jnp.float32), ab["b"].astype(jnp.float32), alpha / rank)
            sub[name] = {**sub[name], "kernel": (w.astype(jnp.float32) + d).astype(w.dtype)}
        layers[mod] = sub
    return {**base, "layers": layers}


def logical_axes(cfg, adapters):
    """PartitionSpecs of logical names for an adapters tree (the kernel's names, rank unnamed)."""
    from rossjax.models import transformer

    specs = transformer.logical_axes(cfg)["layers"]
    out: dict = {"layers": {}}
    for mod, kernels in adapters["layers"].items():
        for name, ab in kernels.items():
            k = tuple(specs[mod][name]["kernel"])      # ("layers", *in names, *out names)
            n_in = ab["a"].ndim - 2
            out["layers"].setdefault(mod, {})[name] = {
                "a": P(k[0], *k[1:1 + n_in], None), "b": P(k[0], None, *k[1 + n_in:])}
    return out


def shardings(cfg, adapters, mesh, rules=None):
    """NamedShardings of an adapters tree; `mesh` is a Partitioner or a Mesh (+ rules)."""
    return as_partitioner(mesh, rules).tree(logical_axes(cfg, adapters), adapters)


def num_params(adapters) -> int:
    return int(sum(x.size for x in jax.tree.leaves(adapters)))
