"""Compile a rollout record into a training example: token ids, eligible mask, loss mask.

    eligible[t] = token t overlaps an assistant part (content, reasoning, tool calls, end marker)
    keep-mode:    loss[t] = eligible[t] and t overlaps a kept interval
    exclude-mode: loss[t] = eligible[t] and t overlaps no excluded interval
(both may be given: kept and not excluded). Character intervals come from the rendered text
(chat.py) and the annotation selectors (selectors.py); they are projected onto tokens by
character overlap, so a token that straddles a boundary counts as overlapping.

Tokens are those of the rendered text, or the record's stored `token_ids` when present: these are
decoded to bytes, must spell the rendered text exactly (else `token_mismatch`), and their byte
offsets give the character offsets. The text is never edited and never re-tokenized.

`mask_mode="eligible"` supervises every eligible token ("ROSS w/o mask") but still resolves the
annotation, so exactly the same rows are kept as in "annotated" mode. A record without an
annotation supervises every eligible token; which rows reach the compiler at all (reviewed rows
only, or every verifier-positive row with its annotation removed) is the pipeline's `rows` filter.
Keep spans must come in source order and be disjoint (else `anchor_order`).
A record with `loss_scope: "sequence"` (RetroGen's whole-sample loss) makes every token eligible,
context and template included; "assistant" (or no field) is the rule above.
Reasons come in this order: verifier_failed, annotation_drop, selector/anchor codes, token_mismatch,
no_supervised_tokens, too_long.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rossjax.curate.schema import validate_record
from rossjax.curate.selectors import SelectorError, exclude_intervals, keep_intervals
from rossjax.errors import InputError
from rossjax.templates import Rendered, TemplateError, render_chat
from rossjax.tokenizers import byte_to_char_offsets

MASK_MODES = ("annotated", "eligible")
LOSS_SCOPES = ("assistant", "sequence")  # a record's optional `loss_scope`
_EMPTY = np.zeros(0, np.int32)


@dataclass
class CompiledExample:
    id: str
    input_ids: np.ndarray  # int32[n]
    loss_mask: np.ndarray  # uint8[n]
    eligible_mask: np.ndarray  # uint8[n]
    status: str  # "kept" | "withheld" | "invalid"
    reason: str | None = None  # snake_case code when not kept
    detail: str | None = None  # one human sentence for the code
    provenance: dict = field(default_factory=dict)
    n_eligible: int = 0
    n_supervised: int = 0
    n_excluded_eligible: int = 0  # eligible but not supervised (end-of-turn markers included)
    n_content: int = 0  # eligible response-content tokens: eligible, end-of-turn marker excluded
    n_excluded_content: int = 0  # response content not supervised (numerator of TER)
    turn_spans: list = field(default_factory=list)  # (start_token, end_token) per assistant turn
    text: str | None = None  # the rendered text the tokens spell (for inspection)

    def to_dict(self) -> dict:
        return {"id": self.id, "input_ids": self.input_ids, "loss_mask": self.loss_mask,
                "eligible_mask": self.eligible_mask, "provenance": self.provenance,
                "turn_spans": self.turn_spans, "status": self.status, "reason": self.reason}


def provenance(record: dict) -> dict:
    task, src = record.get("task") or {}, record.get("source") or {}
    return {"task_id": task.get("id"), "domain": task.get("domain"), "run": src.get("run"),
            "step": src.get("step"), "reward": record.get("reward")}


def interval_mask(length: int, intervals) -> np.ndarray:
    """bool[length] character mask of the union of half-open intervals."""
    d = np.zeros(length + 1, np.int32)
    for s, e in intervals:
        s, e = max(0, min(s, length)), max(0, min(e, length))
        if e > s:
            d[s] += 1
            d[e] -= 1
    return np.cumsum(d[:-1]) > 0


def token_overlap(char_mask: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """bool[n]: token [starts, ends) contains at least one marked character."""
    cs = np.concatenate([[0], np.cumsum(char_mask, dtype=np.int64)])
    return (cs[np.minimum(ends, len(char_mask))] - cs[np.minimum(starts, len(char_mask))]) > 0


def _project_stored(token_ids, tokenizer, text: str):
    """Offsets of stored tokens in `text`, or a (code, detail) mismatch."""
    ids = np.asarray(token_ids, np.int64)
    if ids.max(initial=0) >= tokenizer.vocab_size:
        return None, f"stored token id {int(ids.max())} is outside the tokenizer's vocabulary"
    got = tokenizer.decode_bytes(ids.tolist())
    want = text.encode("utf-8")
    if got != want and not (want.endswith(b"\n") and got == want[:-1]):
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        return None, (f"stored token_ids decode to text that differs from the rendered chat at "
                      f"byte {k} (decoded {len(got)} bytes, rendered {len(want)})")
    lens = tokenizer.token_byte_lengths(ids)
    bends = np.cumsum(lens)
    starts, ends = byte_to_char_offsets(text, bends - lens, bends)
    return (ids.astype(np.int32), starts, ends), None


def ordered_keep_intervals(r: Rendered, keep: list[dict]) -> list[tuple[int, int]]:
    """`keep_intervals`, with the spans required in source order and disjoint: a span given
    before one it follows, or overlapping another, invalidates the whole annotation
    (`anchor_order`) instead of being sorted or merged into a mask nobody proposed."""
    try:
        out = keep_intervals(r, keep)
    except SelectorError as e:
        if e.code != "keep_overlap":
            raise
        raise SelectorError("anchor_order", f"{e.detail}: keep spans must be given in source "
                                            f"order and must not overlap") from None
    markers = {(p.start, p.end) for p in r.parts if p.kind == "end"}
    spans = [iv for iv in out if iv not in markers]  # one per keep entry, in the order given
    for j in range(1, len(spans)):
        if spans[j][0] < spans[j - 1][1]:
            raise SelectorError("anchor_order",
                                f"keep[{j}] starts before keep[{j - 1}] ends: keep spans must be "
                                f"given in source order and must not overlap")
    return out


def compile_rollout(record, tokenizer, template: str = "chatml", max_length: int | None = None,
                    mask_mode: str = "annotated", template_kwargs: dict | None = None
                    ) -> CompiledExample:
    """Compile one rollout record (see module doc). Never raises on bad data: it buckets it.
    The record's `tools` and `template_kwargs` go to the chat template."""
    if mask_mode not in MASK_MODES:
        raise InputError(f"mask_mode {mask_mode!r} is not one of {', '.join(MASK_MODES)}")
    rid = record.get("id") if isinstance(record, dict) and isinstance(record.get("id"), str) else ""
    err = validate_record(record)
    if err:
        return CompiledExample(rid, _EMPTY, _EMPTY.astype(np.uint8), _EMPTY.astype(np.uint8),
                               "invalid", "invalid_record", err)
    prov = provenance(record)
    scope = record.get("loss_scope", "assistant")
    if scope not in LOSS_SCOPES:
        return CompiledExample(rid, _EMPTY, _EMPTY.astype(np.uint8), _EMPTY.astype(np.uint8),
                               "invalid", "invalid_record",
                               f"loss_scope {scope!r} is not one of {', '.join(LOSS_SCOPES)}")

    def withheld(code, detail, ids=_EMPTY, elig=None, loss=None, **kw):
        z = np.zeros(len(ids), np.uint8)
        return CompiledExample(rid, ids, z if loss is None else loss, z if elig is None else elig,
                               "withheld", code, detail, prov, **kw)

    # The verdict comes before the review: a failed row reads `verifier_failed` under every
    # recipe, also when a reviewer dropped it (positive_sft ignores reviews, not verdicts).
    ver = record.get("verifier") or {}
    if ver.get("passed") is False:
        return withheld("verifier_failed",
                        f"verifier {ver.get('name', '?')} failed: {ver.get('evidence', '')}"[:300])
    ann = record.get("annotation") or {}
    if ann.get("status") == "drop":
        return withheld("annotation_drop", "the reviewer dropped this rollout")
    try:
        r: Rendered = render_chat(record["messages"], template, tokenizer, tools=record.get("tools"),
                                  template_kwargs=template_kwargs)
        keep = ordered_keep_intervals(r, ann.get("keep") or [])
        excl = exclude_intervals(r, ann)
    except (TemplateError, SelectorError) as e:
        return withheld(e.code, e.detail)

    text = r.text
    if record.get("token_ids") is not None:
        proj, mismatch = _project_stored(record["token_ids"], tokenizer, text)
        if mismatch:
            return withheld("token_mismatch", mismatch)
        ids, starts, ends = proj
    else:
        ids, starts, ends = tokenizer.encode_arrays(text)
    n = len(ids)
    elig_chars = interval_mask(len(text), r.eligible_intervals())
    eligible = token_overlap(elig_chars, starts, ends)
    if scope == "sequence":
        eligible = np.ones(n, bool)
    loss = eligible.copy()
    if ann.get("keep"):
        loss &= token_overlap(interval_mask(len(text), keep), starts, ends)
    if excl:
        loss &= ~token_overlap(interval_mask(len(text), excl), starts, ends)
    n_elig, n_sup = int(eligible.sum()), int(loss.sum())
    if mask_mode == "eligible":
        n_sup_annotated, loss = n_sup, eligible.copy()
        n_sup = n_elig
    else:
        n_sup_annotated = n_sup
    # TER counts response content only: tokens of content/reasoning/tool calls, not the marker
    content = eligible & token_overlap(interval_mask(len(text), [
        (p.start, p.end) for p in r.parts if p.eligible and p.kind != "end" and p.end > p.start]),
        starts, ends)
    spans = _turn_spans(r, starts, ends)
    counts = dict(n_eligible=n_elig, n_supervised=n_sup, n_excluded_eligible=n_elig - n_sup,
                  n_content=int(content.sum()), n_excluded_content=int((content & ~loss).sum()),
                  turn_spans=spans, text=text)
    el, lo = eligible.astype(np.uint8), loss.astype(np.uint8)
    if n_sup_annotated == 0:
        what = "no assistant token is eligible" if n_elig == 0 else "the annotation supervises no token"
        return withheld("no_supervised_tokens", what, ids, el, lo, **counts)
    if max_length is not None and n > max_length:
        return withheld("too_long", f"{n} tokens exceed max_length {max_length}", ids, el, lo,
                        **counts)
    return CompiledExample(rid, ids, lo, el, "kept", None, None, prov, **counts)


def _turn_spans(r: Rendered, starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """Token range [first, last+1) of each assistant turn's eligible parts, in message order."""
    by_msg: dict[int, list[int]] = {}
    for p in r.parts:
        if p.eligible and p.end > p.start:
            lo, hi = by_msg.setdefault(p.message, [p.start, p.end])
            by_msg[p.message] = [min(lo, p.start), max(hi, p.end)]
    out = []
    for m in sorted(by_msg):
        cs, ce = by_msg[m]
        t0 = int(np.searchsorted(ends, cs, side="right"))  # first token ending after cs
        t1 = int(np.searchsorted(starts, ce, side="left"))  # tokens starting before ce
        if t1 > t0:
            out.append((t0, t1))
    return out
