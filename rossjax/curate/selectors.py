"""Resolve review annotations (keep anchors, exclude/protect selectors) to character intervals.

All matching is exact, on the rendered text of the named message part, so the intervals index
the same string the tokens were cut from. Every failure is a `SelectorError` with a snake_case
code; the compiler withholds the rollout with it (nothing is skipped silently).
"""

from __future__ import annotations

from rossjax.errors import InputError
from rossjax.templates import Rendered


class SelectorError(InputError):
    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


def _occurrences(text: str, needle: str, lo: int, hi: int) -> list[int]:
    out, k = [], text.find(needle, lo, hi)
    while k >= 0:
        out.append(k)
        k = text.find(needle, k + 1, hi)
    return out


def _unique_anchor(r: Rendered, msg: int, anchor: str, which: str, j: int) -> int:
    hits = []
    for p in r.message_parts(msg):
        if p.kind != "end":
            hits += _occurrences(r.text, anchor, p.text_start, p.text_end)
    if not hits:
        raise SelectorError("anchor_missing",
                            f"keep[{j}].{which} {anchor[:40]!r} does not occur in message {msg}")
    if len(hits) > 1:
        raise SelectorError("anchor_ambiguous",
                            f"keep[{j}].{which} {anchor[:40]!r} occurs {len(hits)} times in "
                            f"message {msg}")
    return hits[0]


def keep_intervals(r: Rendered, keep: list[dict]) -> list[tuple[int, int]]:
    """Half-open intervals [start of `start` anchor, end of `end` anchor) per keep entry.

    A kept interval that reaches the end of the turn's last text also keeps the end-of-turn
    marker: keeping a solution through its final words teaches the model to stop there.
    """
    out = []
    for j, k in enumerate(keep):
        msg = k["message"]
        parts = r.message_parts(msg)
        if not parts or not parts[0].eligible:
            raise SelectorError("anchor_not_eligible",
                                f"keep[{j}] points at message {msg}, which is not an assistant turn")
        s = _unique_anchor(r, msg, k["start"], "start", j)
        e0 = _unique_anchor(r, msg, k["end"], "end", j)
        e = e0 + len(k["end"])
        if e0 < s or e < s + len(k["start"]):
            raise SelectorError("anchor_order",
                                f"keep[{j}].end occurs before keep[{j}].start in message {msg}")
        out.append((s, e))
        body = [p for p in parts if p.kind != "end" and p.text_end > p.text_start]
        end_part = next((p for p in parts if p.kind == "end"), None)
        if end_part is not None and body and e >= body[-1].text_end:
            out.append((end_part.start, end_part.end))
    spans = sorted(out)
    for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
        if b0 < a1 and not (a1 == b1 and a0 == b0):
            raise SelectorError("keep_overlap", f"keep intervals overlap at character {b0}")
    return out


def line_interval(r: Rendered, sel: dict, kind: str, j: int) -> tuple[int, int]:
    """Interval of `quote` (occurrence-th exact match) on `line` of the selected message part."""
    msg, part_kind = sel["message"], sel.get("part", "content")
    p = r.part(msg, part_kind)
    if p is None:
        raise SelectorError("selector_unresolved",
                            f"{kind}[{j}]: message {msg} has no rendered {part_kind}")
    text = r.text[p.text_start:p.text_end]
    lines = text.split("\n")
    line = sel["line"]
    if line > len(lines):
        raise SelectorError("selector_unresolved",
                            f"{kind}[{j}]: line {line} is past the end of message {msg} "
                            f"{part_kind} ({len(lines)} lines)")
    base = p.text_start + sum(len(x) + 1 for x in lines[: line - 1])
    line_text = lines[line - 1]
    quote = sel.get("quote")
    if quote is None:  # the whole line
        if not line_text:
            raise SelectorError("selector_unresolved", f"{kind}[{j}]: line {line} of message "
                                f"{msg} is empty")
        return base, base + len(line_text)
    hits, k = [], line_text.find(quote)
    while k >= 0:  # non-overlapping matches, left to right
        hits.append(k)
        k = line_text.find(quote, k + len(quote))
    occ = sel.get("occurrence", 0)
    if occ >= len(hits):
        raise SelectorError("selector_unresolved",
                            f"{kind}[{j}]: quote {quote[:40]!r} has {len(hits)} match(es) on line "
                            f"{line} of message {msg}, occurrence {occ} asked")
    return base + hits[occ], base + hits[occ] + len(quote)


def exclude_intervals(r: Rendered, annotation: dict) -> list[tuple[int, int]]:
    excl = []
    for j, sel in enumerate(annotation.get("exclude") or []):
        parts = r.message_parts(sel["message"])
        if not parts or not parts[0].eligible:
            raise SelectorError("selector_not_eligible",
                                f"exclude[{j}] points at message {sel['message']}, which is not "
                                "an assistant turn")
        excl.append(line_interval(r, sel, "exclude", j))
    prot = [line_interval(r, s, "protect", j) for j, s in enumerate(annotation.get("protect") or [])]
    for a0, a1 in excl:
        for b0, b1 in prot:
            if a0 < b1 and b0 < a1:
                raise SelectorError("exclude_protected",
                                    f"an exclusion [{a0}, {a1}) overlaps a protected span "
                                    f"[{b0}, {b1})")
    return excl
