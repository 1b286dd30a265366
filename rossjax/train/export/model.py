"""`rossjax export --checkpoint DIR [--step N] --format hf|orbax|peft [--dtype D] OUT`.

DIR is a training workdir (holding model_config.json and checkpoints/), its checkpoints/ folder,
or one step folder inside it. `hf` writes a folder that transformers and vLLM load as is:
config.json + safetensors, plus a working tokenizer with its chat template and generation config
(export_tokenizer.py: `--tokenizer=HF_DIR_OR_NAME`, else a LoRA run's base, else the run's
`model.path` folder, else the tokenizer the run trained with; none found is an error unless
`--tokenizer=none`). `orbax` writes params only (OUT/params + OUT/model_config.json), which
`--config.model.path=OUT` accepts as an initialization. A LoRA run (lora.json beside
model_config.json) checkpoints adapters only: `hf` and `orbax` get the base with them merged in,
`peft` writes the adapters alone in PEFT's format (adapter_config.json +
adapter_model.safetensors) for `peft.PeftModel.from_pretrained(base, OUT)`.
Weights are written in `dtype` (float32 | bfloat16 | float16; default: the base folder's dtype,
else the run's parameter dtype).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from rossjax.errors import InputError
from rossjax.train import checkpoint as ckpt_lib
from rossjax.train.export import tokenizer as export_tokenizer
from rossjax.train.export.tokenizer import TOKENIZER_FILES, copy_tokenizer  # noqa: F401 (public)

FORMATS = ("hf", "orbax", "peft")
DTYPES = ("float32", "bfloat16", "float16")
# rossjax adapter name -> the HF module PEFT targets (models/hf.py's tensor names).
PEFT_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
                "down": "mlp.down_proj"}


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


def base_folder(cfg_dir: str, manifest, tokenizer: str | None = None) -> str | None:
    """The HF folder whose tokenizer files the export copies: `tokenizer` if given, else a LoRA
    run's HF base, else the `model.path` in the run's saved config.json when it is an HF folder."""
    if tokenizer and os.path.isdir(tokenizer):
        return tokenizer
    if manifest is not None and manifest.get("base_source") == "hf":
        return manifest["base_path"]
    run_cfg = os.path.join(cfg_dir, "config.json")
    try:
        with open(run_cfg) as f:
            path = (json.load(f).get("model") or {}).get("path") or ""
    except (OSError, ValueError, AttributeError):
        return None
    return path if path and os.path.isfile(os.path.join(path, "config.json")) else None


def base_dtype(base: str | None) -> str | None:
    """The dtype a base HF folder's config.json names (torch_dtype, or dtype in newer files)."""
    try:
        with open(os.path.join(base, "config.json")) as f:
            hf = json.load(f)
    except (OSError, TypeError, ValueError):
        return None
    name = hf.get("torch_dtype") or hf.get("dtype")
    return name if name in DTYPES else None


def _cast(params, dtype: str):
    import ml_dtypes  # noqa: F401  (numpy bfloat16)

    return jax.tree.map(lambda x: np.asarray(x).astype(dtype), params)


def save_peft(adapters, manifest, out: str, dtype: str, base: str | None):
    """Adapters in PEFT's LoRA format: lora_A [r, in] and lora_B [out, r] per layer and module,
    scaling lora_alpha / r as rossjax's merge (models/lora.py)."""
    from safetensors.numpy import save_file

    tensors = {}
    for kernels in adapters["layers"].values():
        for name, ab in kernels.items():
            a, b = np.asarray(ab["a"]), np.asarray(ab["b"])
            rank = a.shape[-1]
            for i in range(a.shape[0]):
                pre = f"base_model.model.model.layers.{i}.{PEFT_MODULES[name]}"
                tensors[f"{pre}.lora_A.weight"] = np.ascontiguousarray(
                    a[i].reshape(-1, rank).T.astype(dtype))
                tensors[f"{pre}.lora_B.weight"] = np.ascontiguousarray(
                    b[i].reshape(rank, -1).T.astype(dtype))
    targets = [PEFT_MODULES[n].split(".")[-1] for k in adapters["layers"].values() for n in k]
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(manifest["rank"]),
              "lora_alpha": float(manifest["alpha"]), "target_modules": sorted(targets),
              "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
              "use_rslora": False, "use_dora": False, "inference_mode": True,
              "modules_to_save": None, "base_model_name_or_path": base or ""}
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)


def is_run_dir(path: str) -> bool:
    """A training or GRPO workdir: model_config.json and a checkpoints/ folder."""
    return bool(path) and os.path.isdir(os.path.join(path, "checkpoints")) and os.path.isfile(
        os.path.join(path, "model_config.json"))


