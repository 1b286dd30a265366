"""The tokenizer an export carries: found for the run, written as Hugging Face files, with a chat
template, so `AutoTokenizer.from_pretrained(OUT)` and vLLM load a working tokenizer from the
export folder alone.

Where it comes from (`find_source`), first match wins: `--tokenizer=HF_DIR_OR_NAME`; a LoRA
run's Hugging Face base; the run's `model.path` when that folder holds tokenizer files; the
tokenizer the run itself used: a GRPO run's `tokenizer` (its `ascii` tokenizer is the folder
WORKDIR/tokenizer), an SFT run's curated data (report.json's `config.tokenizer`), and for a run
started from another run's workdir, that run's. None found is an error (`--tokenizer=none`
writes the weights alone).

How it is written (`write`): a folder with tokenizer files is copied; a tiktoken-ranks tokenizer
(`qwen`, `qwen3.6`) is converted to tokenizer.json with transformers' TikTokenConverter and
checked id for id against rossjax's encoding; then a tokenizer without a chat template gets the
one the run rendered with (`chatml`: the jinja below renders what templates/builtin.py renders),
and the generation config stops at the tokenizer's end-of-turn token.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from rossjax.errors import InputError

NONE = "none"  # --tokenizer=none: the weights alone

# What AutoTokenizer, a chat template and generate() read beside the weights (transformers and
# vLLM look for these names in the model folder).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "spiece.model", "chat_template.jinja", "chat_template.json",
                   "generation_config.json")

# ChatML as rossjax's builtin `chatml` renders it (system/user/assistant turns, reasoning in
# <think>, tool results in one user turn of <tool_response> blocks), with the generation prompt.
CHATML_JINJA = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}"
    "{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + (m['content'] or '') + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}"
    "{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' -}}"
    "{%- set r = m.get('reasoning_content', m.get('reasoning')) -%}"
    "{%- if m['role'] == 'assistant' and r is not none -%}"
    "{{- '<think>\\n' + r + '\\n</think>\\n\\n' -}}{%- endif -%}"
    "{{- (m['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
TEMPLATES = {"chatml": CHATML_JINJA}
_HF_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
        return out if isinstance(out, dict) else {}
    except (OSError, ValueError):
        return {}


def copy_tokenizer(base: str, out: str) -> list[str]:
    """Copy the tokenizer files, chat template and generation config of `base` into `out`."""
    copied = []
    for name in TOKENIZER_FILES:
        src = os.path.join(base, name)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(out, name))
            copied.append(name)
    return copied


def has_tokenizer(folder: str | None) -> bool:
    return bool(folder) and os.path.isdir(folder) and any(
        os.path.isfile(os.path.join(folder, n)) for n in _HF_FILES)


def _run_tokenizer(cfg_dir: str, seen: set) -> tuple[str | None, str | None, str]:
    """(tokenizer spec, template, where it was found) of the run in `cfg_dir` itself."""
    run = _read(os.path.join(cfg_dir, "config.json"))
    where = os.path.join(cfg_dir, "config.json")
    if run.get("tokenizer"):  # a GRPO run
        spec = run["tokenizer"]
        if spec == "ascii" and has_tokenizer(os.path.join(cfg_dir, "tokenizer")):
            spec = os.path.join(cfg_dir, "tokenizer")
        return spec, run.get("template"), f"{where} (tokenizer)"
    train = ((run.get("data") or {}).get("train") or "").split(",")[0].strip()
    rep = _read(os.path.join(train, "report.json")) if train else {}
    conf = rep.get("config") or {}
    if conf.get("tokenizer"):
        return conf["tokenizer"], conf.get("template"), f"{train}/report.json (the curated data)"
    # started from another run's workdir (train.export.init_from_run): that run's tokenizer
    src = _read(os.path.join(((run.get("model") or {}).get("path") or ""), "source.json"))
    if src.get("run") and src["run"] not in seen:
        seen.add(src["run"])
        return _run_tokenizer(src["run"], seen)
    return None, None, ""


def find_source(cfg_dir: str, manifest, tokenizer: str | None) -> tuple[str | None, str | None, str]:
    """(tokenizer spec or folder, the run's template name, where it was found); spec None with
    `--tokenizer=none`; an InputError when nothing names one."""
    run = _read(os.path.join(cfg_dir, "config.json"))
    _, template, _ = _run_tokenizer(cfg_dir, set())
    if tokenizer:
        return (None if tokenizer == NONE else tokenizer), template, "--tokenizer"
    if manifest is not None and manifest.get("base_source") == "hf" and has_tokenizer(
            manifest.get("base_path")):
        return manifest["base_path"], template, "the LoRA run's base model"
    path = (run.get("model") or {}).get("path") or ""
    if has_tokenizer(path):
        return path, template, f"model.path {path}"
    spec, template, where = _run_tokenizer(cfg_dir, set())
    if spec:
        return spec, template, where
    raise InputError(f"--checkpoint {cfg_dir}: no tokenizer found for the export (the run's "
                     f"config.json names none, its model.path has no tokenizer files and its "
                     f"data no report.json); pass --tokenizer=HF_DIR (or a name such as qwen), "
                     f"or --tokenizer=none to write the weights alone.")


def _tiktoken_json(tok, out: str) -> None:
    """tokenizer.json for a rossjax TiktokenTokenizer (ranks + pattern + special tokens)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    enc = tok._enc
    ranks, specials = enc._mergeable_ranks, enc._special_tokens
    order = sorted(specials, key=specials.get)
    if [specials[s] for s in order] != list(range(len(ranks), len(ranks) + len(order))):
        raise InputError(f"tokenizer {tok.name}: its special tokens do not follow its ranks "
                         f"contiguously, so no tokenizer.json can reproduce its ids; pass "
                         f"--tokenizer=HF_DIR")

    # The conversion takes seconds (merges rebuilt from 150k ranks): cached by content.
    h = hashlib.sha256(enc._pat_str.encode() + json.dumps(order).encode())
    for t in sorted(ranks, key=ranks.get):
        h.update(t + b"\0")
    cache = os.path.join(os.environ.get("ROSSJAX_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "rossjax"), "hf-tokenizers", h.hexdigest()[:16] + ".json")
    if not os.path.isfile(cache):
        class _Ranks(TikTokenConverter):
            @staticmethod
            def load_tiktoken_bpe(_):
                return ranks

        os.makedirs(os.path.dirname(cache), exist_ok=True)
        tmp = f"{cache}.{os.getpid()}.tmp"
        _Ranks(vocab_file="-", pattern=enc._pat_str, extra_special_tokens=order).converted().save(tmp)
        os.replace(tmp, cache)
    shutil.copyfile(cache, os.path.join(out, "tokenizer.json"))


def _check_same_ids(tok, folder: str) -> None:
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    for text in ("Hello, world! 12345 + 678 = ?\n\n  indented\tcode()", "<|im_start|>user\nhé ☃ 北京"
                 "<|im_end|>\n", "".join(chr(c) for c in range(32, 127))):
        got, want = hf.encode(text, add_special_tokens=False).ids, list(tok.encode(text))
        if got != want:
            raise InputError(f"the tokenizer.json written for {tok.name} encodes {text[:30]!r} "
                             f"differently from rossjax ({got[:8]} vs {want[:8]}); pass "
                             f"--tokenizer=HF_DIR")


def write(spec: str, out: str, template: str | None) -> list[str]:
    """Write the tokenizer `spec` (a folder, a tokenizer.json or a load_tokenizer name) into
    `out` with a chat template and generation config; returns the files written."""
    from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast

    from rossjax.tokenizers import HFTokenizer, TiktokenTokenizer, load_tokenizer

    os.makedirs(out, exist_ok=True)
    if os.path.isdir(spec):
        if not has_tokenizer(spec):
            raise InputError(f"--tokenizer {spec}: the folder holds no tokenizer files "
                             f"({', '.join(_HF_FILES)}).")
        copy_tokenizer(spec, out)
        tok = load_tokenizer(spec)
    else:
        try:
            tok = load_tokenizer(spec)
        except (FileNotFoundError, ValueError) as e:
            raise InputError(f"tokenizer {spec!r} cannot be loaded: {e}") from None
        if isinstance(tok, TiktokenTokenizer):
            _tiktoken_json(tok, out)
            _check_same_ids(tok, out)
        elif isinstance(tok, HFTokenizer) and os.path.isfile(spec):
            copy_tokenizer(os.path.dirname(os.path.abspath(spec)), out)
        else:
            raise InputError(f"tokenizer {spec!r} ({type(tok).__name__}) cannot be written as "
                             f"Hugging Face files by rossjax; pass --tokenizer=HF_DIR")
    cfg = _read(os.path.join(out, "tokenizer_config.json"))
    if os.path.isfile(os.path.join(out, "tokenizer_config.json")) and cfg.get("tokenizer_class"):
        hf = AutoTokenizer.from_pretrained(out)
    else:  # a bare tokenizer.json: the fast tokenizer class over it
        hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(out, "tokenizer.json"))
    names = {i: t for t, i in tok.special_tokens.items()}
    specials = {k: names.get(i) for k, i in (("eos_token", tok.eos_id), ("pad_token", tok.pad_id))}
    for k, v in specials.items():
        if v and getattr(hf, k, None) is None:
            setattr(hf, k, v)
    if not hf.chat_template and (tok.chat_template or TEMPLATES.get(template or "chatml")):
        hf.chat_template = tok.chat_template or TEMPLATES[template or "chatml"]
    hf.save_pretrained(out)
    if not os.path.isfile(os.path.join(out, "generation_config.json")) and hf.eos_token_id is not None:
        GenerationConfig(eos_token_id=hf.eos_token_id, pad_token_id=hf.pad_token_id).save_pretrained(out)
    return sorted(os.listdir(out))
