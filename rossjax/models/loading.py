"""One way to get a model from a config's model section: a Hugging Face folder, a
`rossjax export --format orbax` folder, or a preset (random init), placed by a Partitioner.

    model_cfg, params = load_model(cfg.model, partitioner, seed=cfg.train.seed)

The section holds `path` (a folder) or `preset` (a name), and optionally `vocab_size` (presets),
`param_dtype`, `dtype` (compute) and `remat_policy`. Without a partitioner params land on the
default device. Train, GRPO, extraction and eval-generator all load through here.
"""

from __future__ import annotations

import os

import jax

from rossjax.errors import ConfigError
from rossjax.models import config as config_lib, hf, orbax_folder, shardings, transformer

SOURCES = ("hf", "orbax", "scratch")


def _get(section, name, default=None):
    v = section.get(name, default) if hasattr(section, "get") else getattr(section, name, default)
    return default if v is None else v


def section_from_spec(spec: str, dtype: str = "float32", *, where: str = "config.model") -> dict:
    """A model section from a one-string spec: "preset:NAME" or a model folder."""
    if spec.startswith("preset:"):
        return {"preset": spec.split(":", 1)[1], "dtype": dtype, "param_dtype": dtype}
    if not os.path.isdir(spec):
        raise ConfigError(f"{where} is {spec!r}, which is neither preset:NAME nor an existing "
                          f"model folder.")
    return {"path": spec, "dtype": dtype, "param_dtype": dtype}


def abstract_model(section, *, field: str = "config.model"):
    """(ModelConfig, source) without reading weights; source is "hf" | "orbax" | "scratch"."""
    path, preset = _get(section, "path", ""), _get(section, "preset", "")
    over = {k: _get(section, k) for k in ("param_dtype", "dtype", "remat_policy", "attention_impl")}
    over = {k: v for k, v in over.items() if v is not None and v != ""}
    if path:
        path = os.fspath(path)
        if not os.path.exists(path):
            raise ConfigError(f"{field}.path {path} does not exist.")
        if os.path.exists(os.path.join(path, "config.json")):
            return hf.read_hf_config(path).replace(**over), "hf"
        if os.path.exists(os.path.join(path, "model_config.json")):
            return orbax_folder.read_model_config(path).replace(**over), "orbax"
        raise ConfigError(f"{field}.path {path} holds neither config.json (a Hugging Face "
                          f"folder) nor model_config.json (a `rossjax export --format orbax` folder).")
    if not preset:
        raise ConfigError(f"{field}.path and {field}.preset are both empty; give a model "
                          f"folder or a preset name.")
    if preset not in config_lib.PRESETS:
        raise ConfigError(f"{field}.preset {preset!r} is unknown; presets: "
                          f"{', '.join(config_lib.PRESETS)}.")
    vocab = int(_get(section, "vocab_size", 0) or 0)
    if vocab > 0:
        over["vocab_size"] = vocab
    return config_lib.get_preset(preset, **over), "scratch"


def load_params(section, model_cfg, source: str, partitioner=None, *, seed: int = 0):
    """The params of `abstract_model(section)`'s model, placed by `partitioner` (or on one device)."""
    if source == "hf":
        _, params = hf.load_hf(_get(section, "path"), dtype=model_cfg.param_dtype,
                               partitioner=partitioner)
        return params
    if source == "orbax":
        sh = (shardings.param_shardings(model_cfg, partitioner) if partitioner is not None else
              jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]),
                           shardings.abstract_params(model_cfg)))
        return orbax_folder.restore_params(_get(section, "path"),
                                       shardings.sharded_abstract_params(model_cfg, sh))
    if source != "scratch":
        raise ConfigError(f"load_params: source {source!r} is not one of {', '.join(SOURCES)}.")
    rng = jax.random.PRNGKey(seed)
    if partitioner is None:
        return transformer.init_params(model_cfg, rng)
    return shardings.init_params_sharded(model_cfg, rng, partitioner)


def load_model(model_section, partitioner=None, *, seed: int = 0, field: str = "config.model"):
    """(ModelConfig, params) from a model section (see the module docstring)."""
    model_cfg, source = abstract_model(model_section, field=field)
    return model_cfg, load_params(model_section, model_cfg, source, partitioner, seed=seed)
