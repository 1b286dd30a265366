"""Resolve review annotations (keep anchors, exclude/protect selectors) to character intervals.

All matching is exact, on the rendered text of the named message part, so the intervals index
the same string the tokens were cut from. Every failure is a `SelectorError` with a snake_case
code; the compiler withholds the rollout with it (nothing is skipped silently).

Cost is linear in the text, not in text x selectors (a 1 MB row with thousands of selectors
compiles in seconds): the parts of each message and the line starts of each part are indexed
once per rendered text (`_index`), a quote is searched only on its own line (once per distinct
line and quote), exclusions are checked against protected spans by a sorted sweep, and when a
message is long and has many keep anchors their uniqueness is counted on a suffix array
(pydivsufsort) instead of one full scan of the message per anchor.
"""

from __future__ import annotations

import bisect

import numpy as np

from rossjax.errors import InputError
from rossjax.templates import Rendered

# Above this many (distinct anchors x message characters), anchors are counted on a suffix array:
# below it, one str.find scan per anchor is cheaper than building the array (~10 ms of scans).
FIND_BUDGET = 1 << 25


class SelectorError(InputError):
    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


class _Index:
    """Lookups over one Rendered, built once: parts by message and by (message, kind), line
    starts per part, resolved quotes and anchor counters."""

    def __init__(self, r: Rendered):
        self.text, self.n_parts = r.text, len(r.parts)
        self.by_msg: dict[int, list] = {}
        self.by_kind: dict[tuple[int, str], object] = {}
        for p in r.parts:
            self.by_msg.setdefault(p.message, []).append(p)
            self.by_kind.setdefault((p.message, p.kind), p)
        self.lines: dict = {}  # part -> start offsets of its lines
        self.quotes: dict = {}  # (part, line, quote) -> non-overlapping match offsets
        self.anchors: dict = {}  # message -> _Anchors

    def parts(self, msg: int) -> list:
        return self.by_msg.get(msg, [])

    def line_starts(self, p) -> list[int]:
        starts = self.lines.get(p)
        if starts is None:
            starts, k = [p.text_start], self.text.find("\n", p.text_start, p.text_end)
            while k >= 0:
                starts.append(k + 1)
                k = self.text.find("\n", k + 1, p.text_end)
            self.lines[p] = starts
        return starts

    def quote_hits(self, p, line: int, lo: int, hi: int, quote: str) -> list[int]:
        key = (p, line, quote)
        hits = self.quotes.get(key)
        if hits is None:
            hits, k = [], self.text.find(quote, lo, hi)
            while k >= 0:  # non-overlapping matches, left to right
                hits.append(k)
                k = self.text.find(quote, k + len(quote), hi)
            self.quotes[key] = hits
        return hits


def _index(r: Rendered) -> _Index:
    """The index of `r`, cached on it (rebuilt if its text or parts changed)."""
    ix = r.__dict__.get("_selector_index")
    if ix is None or ix.text is not r.text or ix.n_parts != len(r.parts):
        ix = _Index(r)
        r.__dict__["_selector_index"] = ix
    return ix


class _Anchors:
    """Occurrence counts (overlapping, as the uniqueness rule counts them) of anchors in the text
    parts of one message, end markers excluded: by str.find, or on a suffix array of the parts'
    UTF-8 joined by 0xff (a byte no UTF-8 string holds, so no match spans two parts)."""

    def __init__(self, text: str, parts: list, suffix_array: bool):
        self.text, self.parts, self.sa = text, [p for p in parts if p.kind != "end"], None
        if not suffix_array:
            return
        try:
            from pydivsufsort import divsufsort
        except ImportError:  # still correct without it, only slower on huge annotated rows
            return
        chunks = [text[p.text_start:p.text_end].encode("utf-8", "surrogatepass")
                  for p in self.parts]
        self.blob = b"\xff".join(chunks)
        if not self.blob:
            return
        self.sa = divsufsort(self.blob)
        b = np.frombuffer(self.blob, np.uint8)
        self.char_of = np.cumsum((b & 0xC0) != 0x80) - 1  # byte -> character index in the blob
        self.byte_starts = np.cumsum([0] + [len(c) + 1 for c in chunks[:-1]]).tolist()
        self.char_starts = np.cumsum([0] + [p.text_end - p.text_start + 1
                                            for p in self.parts[:-1]]).tolist()

    def count(self, anchor: str) -> tuple[int, int]:
        """(occurrences, offset in the rendered text of the first one; -1 when there is none,
        and possibly -1 when there are several)."""
        if self.sa is None or not anchor:
            n, first = 0, -1
            for p in self.parts:
                k = self.text.find(anchor, p.text_start, p.text_end)
                while k >= 0:
                    n, first = n + 1, k if first < 0 else first
                    k = self.text.find(anchor, k + 1, p.text_end)
            return n, first
        from pydivsufsort import sa_search

        n, left = sa_search(self.blob, self.sa, anchor.encode("utf-8", "surrogatepass"))
        if n != 1:
            return n, -1
        off = int(self.sa[left])
        i = bisect.bisect_right(self.byte_starts, off) - 1
        return 1, self.parts[i].text_start + int(self.char_of[off]) - self.char_starts[i]


def _unique_anchor(anchors: _Anchors, msg: int, anchor: str, which: str, j: int) -> int:
    n, first = anchors.count(anchor)
    if not n:
        raise SelectorError("anchor_missing",
                            f"keep[{j}].{which} {anchor[:40]!r} does not occur in message {msg}")
    if n > 1:
        raise SelectorError("anchor_ambiguous",
                            f"keep[{j}].{which} {anchor[:40]!r} occurs {n} times in "
                            f"message {msg}")
    return first


