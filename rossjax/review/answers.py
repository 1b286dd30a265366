"""Read a reviewer's answer: find its one JSON object, check its fields.

Models wrap JSON in ```json fences, in a sentence of preamble, or after a <think> block; all of
that is tolerated as long as exactly ONE JSON object can be found. Anything else (no object, two
different objects, an array, JSON nested past the parser's depth) is `Unparseable`.
`read_answer` adds the limits of a usable answer (not cut off at max_tokens, not huge) and names
each failure with the withheld reason it becomes when no retry fixes it (`BadAnswer.code`); the
want_* helpers check field types the same way.
"""

from __future__ import annotations

import json
import re

_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.S)
_THINK = re.compile(r"<think>.*?</think>", re.S)
_START = re.compile(r'\{\s*["}]')  # where an object can begin: a key or an empty object
MAX_FAILED = 1000


MAX_DEPTH = 32  # no stage's answer nests deeper than ~5 levels; deeper is junk, never parsed on
_DEEP = f"the answer nests JSON deeper than {MAX_DEPTH} levels"


class Unparseable(ValueError):
    pass


def _too_deep(obj, limit: int = MAX_DEPTH) -> bool:
    """True when `obj` nests containers more than `limit` levels (iterative: a deep object
    must not crash the checks that print or walk it)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            if d > limit:
                return True
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return False


def _one(obj: dict) -> dict:
    if _too_deep(obj):
        raise Unparseable(_DEEP)
    return obj


def _objects_in(text: str) -> list[dict]:
    """Every top-level JSON object embedded in `text`, left to right. Only a brace followed by
    a key or `}` can open an object, and at most MAX_FAILED such starts may fail to parse: each
    failure costs a scan of the text, so a hostile answer ("{\"" * 25000) must not make the
    search quadratic."""
    dec, out, failed, pos = json.JSONDecoder(), [], 0, 0
    while (m := _START.search(text, pos)) is not None:
        try:
            obj, end = dec.raw_decode(text, m.start())
        except RecursionError:
            raise Unparseable(_DEEP) from None
        except ValueError:
            failed += 1
            if failed > MAX_FAILED:
                raise Unparseable(f"no JSON object found in the answer (gave up after "
                                  f"{MAX_FAILED} braces that open none)") from None
            pos = m.start() + 1
            continue
        if isinstance(obj, dict):
            out.append(obj)
        pos = end
    return out


def extract_json(text: str) -> dict:
    """The single JSON object in a reviewer answer, or `Unparseable` saying why not."""
    if not isinstance(text, str) or not text.strip():
        raise Unparseable("the answer is empty")
    text = _THINK.sub("", text).strip()
    try:
        obj = json.loads(text)
    except RecursionError:
        raise Unparseable(_DEEP) from None
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        return _one(obj)
    if obj is not None:
        raise Unparseable(f"the answer is a JSON {type(obj).__name__}, not an object")
    found = []
    for block in _FENCE.findall(text):
        found += _objects_in(block)
    if not found:
        found = _objects_in(text)
    found = [_one(o) for o in found]
    distinct = {json.dumps(o, sort_keys=True): o for o in found}
    if not distinct:
        raise Unparseable("no JSON object found in the answer")
    if len(distinct) > 1:
        raise Unparseable(f"the answer holds {len(distinct)} different JSON objects, not one")
    return next(iter(distinct.values()))


class BadAnswer(ValueError):
    """An answer a stage cannot use; `code` is the withheld reason if no retry fixes it."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail


def read_answer(reply, max_chars: int) -> dict:
    """The one JSON object of a client Reply, or `BadAnswer`: reviewer_truncated (cut off at
    max_tokens), reviewer_oversized (longer than `max_chars`), reviewer_unparseable."""
    text = reply.text
    if reply.finish_reason == "length":
        raise BadAnswer("reviewer_truncated", f"the answer was cut off at max_tokens after "
                                              f"{len(text)} characters; answer more briefly")
    if len(text) > max_chars:
        raise BadAnswer("reviewer_oversized", f"the answer has {len(text)} characters, more than "
                                              f"the {max_chars} allowed; answer more briefly")
    try:
        return extract_json(text)
    except Unparseable as e:
        raise BadAnswer("reviewer_unparseable",
                        f"the answer is not one JSON object ({e}): {text[:160]!r}") from None


def malformed(where: str, what: str) -> BadAnswer:
    return BadAnswer("reviewer_malformed", f"{where} {what}")


def inconsistent(detail: str) -> BadAnswer:
    """An answer whose parts contradict each other or the request (`review_inconsistent`)."""
    return BadAnswer("review_inconsistent", detail)


def want_str(obj: dict, key: str, where: str, required: bool = True) -> str | None:
    v = obj.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str) or not v:
        raise malformed(f"{where}.{key}", f"must be a non-empty string, got {v!r:.60}")
    return v


def want_int(obj: dict, key: str, where: str, lo: int = 0, default: int | None = None) -> int:
    v = obj.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise malformed(f"{where}.{key}", f"must be an integer >= {lo}, got {v!r:.60}")
    return v


def want_list(obj: dict, key: str, where: str) -> list:
    v = obj.get(key, [])
    if v is None:
        return []
    if not isinstance(v, list):
        raise malformed(f"{where}.{key}", f"must be a list, got {type(v).__name__}")
    for j, x in enumerate(v):
        if not isinstance(x, dict):
            raise malformed(f"{where}.{key}[{j}]", f"must be an object, got {type(x).__name__}")
    return v
