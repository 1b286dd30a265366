"""Where a verifier finds the answer in a rollout record.

The answer is always read from the *last assistant message with text content* (`content`, not
`reasoning`: a model's scratch work must not count as its answer). Inside it:
  - math: the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; else GSM8K's final-answer
    line `#### 42` (the last one; thousands commas and a trailing period dropped), which is also
    how a GSM8K gold answer (the worked solution ending in `#### 42`) is read;
  - code and induction: the last fenced ```python block (else the last fenced block of any
    language); no fence, no program;
  - gym: the last `<answer>...</answer>` (reasoning-gym's convention), else the last `\\boxed{}`.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def last_assistant_content(record: dict) -> str | None:
    for m in reversed(record.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("content"):
            return m["content"]
    return None


class Truncated(str):
    """An answer cut off at max_tokens (finish_reason 'length'): its text, kept for the record,
    never a final answer (the last \\boxed{} of a cut-off solution may be an intermediate)."""

    __slots__ = ()


_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")


def extract_boxed(text: str) -> str | None:
    """Contents of the last \\boxed{...} / \\fbox{...} in text whose braces close, or None."""
    # each "{" paired with its "}" in one pass: scanning forward from every box instead is
    # quadratic on a long run of unclosed boxes (a degenerate sampled answer)
    close, open_ = {}, []
    for m in _BRACE.finditer(text):
        if m.group() == "{":
            open_.append(m.start())
        elif open_:
            close[open_.pop()] = m.start()
    best = None
    for m in _BOX.finditer(text):
        end = close.get(m.end() - 1)
        if end is not None:
            best = text[m.end():end]
    return best


_GSM8K = re.compile(r"####[ \t]*([^\n]+?)[ \t]*$", re.M)


def extract_gsm8k(text: str) -> str | None:
    """The answer of GSM8K's last `#### 42` line ("1,234." -> "1234"), or None."""
    found = _GSM8K.findall(text or "")
    if not found:
        return None
    ans = found[-1].rstrip(".").strip()
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", ans) or None


def extract_code(text: str) -> str | None:
    """The last ```python fenced block (else the last fenced block), or None."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    py = [b for lang, b in blocks if lang in ("python", "py", "python3")]
    if py:
        return py[-1]
    return blocks[-1][1] if blocks else None


def extract_tag(text: str, tag: str = "answer") -> str | None:
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.S)
    return found[-1].strip() if found else None
