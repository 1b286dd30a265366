"""ModelConfig: one frozen, hashable description of a Llama/Mistral/Qwen2/Qwen3 decoder.

Hashable so it can be a static argument of `jax.jit`. `from_hf_config` reads a Hugging Face
`config.json` dict (transformers 4.x `rope_theta`/`rope_scaling` or 5.x `rope_parameters`);
`to_hf_config` writes one back for `save_hf`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rossjax.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_HF_ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
ATTENTION_IMPLS = ("auto", "dense", "blockwise", "xla", "cudnn", "splash")
_DTYPES = {"float32": "float32", "fp32": "float32", "f32": "float32",
           "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}


def canonical_dtype(value, *, source: str = "dtype", field: str = "dtype") -> str:
    """'bf16', jnp.bfloat16, np.dtype('float32') ... -> 'bfloat16' / 'float32' / 'float16'."""
    name = value if isinstance(value, str) else getattr(value, "__name__", None) or str(value)
    try:
        name = np.dtype(value).name if not isinstance(value, str) else name
    except TypeError:
        pass
    if name not in _DTYPES:
        raise ConfigError(f"{source}: field {field!r} is {value!r}, which is not a floating dtype "
                         f"(use one of float32, bfloat16, float16).")
    return _DTYPES[name]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    model_type: str = "qwen2"
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    ffn_dim: int = 128
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    # rope scaling as a sorted tuple of (key, value) pairs so the config stays hashable.
    rope_scaling: tuple | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    sliding_window: int | None = None
    # Per-layer "full_attention" / "sliding_attention" (Qwen2/3); None = all layers alike.
    layer_types: tuple | None = None
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_id: Any = None  # int or tuple of ints
    pad_token_id: int | None = None
    initializer_range: float = 0.02
    dtype: str = "float32"        # compute dtype; logits and losses are always float32
    param_dtype: str = "float32"
    remat_policy: str = "none"    # per block: none | full | dots | dots_no_batch
    scan_layers: bool = True      # lax.scan over stacked layers (one compile) vs unrolled loop
    # dense | blockwise (flash-style, O(s * block) memory) | xla | cudnn | splash (fused, see
    # models/kernels) | auto (splash on TPU, cudnn on NVIDIA in bf16/fp16; otherwise dense up to
    # 2 blocks of keys or for <= 16 queries, i.e. decode; block-wise beyond)
    attention_impl: str = "auto"
    # The pure-JAX kernels' block: 0 = by the target's platform (attention.block_size: 128 on
    # CPU, where a tile's scores stay in cache, 512 elsewhere).
    attention_block: int = 0

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"ModelConfig: field 'model_type' is {self.model_type!r}; supported: "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)}.")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"ModelConfig: field 'n_heads' ({self.n_heads}) must be a multiple of "
                             f"'n_kv_heads' ({self.n_kv_heads}).")
        if self.remat_policy not in REMAT_POLICIES:
            raise ConfigError(f"ModelConfig: field 'remat_policy' is {self.remat_policy!r}; use one of "
                             f"{', '.join(REMAT_POLICIES)}.")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ConfigError(f"ModelConfig: field 'attention_impl' is {self.attention_impl!r}; use one "
                             f"of {', '.join(ATTENTION_IMPLS)}.")
        if self.attention_block < 0:
            raise ConfigError(f"ModelConfig: field 'attention_block' must be >= 1 (or 0: by the "
                             f"platform), got {self.attention_block}.")
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype, source="ModelConfig"))
        object.__setattr__(self, "param_dtype",
                           canonical_dtype(self.param_dtype, source="ModelConfig", field="param_dtype"))
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
            if len(self.layer_types) != self.n_layers:
                raise ConfigError(f"ModelConfig: field 'layer_types' has {len(self.layer_types)} entries "
                                 f"for {self.n_layers} layers.")

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    @property
    def rope_scaling_dict(self) -> dict | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    def layer_windows(self) -> tuple[int, ...]:
        """Sliding-window size per layer; 0 means full causal attention."""
        if self.sliding_window is None:
            return (0,) * self.n_layers
        if self.layer_types is None:
            return (int(self.sliding_window),) * self.n_layers
        return tuple(int(self.sliding_window) if t == "sliding_attention" else 0
                     for t in self.layer_types)

    def inv_freq(self) -> np.ndarray:
        """RoPE inverse frequencies [head_dim // 2], float32, computed the way transformers does."""
        dim = self.head_dim
        inv = (1.0 / (np.float32(self.rope_theta)
                      ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim))))
        inv = inv.astype(np.float32)
        rs = self.rope_scaling_dict
        kind = (rs or {}).get("rope_type", "default")
        if kind == "default":
            return inv
        if kind == "linear":
            return (inv / np.float32(rs["factor"])).astype(np.float32)
        if kind == "llama3":
            factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
            old = rs["original_max_position_embeddings"]
            lo_wl, hi_wl = old / lo, old / hi
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > lo_wl, inv / factor, inv)
            smooth = (old / wavelen - lo) / (hi - lo)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < hi_wl) & ~(wavelen > lo_wl)
            return np.where(medium, smoothed, scaled).astype(np.float32)
        raise ConfigError(f"ModelConfig: field 'rope_scaling.rope_type' is {kind!r}; supported: "
                         "default, linear, llama3.")

    def num_params(self) -> int:
        d, h, k, hd, f = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim, self.ffn_dim
        attn = d * (h + 2 * k) * hd + h * hd * d
        attn += (h + 2 * k) * hd * self.qkv_bias + d * self.o_bias + 2 * hd * self.qk_norm
        mlp = 3 * d * f + (2 * f + d) * self.mlp_bias
        per_layer = attn + mlp + 2 * d
        head = 0 if self.tie_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.n_layers * per_layer + d + head


