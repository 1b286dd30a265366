"""A model folder in rossjax's own format: `model_config.json` (the ModelConfig) and, for an
orbax params folder (`rossjax export --format orbax`), `params/` (orbax). Training workdirs hold
the same model_config.json beside their checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import orbax.checkpoint as ocp
from etils import epath

from rossjax.errors import InputError
from rossjax.models.config import ModelConfig


def shape_mismatch(directory, step, stored_tree, abstract_tree) -> str | None:
    """One sentence naming the first leaf whose shape differs, or None."""
    stored = {jax.tree_util.keystr(p): tuple(getattr(x, "shape", ()))
              for p, x in jax.tree_util.tree_flatten_with_path(stored_tree)[0]}
    for p, x in jax.tree_util.tree_flatten_with_path(abstract_tree)[0]:
        key = jax.tree_util.keystr(p)
        if key not in stored:
            return (f"checkpoint {directory} step {step} is incompatible with this model: it has no "
                    f"parameter {key}.")
        if stored[key] != tuple(x.shape):
            return (f"checkpoint {directory} step {step} is incompatible with this model: parameter "
                    f"{key} has shape {stored[key]} there but {tuple(x.shape)} here.")
    return None


def save_params(path: str, params):
    """Params only (the `--format orbax` export and the from-orbax init format)."""
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.abspath(os.path.join(path, "params")), params, force=True)
    ckptr.wait_until_finished()


def restore_params(path: str, abstract_params):
    path = os.path.abspath(os.path.join(path, "params"))
    ckptr = ocp.StandardCheckpointer()
    meta = ckptr.metadata(path)
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    msg = shape_mismatch(path, "params", tree, abstract_params)
    if msg:
        raise InputError(msg)
    return ckptr.restore(path, abstract_params)


def write_model_config(path: str, model_cfg):
    """model_config.json into `path` (local or gs://, through etils.epath)."""
    root = epath.Path(path)
    root.mkdir(parents=True, exist_ok=True)
    (root / "model_config.json").write_text(
        json.dumps(dataclasses.asdict(model_cfg), indent=1, default=list))


def read_model_config(path: str):
    file = epath.Path(path) / "model_config.json"
    d = json.loads(file.read_text())
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(d) - fields)
    if unknown:
        raise InputError(f"{file}: field {unknown[0]!r} is not a ModelConfig field.")
    for k in ("rope_scaling", "layer_types", "eos_token_id"):
        if isinstance(d.get(k), list):
            d[k] = tuple(tuple(x) if isinstance(x, list) else x for x in d[k])
    return ModelConfig(**d)
