"""Hugging Face interop: load_hf (config.json + safetensors -> params) and save_hf (the reverse).

Mapping (L = layer index; rossjax layer params are stacked on a leading [n_layers] axis):

    rossjax params                         HF tensor                               conversion
    embed/embedding [V, d]                 model.embed_tokens.weight [V, d]        copy
    layers/attn_norm/scale [L, d]          model.layers.L.input_layernorm.weight   copy
    layers/attn/q/kernel [L, d, H, hd]     ...self_attn.q_proj.weight [H*hd, d]    transpose, split heads
    layers/attn/q/bias [L, H, hd]          ...self_attn.q_proj.bias [H*hd]         split heads
    layers/attn/{k,v}/...                  ...self_attn.{k,v}_proj.*               as q with K heads
    layers/attn/o/kernel [L, H, hd, d]     ...self_attn.o_proj.weight [d, H*hd]    transpose, split heads
    layers/attn/{q,k}_norm/scale [L, hd]   ...self_attn.{q,k}_norm.weight (Qwen3)  copy
    layers/mlp_norm/scale [L, d]           ...post_attention_layernorm.weight      copy
    layers/mlp/{gate,up}/kernel [L, d, F]  ...mlp.{gate,up}_proj.weight [F, d]     transpose
    layers/mlp/down/kernel [L, F, d]       ...mlp.down_proj.weight [d, F]          transpose
    final_norm/scale [d]                   model.norm.weight                       copy
    lm_head/kernel [d, V]  (untied only)   lm_head.weight [V, d]                   transpose

With a mesh, every parameter is built by `jax.make_array_from_callback`: each device's callback
reads only its own slice of the HF tensors through safetensors' lazy `get_slice`, so no host ever
holds more than one device shard of one parameter.
"""

from __future__ import annotations

import contextlib
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from rossjax.errors import InputError
from rossjax.models.config import ModelConfig, canonical_dtype, from_hf_config, to_hf_config
from rossjax.models.transformer import init_params, logical_axes
from rossjax.sharding import as_partitioner

_INDEX = "model.safetensors.index.json"


def _entries(cfg: ModelConfig):
    """(params path, HF name template with {i} for the layer, conversion kind, stacked)."""
    pre = "model.layers.{i}."
    out = [(("embed", "embedding"), "model.embed_tokens.weight", "copy", False),
           (("layers", "attn_norm", "scale"), pre + "input_layernorm.weight", "copy", True),
           (("layers", "mlp_norm", "scale"), pre + "post_attention_layernorm.weight", "copy", True)]
    for p in "qkv":
        out.append((("layers", "attn", p, "kernel"), pre + f"self_attn.{p}_proj.weight", "qkv", True))
        if cfg.qkv_bias:
            out.append((("layers", "attn", p, "bias"), pre + f"self_attn.{p}_proj.bias", "heads", True))
    out.append((("layers", "attn", "o", "kernel"), pre + "self_attn.o_proj.weight", "o", True))
    if cfg.o_bias:
        out.append((("layers", "attn", "o", "bias"), pre + "self_attn.o_proj.bias", "copy", True))
    if cfg.qk_norm:
        for p in "qk":
            out.append((("layers", "attn", f"{p}_norm", "scale"), pre + f"self_attn.{p}_norm.weight",
                        "copy", True))
    for p in ("gate", "up", "down"):
        out.append((("layers", "mlp", p, "kernel"), pre + f"mlp.{p}_proj.weight", "linear", True))
        if cfg.mlp_bias:
            out.append((("layers", "mlp", p, "bias"), pre + f"mlp.{p}_proj.bias", "copy", True))
    out.append((("final_norm", "scale"), "model.norm.weight", "copy", False))
    if not cfg.tie_embeddings:
        out.append((("lm_head", "kernel"), "lm_head.weight", "linear", False))
    return out


def _hf_shape(kind: str, shape: tuple) -> tuple:
    """HF tensor shape for one (un-stacked) rossjax param shape."""
    if kind == "linear":
        return shape[::-1]
    if kind == "qkv":    # [d, n, hd] <- [n*hd, d]
        return (shape[1] * shape[2], shape[0])
    if kind == "heads":  # [n, hd] <- [n*hd]
        return (shape[0] * shape[1],)
    if kind == "o":      # [n, hd, d] <- [d, n*hd]
        return (shape[2], shape[0] * shape[1])
    return shape


def _read(sl, kind: str, idx: tuple[slice, ...], hd: int):
    """Read the slice `idx` (in rossjax layout) of one HF tensor `sl` (a safetensors slice)."""
    if kind == "copy":
        return sl[idx]
    if kind == "linear":
        return sl[idx[1], idx[0]].T
    if kind == "qkv":
        d, n, h = idx
        rows = sl[n.start * hd:n.stop * hd, d]
        return rows.reshape(n.stop - n.start, hd, -1)[:, h, :].transpose(2, 0, 1)
    if kind == "heads":
        n, h = idx
        return sl[n.start * hd:n.stop * hd].reshape(n.stop - n.start, hd)[:, h]
    if kind == "o":
        n, h, d = idx
        cols = sl[d, n.start * hd:n.stop * hd]
        return cols.reshape(-1, n.stop - n.start, hd)[:, :, h].transpose(1, 2, 0)
    raise AssertionError(kind)


def _to_hf(kind: str, x: np.ndarray) -> np.ndarray:
    if kind == "linear":
        return x.T
    if kind == "qkv":
        return x.reshape(x.shape[0], -1).T
    if kind == "heads":
        return x.reshape(-1)
    if kind == "o":
        return x.reshape(-1, x.shape[-1]).T
    return x


