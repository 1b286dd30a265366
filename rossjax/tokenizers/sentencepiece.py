"""SentencePiece .model files (the `sentencepiece` library)."""

from __future__ import annotations

import os
import re

import numpy as np

from rossjax.tokenizers.base import Tokenizer, byte_to_char_offsets


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
