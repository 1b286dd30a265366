"""Tiny random Hugging Face checkpoints for tests (no hub access: config classes + save_pretrained).

`make_tiny_hf(family, path)` writes a folder and returns the eager PyTorch model. Weights are
re-drawn with larger scales than HF's init so that parity checks exercise every tensor.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

_COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

FAMILIES = {
    # llama3 rope scaling with a short original context so several frequencies are rescaled.
    "llama": lambda: LlamaConfig(**_COMMON, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    # every layer slides with a window shorter than the test sequences
    "mistral": lambda: MistralConfig(**_COMMON, sliding_window=4, head_dim=16),
    # qkv bias + tied embeddings
    "qwen2": lambda: Qwen2Config(**_COMMON, tie_word_embeddings=True),
    # layer 0 full attention, layer 1 sliding window
    "qwen2_sliding": lambda: Qwen2Config(**_COMMON, use_sliding_window=True, sliding_window=4,
                                         max_window_layers=1),
    # q/k norm and a head_dim that is not hidden_size / heads
    "qwen3": lambda: Qwen3Config(**_COMMON, head_dim=32),
}


def make_tiny_hf(family: str, path, seed: int = 0, max_shard_size=None):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(FAMILIES[family](), attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn_like(p)
            p.copy_(1 + 0.1 * noise if "norm" in name else 0.1 * noise)
    kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(str(path), **kw)
    return model
