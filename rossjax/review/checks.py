"""The deterministic checks between reviewer requests. Each failure is a `BadAnswer` whose detail
is the exact sentence the retry request quotes and whose code is the withheld reason when no
retry fixes it.

Single-turn proposals (and revisions): the shape (decision whole | spans | reject, keep spans of
verbatim start/end anchors, each with its reason; the whole_clean and clean_solution flags, the
left_out summary and risk tags) and the flags' agreement with the decision
(`review_inconsistent`); the annotation compiles with curate's own compiler (anchors exist and
are unique, spans in source order and disjoint, inside an assistant message: curate's codes
anchor_missing, anchor_ambiguous, anchor_order, anchor_not_eligible, ...); the selected text
contains the complete final answer as the verifier extracts it (`final_answer_missing`); and the
acceptance check: no kept span touches text an audit confirmed wrong (`audit_error_kept`).
Audits: the paper's outcome (accept | revise | drop; a drop needs its reason), and per error its
kind (error | dependency | derivation), problem and quote; `confirmed_errors` locates each quoted
error in the text the audit saw.

The agentic procedure's checks are in agentic_checks.py.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from rossjax.review.answers import BadAnswer, inconsistent, malformed, want_int, want_list, want_str
from rossjax.review.prompts import AUDIT_KINDS, RISKS

DECISIONS = ("whole", "spans", "reject")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TAG = re.compile(r"<answer>.*?</answer>", re.S)


# -- single-turn -----------------------------------------------------------------------------

def final_answer(record: dict) -> tuple[int, str] | None:
    """(message index, answer text) of the final answer as the verifier extracts it from the
    last assistant content: the whole `\\boxed{...}` for math, the last code block for code and
    induction, the last <answer>...</answer> (else \\boxed{}) otherwise; None when none is found
    (the check is then skipped: no verifier extraction to hold the spans to)."""
    from rossjax.verify.answers import extract_boxed, extract_code, extract_tag

    msgs = record["messages"]
    idx = next((i for i in range(len(msgs) - 1, -1, -1)
                if msgs[i]["role"] == "assistant" and msgs[i].get("content")), None)
    if idx is None:
        return None
    text = msgs[idx]["content"]
    name = (record.get("verifier") or {}).get("name") or (record.get("task") or {}).get("domain")
    if name in ("code", "induction"):
        body = extract_code(text)
        return (idx, body) if body and body.strip() else None
    if name != "math" and extract_tag(text) is not None:
        return idx, [m.group(0) for m in _TAG.finditer(text)][-1]
    inner = extract_boxed(text)
    if inner is None:
        return None
    last = [m for m in _BOXED.finditer(text) if text.startswith(inner + "}", m.end())][-1]
    return idx, text[last.start():last.end() + len(inner) + 1]


def answer_interval(rendered, record: dict) -> tuple[tuple[int, int], str] | None:
    """The final answer's character interval in the rendered text, and the answer."""
    found = final_answer(record)
    if found is None:
        return None
    idx, ans = found
    part = rendered.part(idx, "content")
    k = rendered.text.rfind(ans, part.text_start, part.text_end) if part else -1
    return ((k, k + len(ans)), ans) if k >= 0 else None


class Proposal(NamedTuple):
    decision: str  # whole | spans | reject
    annotation: dict | None  # the record annotation (None for reject)
    selected: str  # the exact selected text, spans concatenated in order
    reason: str
    outputs: dict  # whole_clean, clean_solution, spans (with reasons), left_out, risk
    body: list = []  # the kept (start, end) intervals of the rendered text


class Confirmed(NamedTuple):
    """An error an audit quoted, found at `interval` of the rendered text it was shown."""
    interval: tuple[int, int]
    quote: str
    problem: str


def _keep_entries(obj: dict) -> list[dict]:
    keep = want_list(obj, "keep", "answer")
    for j, k in enumerate(keep):
        want_int(k, "message", f"keep[{j}]")
        want_str(k, "start", f"keep[{j}]")
        want_str(k, "end", f"keep[{j}]")
        want_str(k, "reason", f"keep[{j}]")
    return [{"message": k["message"], "start": k["start"], "end": k["end"], "reason": k["reason"]}
            for k in keep]


def _outputs(obj: dict, decision: str) -> dict:
    """The proposal's flags, left_out summary and risk tags, checked against the decision."""
    flags = {}
    for key in ("whole_clean", "clean_solution"):
        if not isinstance(obj.get(key), bool):
            raise malformed(f"answer.{key}", f"must be true or false, got {obj.get(key)!r:.40}")
        flags[key] = obj[key]
    if flags["whole_clean"] != (decision == "whole"):
        raise BadAnswer("review_inconsistent",
                        f"answer.whole_clean is {str(flags['whole_clean']).lower()} but decision "
                        f"is {decision}: whole_clean is true exactly when the decision is whole")
    if flags["clean_solution"] == (decision == "reject"):
        raise BadAnswer("review_inconsistent",
                        f"answer.clean_solution is {str(flags['clean_solution']).lower()} but "
                        f"decision is {decision}: clean_solution is false exactly when the "
                        f"decision is reject")
    risk = obj.get("risk")
    if not isinstance(risk, list) or any(t not in RISKS for t in risk):
        raise malformed("answer.risk", f"must be a list of tags from {', '.join(RISKS)}, got "
                                       f"{risk!r:.80}")
    left_out = obj.get("left_out", "")
    if not isinstance(left_out, str):
        raise malformed("answer.left_out", f"must be a string, got {type(left_out).__name__}")
    if decision == "spans" and not left_out.strip():
        raise malformed("answer.left_out", "is empty but decision is spans: say in one sentence "
                                           "what the spans leave out and why")
    return {**flags, "left_out": left_out, "risk": sorted(set(risk))}