def _weight_map(path: str) -> tuple[dict[str, str], str]:
    """HF tensor name -> safetensors file, and the file to name in errors about missing tensors."""
    index = os.path.join(path, _INDEX)
    if os.path.exists(index):
        try:
            with open(index) as f:
                wm = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(f"{index}: field 'weight_map' could not be read ({e}).") from None
        return {k: os.path.join(path, v) for k, v in wm.items()}, index
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise InputError(f"{path}: no *.safetensors file (only safetensors checkpoints are supported).")
    wm = {}
    for fn in files:
        full = os.path.join(path, fn)
        with safe_open(full, "np") as f:
            for k in f.keys():
                wm[k] = full
    return wm, os.path.join(path, files[0]) if len(files) == 1 else path


def read_hf_config(path: str) -> ModelConfig:
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise InputError(f"{path}: not a directory (expected a Hugging Face model folder).")
    if not os.path.exists(cfg_file):
        raise InputError(f"{cfg_file}: file 'config.json' is missing from the model folder.")
    try:
        with open(cfg_file) as f:
            hf = json.load(f)
    except json.JSONDecodeError as e:
        raise InputError(f"{cfg_file}: not valid JSON ({e}).") from None
    return from_hf_config(hf, source=cfg_file)


def load_hf(path, dtype="float32", mesh=None, rules=None, *, partitioner=None):
    """Read a local HF folder -> (ModelConfig, params). `dtype` sets params and compute dtype.

    With a `partitioner` (rossjax.sharding.Partitioner; or `mesh` + `rules`) params land sharded
    by its rules, each device receiving only its slice; without, on the default device.
    """
    path = os.fspath(path)
    dt = canonical_dtype(dtype, source=f"load_hf({path!r})", field="dtype")
    cfg = read_hf_config(path).replace(dtype=dt, param_dtype=dt)
    weight_map, where = _weight_map(path)
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    part = partitioner if partitioner is not None else as_partitioner(mesh, rules)
    shardings = None if part is None else part.tree(logical_axes(cfg), shapes)
    params: dict = {}
    with contextlib.ExitStack() as stack:
        handles = {}

        def tensor(name):
            file = weight_map[name]
            if file not in handles:
                handles[file] = stack.enter_context(safe_open(file, "np"))
            return handles[file].get_slice(name)

        for ppath, template, kind, stacked in _entries(cfg):
            leaf = shapes
            for k in ppath:
                leaf = leaf[k]
            layer_shape = leaf.shape[1:] if stacked else leaf.shape
            names = [template.format(i=i) for i in range(cfg.n_layers)] if stacked else [template]
            want = _hf_shape(kind, tuple(layer_shape))
            for name in names:  # validate everything before reading any data
                if name not in weight_map:
                    raise InputError(f"{where}: tensor {name!r} is missing (needed for "
                                     f"params/{'/'.join(ppath)}).")
                got = tuple(tensor(name).get_shape())
                if got != want:
                    raise InputError(f"{weight_map[name]}: tensor {name!r} has shape {list(got)}, "
                                     f"expected {list(want)} from config.json.")

            def read(idx, names=names, kind=kind, stacked=stacked, shape=leaf.shape):
                idx = tuple(slice(*s.indices(n)) for s, n in zip(idx, shape))
                if not stacked:
                    return _read(tensor(names[0]), kind, idx, cfg.head_dim).astype(dt)
                rows = range(*idx[0].indices(shape[0]))
                return np.stack([_read(tensor(names[i]), kind, idx[1:], cfg.head_dim).astype(dt)
                                 for i in rows])

            if shardings is None:
                value = jnp.asarray(read(tuple(slice(None) for _ in leaf.shape)))
            else:
                sh = shardings
                for k in ppath:
                    sh = sh[k]
                value = jax.make_array_from_callback(leaf.shape, sh, read)
            node = params
            for k in ppath[:-1]:
                node = node.setdefault(k, {})
            node[ppath[-1]] = value
    return cfg, params


def save_hf(cfg: ModelConfig, params, path, max_shard_bytes: int = 2 << 30):
    """Write config.json + safetensors (sharded with an index above `max_shard_bytes`).

    Tensors are converted one at a time; host memory holds at most one output shard. Dtype is
    each param's own dtype (bf16 params give a bf16 checkpoint). Sharded params are gathered one
    layer slice at a time, which assumes a single host (all shards addressable).
    """
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    hf_cfg = to_hf_config(cfg)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2)
    shards: list[dict[str, np.ndarray]] = [{}]
    sizes = [0]
    for ppath, template, kind, stacked in _entries(cfg):
        leaf = params
        for k in ppath:
            if k not in leaf:
                raise InputError(f"save_hf: params/{'/'.join(ppath)} is missing for this config.")
            leaf = leaf[k]
        for i in range(cfg.n_layers if stacked else 1):
            x = np.asarray(jax.device_get(leaf[i] if stacked else leaf))
            t = np.ascontiguousarray(_to_hf(kind, x))
            if sizes[-1] and sizes[-1] + t.nbytes > max_shard_bytes:
                shards.append({})
                sizes.append(0)
            shards[-1][template.format(i=i)] = t
            sizes[-1] += t.nbytes
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [
        f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
    for fn, tensors in zip(names, shards):
        save_file(tensors, os.path.join(path, fn), metadata={"format": "pt"})
    if n > 1:
        index = {"metadata": {"total_size": int(sum(sizes))},
                 "weight_map": {k: fn for fn, t in zip(names, shards) for k in t}}
        with open(os.path.join(path, _INDEX), "w") as f:
            json.dump(index, f, indent=2)
    return path
