"""`rossjax export --checkpoint DIR [--step N] --format hf|orbax OUT`.

DIR is a training workdir (holding model_config.json and checkpoints/), its checkpoints/ folder,
or one step folder inside it. `hf` writes a folder that transformers loads (config.json +
safetensors); `orbax` writes params only (OUT/params + OUT/model_config.json), which
`--config.model.path=OUT` accepts as an initialization. A LoRA run (lora.json beside
model_config.json) checkpoints adapters only: both formats get the base with them merged in.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from rossjax.errors import InputError
from rossjax.train import checkpoint as ckpt_lib


def _locate(path: str, step: int | None):
    """(checkpoints dir, model-config dir, step or None) from whatever folder the user gave."""
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"--checkpoint {path} does not exist.")
    base = os.path.basename(path)
    if base.isdigit() and os.path.exists(os.path.join(os.path.dirname(os.path.dirname(path)),
                                                      "model_config.json")):
        return os.path.dirname(path), os.path.dirname(os.path.dirname(path)), step or int(base)
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return os.path.join(path, "checkpoints"), path, step
    if os.path.exists(os.path.join(os.path.dirname(path), "model_config.json")):
        return path, os.path.dirname(path), step
    raise InputError(f"--checkpoint {path} is not a training workdir (no checkpoints/ folder and no "
                     f"model_config.json beside it).")


def restore_params(ckpt_dir: str, step: int | None = None):
    """Params of one saved step as host numpy arrays, whatever mesh saved them."""
    mngr = ocp.CheckpointManager(ckpt_dir, item_handlers=ckpt_lib.item_handlers())
    steps = mngr.all_steps()
    if not steps:
        raise InputError(f"--checkpoint {ckpt_dir} holds no saved step.")
    step = max(steps) if step is None else int(step)
    if step not in steps:
        raise InputError(f"--checkpoint {ckpt_dir} has no step {step} (steps: {sorted(steps)}).")
    meta = mngr.item_metadata(step)["state"]
    tree = getattr(meta, "tree", meta)
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=dev), tree)
    state = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    mngr.close()
    return step, jax.tree.map(np.asarray, state["state"]["params"])


def merged_lora(model_cfg, adapters, manifest, where: str):
    """Base params with the adapters merged in (W + alpha / rank A @ B), as host numpy arrays."""
    from rossjax import models
    from rossjax.models import lora

    src, path = manifest["base_source"], manifest["base_path"]
    if src in ("hf", "orbax") and not os.path.exists(path):
        raise FileNotFoundError(f"{where}: field 'base_path' {path} (the LoRA run's base model) "
                                f"does not exist any more; the adapters cannot be merged without it.")
    if src == "hf":
        _, base = models.load_hf(path, dtype=model_cfg.param_dtype)
    elif src == "orbax":
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev),
                                jax.eval_shape(lambda: models.init_params(model_cfg, jax.random.key(0))))
        base = ckpt_lib.restore_params(path, abstract)
    elif src == "scratch":  # a random base is rebuilt from the run's seed
        base = models.init_params(model_cfg, jax.random.PRNGKey(manifest["seed"]))
    else:
        raise InputError(f"{where}: field 'base_source' {src!r} is not one of hf, orbax, scratch.")
    merged = jax.jit(lambda b, a: lora.merge(b, a, manifest["alpha"]))(base, adapters)
    return jax.tree.map(np.asarray, merged)


def export(checkpoint: str, out: str, fmt: str = "hf", step: int | None = None) -> int:
    if fmt not in ("hf", "orbax"):
        raise InputError(f"--format {fmt!r} is not one of hf, orbax.")
    ckpt_dir, cfg_dir, step = _locate(checkpoint, step)
    model_cfg = ckpt_lib.read_model_config(cfg_dir)
    step, params = restore_params(ckpt_dir, step)
    manifest = ckpt_lib.read_lora_manifest(cfg_dir)
    if manifest is not None:
        params = merged_lora(model_cfg, params, manifest, os.path.join(cfg_dir, "lora.json"))
    elif "embed" not in params:
        raise InputError(f"--checkpoint {ckpt_dir} step {step} holds LoRA adapters only and "
                         f"{os.path.join(cfg_dir, 'lora.json')} (its base model) is missing.")
    if fmt == "hf":
        from rossjax.models import save_hf

        save_hf(model_cfg, params, out)
    else:
        ckpt_lib.save_params(out, params)
        ckpt_lib.write_model_config(out, model_cfg)
    return step
