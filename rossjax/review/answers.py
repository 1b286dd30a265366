"""Read a reviewer's answer: find its one JSON object, turn it into a record annotation.

Models wrap JSON in ```json fences, in a sentence of preamble, or after a <think> block; all of
that is tolerated as long as exactly ONE JSON object can be found. Anything else (no object, two
different objects, an array) is `Unparseable`, which the pipeline withholds as
`reviewer_unparseable`. Whether the annotation's selectors resolve is checked elsewhere
(annotate.py compiles it with the curate code).
"""

from __future__ import annotations

import json
import re

from rossjax.curate.schema import STATUSES

ANNOTATION_KEYS = ("keep", "exclude", "protect", "omissions")
_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.S)
_THINK = re.compile(r"<think>.*?</think>", re.S)


class Unparseable(ValueError):
    pass


def _objects_in(text: str) -> list[dict]:
    """Every top-level JSON object embedded in `text`, left to right."""
    dec, out, i = json.JSONDecoder(), [], text.find("{")
    while i >= 0:
        try:
            obj, end = dec.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            out.append(obj)
        i = text.find("{", end)
    return out


def extract_json(text: str) -> dict:
    """The single JSON object in a reviewer answer, or `Unparseable` saying why not."""
    if not isinstance(text, str) or not text.strip():
        raise Unparseable("the answer is empty")
    text = _THINK.sub("", text).strip()
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        return obj
    if obj is not None:
        raise Unparseable(f"the answer is a JSON {type(obj).__name__}, not an object")
    found = []
    for block in _FENCE.findall(text):
        found += _objects_in(block)
    if not found:
        found = _objects_in(text)
    distinct = {json.dumps(o, sort_keys=True): o for o in found}
    if not distinct:
        raise Unparseable("no JSON object found in the answer")
    if len(distinct) > 1:
        raise Unparseable(f"the answer holds {len(distinct)} different JSON objects, not one")
    return next(iter(distinct.values()))


def to_annotation(obj: dict) -> tuple[dict, str | None]:
    """(annotation, error): the record annotation (status + selector lists only) the answer
    describes, and one sentence when its status is missing or unknown. The reviewer's free-text
    `reason` is returned inside the annotation as `reason` only when it is a string."""
    status = obj.get("status")
    ann = {"status": status}
    for key in ANNOTATION_KEYS:
        if obj.get(key) is not None:
            ann[key] = obj[key]
    if isinstance(obj.get("reason"), str) and obj["reason"].strip():
        ann["reason"] = obj["reason"].strip()
    if status not in STATUSES:
        return ann, (f"status {status!r} is not one of {', '.join(STATUSES)}" if status is not None
                     else f"the JSON object has no status (one of {', '.join(STATUSES)})")
    return ann, None
