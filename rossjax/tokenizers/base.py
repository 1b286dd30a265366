"""The tokenizer interface every backend implements: ids plus half-open *character* offsets.

Offsets are derived from each token's bytes whenever the tokens' bytes concatenate to the text's
UTF-8 bytes (tiktoken, byte-level BPE, SentencePiece with the dummy prefix switched off): byte
offsets are then exact and are mapped to characters so that a token covering part of a
multi-byte character overlaps that whole character. Otherwise the library's own offsets are used.
"""

from __future__ import annotations

import functools
from typing import Iterable, Sequence

import numpy as np


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


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
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