def _get(cfg: dict, key: str, source: str, default=dataclasses.MISSING):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is not dataclasses.MISSING:
        return default
    raise ConfigError(f"{source}: required field {key!r} is missing.")


def _rope(cfg: dict, source: str) -> tuple[float, dict | None]:
    """(theta, scaling) from either transformers 5.x `rope_parameters` or 4.x `rope_theta`/`rope_scaling`."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = merged.pop("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = merged.pop("rope_type", merged.pop("type", "default"))
    merged.pop("type", None)
    if kind == "default":
        return float(theta), None
    if kind not in ("linear", "llama3"):
        raise ConfigError(f"{source}: field 'rope_scaling.rope_type' is {kind!r}; supported: default, "
                         "linear, llama3.")
    need = ("factor",) if kind == "linear" else (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    for k in need:
        if k not in merged:
            raise ConfigError(f"{source}: field 'rope_scaling.{k}' is missing for rope_type {kind!r}.")
    out = {"rope_type": kind, **{k: merged[k] for k in need}}
    return float(theta), out


def from_hf_config(hf: dict, *, source: str = "config") -> ModelConfig:
    """Build a ModelConfig from a Hugging Face config dict (config.json contents)."""
    if not isinstance(hf, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(hf).__name__}.")
    mt = hf.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"{source}: field 'model_type' is {mt!r}; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}.")
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"{source}: field 'hidden_act' is {act!r}; only silu (SwiGLU) is supported.")
    d = int(_get(hf, "hidden_size", source))
    n_heads = int(_get(hf, "num_attention_heads", source))
    theta, scaling = _rope(hf, source)
    window = hf.get("sliding_window")
    if mt == "qwen2" or mt == "qwen3":
        if not hf.get("use_sliding_window", False):
            window = None
    layer_types = hf.get("layer_types") if mt in ("qwen2", "qwen3") else None
    if mt in ("qwen2", "qwen3") and window is not None and layer_types is None:
        # older configs: transformers derives the types from max_window_layers
        first = int(hf.get("max_window_layers", 28))
        n = int(_get(hf, "num_hidden_layers", source))
        layer_types = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    if window is None:
        layer_types = None
    attn_bias = bool(hf.get("attention_bias", False))
    field = "torch_dtype" if hf.get("torch_dtype") is not None else "dtype"
    dtype = canonical_dtype(hf.get(field) or "float32", source=source, field=field)
    return ModelConfig(
        model_type=mt,
        vocab_size=int(_get(hf, "vocab_size", source)),
        d_model=d,
        n_layers=int(_get(hf, "num_hidden_layers", source)),
        n_heads=n_heads,
        n_kv_heads=int(_get(hf, "num_key_value_heads", source, n_heads)),
        head_dim=int(_get(hf, "head_dim", source, d // n_heads)),
        ffn_dim=int(_get(hf, "intermediate_size", source)),
        rms_eps=float(_get(hf, "rms_norm_eps", source, 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        qkv_bias=True if mt == "qwen2" else attn_bias,
        o_bias=False if mt == "qwen2" else attn_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)) if mt == "llama" else False,
        qk_norm=mt == "qwen3",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        sliding_window=None if window is None else int(window),
        layer_types=layer_types,
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        dtype=dtype,
        param_dtype=dtype,
    )


def to_hf_config(cfg: ModelConfig) -> dict:
    """The config.json dict that transformers loads back into the same architecture."""
    if cfg.model_type == "qwen2" and (not cfg.qkv_bias or cfg.o_bias):
        raise ConfigError("ModelConfig: field 'qkv_bias' must be True and 'o_bias' False for qwen2.")
    if cfg.model_type in ("llama", "qwen3") and cfg.qkv_bias != cfg.o_bias:
        raise ConfigError(f"ModelConfig: fields 'qkv_bias' and 'o_bias' must match for {cfg.model_type}.")
    if cfg.mlp_bias and cfg.model_type != "llama":
        raise ConfigError("ModelConfig: field 'mlp_bias' is only supported for llama.")
    if cfg.qk_norm != (cfg.model_type == "qwen3"):
        raise ConfigError(f"ModelConfig: field 'qk_norm' must be {cfg.model_type == 'qwen3'} for "
                         f"{cfg.model_type}.")
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        rope = {**cfg.rope_scaling_dict, "rope_theta": cfg.rope_theta}
    out = {
        "model_type": cfg.model_type,
        "architectures": [_HF_ARCH[cfg.model_type]],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple)
        else cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "torch_dtype": cfg.param_dtype,
        "dtype": cfg.param_dtype,
    }
    if cfg.rope_scaling:
        out["rope_scaling"] = dict(rope)
    if cfg.model_type in ("llama", "qwen3"):
        out["attention_bias"] = cfg.qkv_bias
    if cfg.model_type == "llama":
        out["mlp_bias"] = cfg.mlp_bias
    if cfg.model_type == "mistral":
        out["sliding_window"] = cfg.sliding_window
    if cfg.model_type in ("qwen2", "qwen3"):
        out["use_sliding_window"] = cfg.sliding_window is not None
        out["sliding_window"] = cfg.sliding_window
        if cfg.sliding_window is not None:
            types = cfg.layer_types or ("sliding_attention",) * cfg.n_layers
            out["layer_types"] = list(types)
            # transformers rebuilds layer_types from max_window_layers when absent; keep them consistent.
            out["max_window_layers"] = next((i for i, t in enumerate(types) if t == "sliding_attention"),
                                            cfg.n_layers)
    elif cfg.sliding_window is not None and cfg.model_type == "llama":
        raise ConfigError("ModelConfig: field 'sliding_window' is not supported for llama.")
    return out


PRESETS = {
    # The benchmark model: Qwen2-shaped, ~28M parameters (tied embeddings).
    "qwen2_30m": ModelConfig(model_type="qwen2", vocab_size=8192, d_model=512, n_layers=8, n_heads=8,
                             n_kv_heads=2, head_dim=64, ffn_dim=1536, qkv_bias=True,
                             tie_embeddings=True, rope_theta=1_000_000.0, max_position_embeddings=4096),
    # Test-sized models, one per family.
    "tiny_llama": ModelConfig(model_type="llama", vocab_size=256, d_model=64, n_layers=2, n_heads=4,
                              n_kv_heads=2, head_dim=16, ffn_dim=128),
    "tiny_qwen2": ModelConfig(model_type="qwen2", vocab_size=256, d_model=64, n_layers=2, n_heads=4,
                              n_kv_heads=2, head_dim=16, ffn_dim=128, qkv_bias=True,
                              tie_embeddings=True),
    "tiny_qwen3": ModelConfig(model_type="qwen3", vocab_size=256, d_model=64, n_layers=2, n_heads=4,
                              n_kv_heads=2, head_dim=32, ffn_dim=128, qk_norm=True),
}

# The shapes users train, from each model's published config.json: configs only, never weights,
# so `rossjax plan` (and from-scratch runs) need no checkpoint. dtype/param_dtype/remat come from
# the command's config (config.model.*).
_QWEN = dict(rope_theta=1_000_000.0, rms_eps=1e-6)
PRESETS.update({
    # the ~1B model of tests/test_memory.py (Qwen2-shaped, tied embeddings): 1.03B params
    "qwen2_1b": ModelConfig(model_type="qwen2", vocab_size=151_936, d_model=2048, n_layers=16,
                            n_heads=16, n_kv_heads=4, head_dim=128, ffn_dim=5632, qkv_bias=True,
                            tie_embeddings=True, max_position_embeddings=32_768, **_QWEN),
    "qwen2.5_1.5b": ModelConfig(model_type="qwen2", vocab_size=151_936, d_model=1536, n_layers=28,
                                n_heads=12, n_kv_heads=2, head_dim=128, ffn_dim=8960,
                                qkv_bias=True, tie_embeddings=True,
                                max_position_embeddings=32_768, **_QWEN),
    "qwen2.5_7b": ModelConfig(model_type="qwen2", vocab_size=152_064, d_model=3584, n_layers=28,
                              n_heads=28, n_kv_heads=4, head_dim=128, ffn_dim=18_944,
                              qkv_bias=True, max_position_embeddings=32_768, **_QWEN),
    "qwen3_1.7b": ModelConfig(model_type="qwen3", vocab_size=151_936, d_model=2048, n_layers=28,
                              n_heads=16, n_kv_heads=8, head_dim=128, ffn_dim=6144, qk_norm=True,
                              tie_embeddings=True, max_position_embeddings=40_960, **_QWEN),
    "qwen3_8b": ModelConfig(model_type="qwen3", vocab_size=151_936, d_model=4096, n_layers=36,
                            n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=12_288, qk_norm=True,
                            max_position_embeddings=40_960, **_QWEN),
    "qwen3_32b": ModelConfig(model_type="qwen3", vocab_size=151_936, d_model=5120, n_layers=64,
                             n_heads=64, n_kv_heads=8, head_dim=128, ffn_dim=25_600, qk_norm=True,
                             max_position_embeddings=40_960, **_QWEN),
    "llama3.1_8b": ModelConfig(model_type="llama", vocab_size=128_256, d_model=4096, n_layers=32,
                               n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=14_336,
                               rope_theta=500_000.0, rms_eps=1e-5, max_position_embeddings=131_072,
                               rope_scaling=(("factor", 8.0), ("high_freq_factor", 4.0),
                                             ("low_freq_factor", 1.0),
                                             ("original_max_position_embeddings", 8192),
                                             ("rope_type", "llama3"))),
})


def get_preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"ModelConfig: preset {name!r} is unknown; presets: {', '.join(PRESETS)}.")
    return PRESETS[name].replace(**overrides)
