"""Tokenizers backed by the Hugging Face `tokenizers` and `sentencepiece` libraries.

Split from tokenizers.py (the common interface, tiktoken-style BPE and `load_tokenizer`), which
loads these on demand; both give the same `encode_arrays` with character offsets.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from rossjax.curate.tokenizers import Tokenizer, _bytes_to_unicode, byte_to_char_offsets


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
        inv = {c: b for b, c in _bytes_to_unicode().items()}
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


class SentencePieceTokenizer(Tokenizer):
    """SentencePiece with the dummy-prefix space switched off, so text is tokenized as written.

    Chat templates write their spaces explicitly ("[INST] hello"), which then tokenizes to the
    same pieces as the model's own tokenizer while keeping tokens' bytes equal to the text's.
    Control pieces ("<s>", "[INST]", ...) are split out of the text and encoded as single ids.
    """

    def __init__(self, path: str, *, name=None, eos=None, pad=None, chat_template=None):
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2 as pb

        proto = pb.ModelProto()
        with open(path, "rb") as f:
            proto.ParseFromString(f.read())
        proto.normalizer_spec.add_dummy_prefix = False
        proto.normalizer_spec.remove_extra_whitespaces = False
        self._sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
        table, specials = [], {}
        for i, p in enumerate(proto.pieces):
            if p.type == 6:  # BYTE
                table.append(bytes([int(p.piece[3:5], 16)]))
            elif p.type in (2, 3):  # UNKNOWN, CONTROL: matched from text by us, spelled as-is
                table.append(p.piece.encode("utf-8"))
                if p.type == 3:
                    specials[p.piece] = i
            else:
                table.append(p.piece.replace("\u2581", " ").encode("utf-8"))
        self._special_re = re.compile("|".join(
            re.escape(s) for s in sorted(specials, key=len, reverse=True))) if specials else None
        eos = eos or proto.pieces[self._sp.eos_id()].piece if self._sp.eos_id() >= 0 else eos
        pad = pad or (proto.pieces[self._sp.pad_id()].piece if self._sp.pad_id() >= 0 else None)
        super().__init__(table, specials, eos=eos, pad=pad,
                         name=name or os.path.basename(path), chat_template=chat_template)

    def _segments(self, text):
        pos = 0
        if self._special_re is not None:
            for m in self._special_re.finditer(text):
                if m.start() > pos:
                    yield text[pos:m.start()], None
                yield m.group(), self.special_tokens[m.group()]
                pos = m.end()
        if pos < len(text):
            yield text[pos:], None

    def _encode_ids(self, text):
        ids: list[int] = []
        for seg, sid in self._segments(text):
            if sid is not None:
                ids.append(sid)
            else:
                ids.extend(self._sp.encode(seg))
        return ids

    def _bytes_spell(self, ids, text):
        return self.decode_bytes(ids.tolist()) == text.encode("utf-8")

    def _native_offsets(self, text, ids):
        # Normalising models (e.g. nmt_nfkc): use SentencePiece's own byte offsets per segment.
        bs, be, base = [], [], 0
        for seg, sid in self._segments(text):
            n = len(seg.encode("utf-8"))
            if sid is not None:
                bs.append(base)
                be.append(base + n)
            else:
                for p in self._sp.encode(seg, return_type="proto").pieces:
                    bs.append(base + p.begin)
                    be.append(base + p.end)
            base += n
        return byte_to_char_offsets(text, np.asarray(bs, np.int64), np.asarray(be, np.int64))


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
