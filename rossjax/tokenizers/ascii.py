"""A byte-level tokenizer over ASCII, for tiny models trained from scratch (demo and tests)."""

from __future__ import annotations

import json
import os

from rossjax.tokenizers.base import bytes_to_unicode


def write_ascii_tokenizer(folder: str) -> str:
    """A byte-level tokenizer over the 128 ASCII bytes plus <|endoftext|>, <|im_start|>,
    <|im_end|> (ids 128-130), for tiny models trained from scratch; `rossjax curate` loads it
    with `--config.tokenizer=FOLDER`. Returns the folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(128)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
    return folder