def _message_anchors(ix: _Index, keep: list[dict]) -> dict:
    """One anchor counter per message the keep entries name; a suffix array where scanning the
    message once per distinct anchor would cost more than FIND_BUDGET characters."""
    asked: dict[int, set] = {}
    for k in keep:
        asked.setdefault(k["message"], set()).update((k["start"], k["end"]))
    out = {}
    for msg, names in asked.items():
        parts = ix.parts(msg)
        size = sum(p.text_end - p.text_start for p in parts if p.kind != "end")
        out[msg] = _Anchors(ix.text, parts, len(names) * size > FIND_BUDGET)
    return out


def keep_intervals(r: Rendered, keep: list[dict]) -> list[tuple[int, int]]:
    """Half-open intervals [start of `start` anchor, end of `end` anchor) per keep entry.

    A kept interval that reaches the end of the turn's last text also keeps the end-of-turn
    marker: keeping a solution through its final words teaches the model to stop there.
    """
    ix = _index(r)
    anchors = None
    out = []
    for j, k in enumerate(keep):
        msg = k["message"]
        parts = ix.parts(msg)
        if not parts or not parts[0].eligible:
            raise SelectorError("anchor_not_eligible",
                                f"keep[{j}] points at message {msg}, which is not an assistant turn")
        if anchors is None:  # after the first eligibility check, which needs no text search
            anchors = _message_anchors(ix, keep)
        s = _unique_anchor(anchors[msg], msg, k["start"], "start", j)
        e0 = _unique_anchor(anchors[msg], msg, k["end"], "end", j)
        e = e0 + len(k["end"])
        if e0 < s or e < s + len(k["start"]):
            raise SelectorError("anchor_order",
                                f"keep[{j}].end occurs before keep[{j}].start in message {msg}")
        out.append((s, e))
        body_end = max((p.text_end for p in parts if p.kind != "end" and p.text_end > p.text_start),
                       default=None)
        end_part = ix.by_kind.get((msg, "end"))
        if end_part is not None and body_end is not None and e >= body_end:
            out.append((end_part.start, end_part.end))
    spans = sorted(out)
    for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
        if b0 < a1 and not (a1 == b1 and a0 == b0):
            raise SelectorError("keep_overlap", f"keep intervals overlap at character {b0}")
    return out


def line_interval(r: Rendered, sel: dict, kind: str, j: int) -> tuple[int, int]:
    """Interval of `quote` (occurrence-th exact match) on `line` of the selected message part."""
    ix = _index(r)
    msg, part_kind = sel["message"], sel.get("part", "content")
    p = ix.by_kind.get((msg, part_kind))
    if p is None:
        raise SelectorError("selector_unresolved",
                            f"{kind}[{j}]: message {msg} has no rendered {part_kind}")
    starts = ix.line_starts(p)
    line = sel["line"]
    if line > len(starts):
        raise SelectorError("selector_unresolved",
                            f"{kind}[{j}]: line {line} is past the end of message {msg} "
                            f"{part_kind} ({len(starts)} lines)")
    base = starts[line - 1]
    end = starts[line] - 1 if line < len(starts) else p.text_end
    quote = sel.get("quote")
    if quote is None:  # the whole line
        if end == base:
            raise SelectorError("selector_unresolved", f"{kind}[{j}]: line {line} of message "
                                f"{msg} is empty")
        return base, end
    hits = ix.quote_hits(p, line, base, end, quote)
    occ = sel.get("occurrence", 0)
    if occ >= len(hits):
        raise SelectorError("selector_unresolved",
                            f"{kind}[{j}]: quote {quote[:40]!r} has {len(hits)} match(es) on line "
                            f"{line} of message {msg}, occurrence {occ} asked")
    return hits[occ], hits[occ] + len(quote)


def _first_overlap(excl: list, prot: list):
    """The first exclusion (in the order given) that overlaps a protected span, with the first
    such span: a sweep over the spans sorted by start, with their running maximum end."""
    if not excl or not prot:
        return None
    order = sorted(range(len(prot)), key=lambda i: prot[i][0])
    starts = [prot[i][0] for i in order]
    reach = np.maximum.accumulate([prot[i][1] for i in order]).tolist()
    for a0, a1 in excl:
        n = bisect.bisect_left(starts, a1)  # spans starting before the exclusion ends
        if n and reach[n - 1] > a0:
            return (a0, a1), next(b for b in prot if a0 < b[1] and b[0] < a1)
    return None


def exclude_intervals(r: Rendered, annotation: dict) -> list[tuple[int, int]]:
    ix = _index(r)
    excl = []
    for j, sel in enumerate(annotation.get("exclude") or []):
        parts = ix.parts(sel["message"])
        if not parts or not parts[0].eligible:
            raise SelectorError("selector_not_eligible",
                                f"exclude[{j}] points at message {sel['message']}, which is not "
                                "an assistant turn")
        excl.append(line_interval(r, sel, "exclude", j))
    prot = [line_interval(r, s, "protect", j) for j, s in enumerate(annotation.get("protect") or [])]
    hit = _first_overlap(excl, prot)
    if hit is not None:
        (a0, a1), (b0, b1) = hit
        raise SelectorError("exclude_protected",
                            f"an exclusion [{a0}, {a1}) overlaps a protected span "
                            f"[{b0}, {b1})")
    return excl
