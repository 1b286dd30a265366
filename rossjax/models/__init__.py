"""Llama / Mistral / Qwen2 / Qwen3 decoder family with Hugging Face interop.

Applied functionally: `params = init_params(cfg, rng)` or `cfg, params = load_hf(path)`, then
`logits, hidden = forward(cfg, params, tokens)`. See transformer.py for the params layout and the
hidden-state convention, hf.py for the mapping to Hugging Face tensor names.
"""

from rossjax.models.config import PRESETS, ModelConfig, from_hf_config, get_preset, to_hf_config
from rossjax.models.hf import load_hf, save_hf
from rossjax.models.transformer import (
    compute_logits,
    decode_params,
    default_positions,
    forward,
    forward_cached,
    hidden_states,
    init_cache,
    init_params,
    lm_head,
    logical_axes,
)

__all__ = [
    "ModelConfig", "PRESETS", "get_preset", "from_hf_config", "to_hf_config", "load_hf", "save_hf",
    "init_params", "forward", "hidden_states", "lm_head", "compute_logits", "default_positions",
    "init_cache", "forward_cached", "decode_params", "logical_axes",
]