def init_from_run(path: str, workdir: str, command: str = "train") -> str:
    """`--config.model.path=RUN_WORKDIR` (a GRPO or SFT run): its latest checkpoint exported once
    as orbax params (LoRA adapters merged) into WORKDIR/init_params, which is returned and
    loaded as the initialization; any other path is returned unchanged."""
    if not is_run_dir(path):
        return path
    from rossjax.errors import ConfigError

    mngr = ocp.CheckpointManager(os.path.abspath(os.path.join(path, "checkpoints")))
    step = mngr.latest_step()
    mngr.close()
    if step is None:
        raise ConfigError(f"config.model.path {path} is a run's workdir with no saved checkpoint "
                          f"yet; give a finished run, or a model folder.")
    out = os.path.join(workdir, "init_params")
    marker = os.path.join(out, "source.json")
    source = {"run": os.path.abspath(path), "step": int(step)}
    try:
        with open(marker) as f:
            had = json.load(f)
    except (OSError, ValueError):
        had = None
    started = os.path.isdir(os.path.join(workdir, "checkpoints")) and any(
        n.isdigit() for n in os.listdir(os.path.join(workdir, "checkpoints")))
    if had == source or (had and had.get("run") == source["run"] and started):
        return out  # a resumed run keeps the params it started from
    if jax.process_count() > 1:
        raise ConfigError(f"config.model.path {path} is a run's workdir; with several processes "
                          f"export it first (rossjax export --checkpoint {path} --format orbax "
                          f"OUT) and give --config.model.path=OUT.")
    shutil.rmtree(out, ignore_errors=True)
    export(path, out, "orbax", step)
    with open(marker, "w") as f:
        json.dump(source, f)
    print(f"rossjax {command}: config.model.path {path} is a run's workdir; starting from its "
          f"step {step} (params exported to {out}).", file=sys.stderr)
    return out


def load_model_dir(path: str, step: int | None = None, dtype: str = ""):
    """(ModelConfig, host params, tokenizer spec or None, template or None, what was loaded) of
    a training or GRPO workdir (its latest checkpoint, or `step`; LoRA adapters merged), a
    Hugging Face folder or a `--format orbax` export folder, for inference (`rossjax generate`)."""
    from rossjax.models import loading

    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"--model {path} does not exist.")
    run_like = is_run_dir(path) or os.path.basename(path) == "checkpoints" or (
        os.path.basename(path).isdigit()
        and os.path.isfile(os.path.join(os.path.dirname(os.path.dirname(path)), "model_config.json")))
    if run_like:
        ckpt_dir, cfg_dir, step = _locate(path, step)
        model_cfg = ckpt_lib.read_model_config(cfg_dir)
        manifest = ckpt_lib.read_lora_manifest(cfg_dir)
        step, params = restore_params(ckpt_dir, step)
        if manifest is not None:
            params = merged_lora(model_cfg, params, manifest, os.path.join(cfg_dir, "lora.json"))
        try:
            spec, template, _ = export_tokenizer.find_source(cfg_dir, manifest, None)
        except InputError:
            spec, template = None, None
        what = f"{cfg_dir} step {step}"
    else:
        section = {"path": path}
        model_cfg, source = loading.abstract_model(section, field="--model")
        params = jax.tree.map(np.asarray, loading.load_params(section, model_cfg, source))
        spec = path if export_tokenizer.has_tokenizer(path) else None
        template, what = None, f"{path} ({source})"
    if dtype:
        model_cfg = dataclasses.replace(model_cfg, dtype=dtype)
    return model_cfg, params, spec, template, what


def export(checkpoint: str, out: str, fmt: str = "hf", step: int | None = None, *,
           dtype: str | None = None, tokenizer: str | None = None) -> int:
    """Write one saved step of a training run to `out` (see the module docstring); returns the
    step."""
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}.")
    if dtype is not None and dtype not in DTYPES:
        raise InputError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}.")
    ckpt_dir, cfg_dir, step = _locate(checkpoint, step)
    model_cfg = ckpt_lib.read_model_config(cfg_dir)
    manifest = ckpt_lib.read_lora_manifest(cfg_dir)
    if fmt == "peft" and manifest is None:
        raise InputError(f"--format peft: {cfg_dir} is not a LoRA run (no lora.json); export its "
                         f"full weights with --format hf.")
    base = base_folder(cfg_dir, manifest, tokenizer)
    tok_spec, template, tok_where = (export_tokenizer.find_source(cfg_dir, manifest, tokenizer)
                                     if fmt in ("hf", "peft") else (None, None, ""))
    dtype = dtype or base_dtype(base) or model_cfg.param_dtype
    step, params = restore_params(ckpt_dir, step)
    if fmt == "peft":
        save_peft(params, manifest, out, dtype, base)
    else:
        if manifest is not None:
            params = merged_lora(model_cfg, params, manifest, os.path.join(cfg_dir, "lora.json"))
        elif "embed" not in params:
            raise InputError(f"--checkpoint {ckpt_dir} step {step} holds LoRA adapters only and "
                             f"{os.path.join(cfg_dir, 'lora.json')} (its base model) is missing.")
        params = _cast(params, dtype)
        model_cfg = dataclasses.replace(model_cfg, param_dtype=dtype)
        if fmt == "hf":
            from rossjax.models import save_hf

            save_hf(model_cfg, params, out)
        else:
            ckpt_lib.save_params(out, params)
            ckpt_lib.write_model_config(out, model_cfg)
    if tok_spec is not None:
        export_tokenizer.write(tok_spec, out, template)
        print(f"rossjax export: tokenizer {tok_spec} (from {tok_where}) written into {out} with "
              f"its chat template and generation config.", file=sys.stderr)
    return step