def _acceptance(body: list[tuple[int, int]], confirmed: list[Confirmed]):
    """The deterministic acceptance check: no kept interval touches a confirmed error."""
    for c in confirmed:
        a, b = c.interval
        if any(s < b and a < e for s, e in body):
            raise BadAnswer("audit_error_kept",
                            f"the selection still keeps {c.quote[:120]!r}, which the audit found "
                            f"wrong ({c.problem[:160]}): leave it out")


def selected_text(rendered, spans: list[tuple[int, int]]) -> str:
    """The kept text in source order, a gap between non-adjacent spans shown as [...]."""
    out, prev = [], None
    for s, e in spans:
        if prev is not None and s > prev:
            out.append("\n[...]\n")
        out.append(rendered.text[s:e])
        prev = e
    return "".join(out)


def check_proposal(obj: dict, record: dict, rendered, compile_,
                   confirmed: list[Confirmed] = ()) -> Proposal:
    """A proposal or revision that passed every single-turn check, or `BadAnswer`; `confirmed`
    are the errors earlier audits of this row found, which no kept span may touch."""
    from rossjax.curate.masks import ordered_keep_intervals
    from rossjax.curate.selectors import SelectorError

    decision = obj.get("decision")
    if decision not in DECISIONS:
        raise malformed("answer.decision", f"must be one of {', '.join(DECISIONS)}, got "
                                           f"{decision!r:.60}")
    reason = obj.get("reason") if isinstance(obj.get("reason"), str) else ""
    outputs = _outputs(obj, decision)
    if decision == "reject":
        return Proposal(decision, None, "", reason, outputs)
    spans = _keep_entries(obj) if decision == "spans" else []
    if decision == "spans" and not spans:
        raise malformed("answer.keep", "is empty but decision is spans (use whole or reject)")
    outputs["spans"] = spans
    keep = [{k: sp[k] for k in ("message", "start", "end")} for sp in spans]
    ann = {"status": "accept"} if decision == "whole" else {"status": "revise", "keep": keep}
    ex = compile_({**record, "annotation": ann})
    if ex.status != "kept":
        code = "reviewer_malformed" if ex.reason == "invalid_record" else ex.reason
        raise BadAnswer(code, ex.detail)
    if decision == "whole":
        body = [(p.text_start, p.text_end) for p in rendered.parts
                if p.eligible and p.kind != "end" and p.text_end > p.text_start]
    else:
        try:
            marks = {(p.start, p.end) for p in rendered.parts if p.kind == "end"}
            body = [iv for iv in ordered_keep_intervals(rendered, keep) if iv not in marks]
        except SelectorError as e:  # compile_ resolved them already; never expected here
            raise BadAnswer(e.code, e.detail) from None
    ans = answer_interval(rendered, record)
    if ans is not None:
        (a, b), text = ans
        if not any(s <= a and b <= e for s, e in body):
            raise BadAnswer("final_answer_missing",
                            f"the selected text does not contain the complete final answer "
                            f"{text[:200]!r}: one keep span must include all of it")
    _acceptance(body, list(confirmed))
    return Proposal(decision, ann, selected_text(rendered, body), reason, outputs, body)


AUDIT_OUTCOMES = ("accept", "revise", "drop")


def check_audit(obj: dict) -> tuple[str, list[dict], str]:
    """(outcome, errors [{kind, quote, problem}], reason) of an audit answer. The paper's three
    outcomes: accept (a clean target, no errors), revise (errors a revision can fix: each named)
    and drop (no clean selection exists: the reason says why; errors are optional evidence)."""
    verdict = obj.get("verdict")
    if verdict not in AUDIT_OUTCOMES:
        raise malformed("answer.verdict", f"must be one of {', '.join(AUDIT_OUTCOMES)}, got "
                                          f"{verdict!r:.60}")
    errors = want_list(obj, "errors", "answer")
    for j, e in enumerate(errors):
        if e.get("kind") not in AUDIT_KINDS:
            raise malformed(f"errors[{j}].kind", f"must be one of {', '.join(AUDIT_KINDS)}, got "
                                                 f"{e.get('kind')!r:.40}")
        want_str(e, "problem", f"errors[{j}]")
        want_str(e, "quote", f"errors[{j}]", required=False)
    if verdict == "revise" and not errors:
        raise malformed("answer.errors", "is empty but verdict is revise: name each error the "
                                         "revision must fix")
    if verdict == "accept" and errors:
        raise inconsistent("answer.errors lists problems but verdict is accept: give verdict "
                            "revise (or drop), or no errors")
    reason = obj.get("reason") if isinstance(obj.get("reason"), str) else ""
    if verdict == "drop" and not reason.strip():
        # a drop withholds the row with this reason, so it must say why
        raise malformed("answer.reason", "is empty but verdict is drop: say in one sentence why "
                                         "no clean selection exists")
    return verdict, [{"kind": e["kind"], "quote": e.get("quote"), "problem": e["problem"]}
                     for e in errors], reason


def confirmed_errors(errors: list[dict], rendered, body: list[tuple[int, int]]) -> list[Confirmed]:
    """The audit's errors (kind "error") whose quote occurs in the text it was shown (inside the
    kept intervals `body`), at every such occurrence: what the acceptance check keeps out."""
    out = []
    for e in errors:
        q = e.get("quote")
        if e["kind"] != "error" or not q:
            continue
        for s, end in body:
            k = rendered.text.find(q, s, end)
            while k >= 0:
                out.append(Confirmed((k, k + len(q)), q, e["problem"]))
                k = rendered.text.find(q, k + 1, end)
    return out
