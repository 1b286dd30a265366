"""A Hugging Face tokenizer.json (the `tokenizers` library), with the folder's chat template."""

from __future__ import annotations

import json
import os
import re

import numpy as np

from rossjax.tokenizers.base import Tokenizer, bytes_to_unicode


class HFTokenizer(Tokenizer):
    def __init__(self, path: str, *, name=None, chat_template=None, eos=None, pad=None):
        from tokenizers import Tokenizer as _HF

        folder = path if os.path.isdir(path) else os.path.dirname(path)
        tj = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        self._tok = _HF.from_file(tj)
        with open(tj, encoding="utf-8") as f:
            spec = json.load(f)
        cfg = {}
        cfg_path = os.path.join(folder, "tokenizer_config.json")
        if os.path.exists(cfg_path):
            with open(cfg_path, encoding="utf-8") as f:
                cfg = json.load(f)
        if chat_template is None:
            chat_template = _hf_chat_template(folder, cfg)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
        byte_level = "ByteLevel" in json.dumps(spec.get("decoder") or {})
        table: list[bytes | None] = [None] * (max(vocab.values()) + 1)
        inv = {c: b for b, c in bytes_to_unicode().items()}
        for tok, i in vocab.items():
            if tok in added:
                table[i] = tok.encode("utf-8")
            elif byte_level:
                table[i] = bytes(inv.get(c, 0) for c in tok)
            elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", tok):
                table[i] = bytes([int(tok[3:5], 16)])
            else:
                table[i] = tok.replace("\u2581", " ").encode("utf-8")
        super().__init__(table, added, eos=eos or _tok_str(cfg.get("eos_token")),
                         pad=pad or _tok_str(cfg.get("pad_token")),
                         name=name or os.path.basename(os.path.normpath(folder)) or "hf",
                         chat_template=chat_template)
        # tokenizer.json may define specials only in added_tokens; eos may be a normal token too.
        if self.eos_id is None and _tok_str(cfg.get("eos_token")) in vocab:
            self.eos_id = vocab[_tok_str(cfg.get("eos_token"))]
            self.pad_id = self.pad_id if self.pad_id is not None else self.eos_id

    def _encode_ids(self, text):
        return self._tok.encode(text, add_special_tokens=False).ids

    def _bytes_spell(self, ids, text):
        return self.decode_bytes(ids.tolist()) == text.encode("utf-8")

    def _native_offsets(self, text, ids):
        enc = self._tok.encode(text, add_special_tokens=False)
        off = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
        return off[:, 0], off[:, 1]

    def decode(self, ids):
        return self._tok.decode(list(ids), skip_special_tokens=False)


def _tok_str(t):
    return t.get("content") if isinstance(t, dict) else t


def _hf_chat_template(folder: str, cfg: dict) -> str | None:
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read()
    t = cfg.get("chat_template")
    if isinstance(t, list):  # [{"name": "default", "template": ...}, ...]
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        t = named.get("default") or next(iter(named.values()), None)
    return t if isinstance(t, str) else None
