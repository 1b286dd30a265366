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
Audits: verdict, and per error its kind (error | dependency | derivation), problem and quote;
`confirmed_errors` locates each quoted error in the text the audit saw.

Agentic discovery: every call of the group is judged once on each axis (ok | fail |
unresolved), every finding names a call of the group, every failed dimension is referenced by
an error or omission of that call and every unresolved one by an unresolved finding, and no
finding names a dimension judged ok (`review_inconsistent`). Localization: selectors resolve
(curate's codes), an error's exclusions lie in its own message, and no exclusion overlaps a
protected region (`exclude_protected`).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from rossjax.review.answers import BadAnswer, malformed, want_int, want_list, want_str
from rossjax.review.prompts import AUDIT_KINDS, RISKS

DECISIONS = ("whole", "spans", "reject")
# the four per-call axes, then the narrative (the step's own statements match the transcript)
# and causal (the step follows from what it had, not from an earlier wrong step) checks
AXES = ("contract", "operation", "environment", "execution", "narrative", "causal")
LINE_PARTS = ("content", "reasoning", "tool_calls")
JUDGMENTS = ("ok", "fail", "unresolved")
KINDS = ("error", "omission", "unresolved")
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


def check_audit(obj: dict) -> tuple[bool, list[dict], str]:
    """(clean, errors [{kind, quote, problem}], reason) of an audit answer."""
    verdict = obj.get("verdict")
    if verdict not in ("clean", "error"):
        raise malformed("answer.verdict", f"must be clean or error, got {verdict!r:.60}")
    errors = want_list(obj, "errors", "answer")
    for j, e in enumerate(errors):
        if e.get("kind") not in AUDIT_KINDS:
            raise malformed(f"errors[{j}].kind", f"must be one of {', '.join(AUDIT_KINDS)}, got "
                                                 f"{e.get('kind')!r:.40}")
        want_str(e, "problem", f"errors[{j}]")
        want_str(e, "quote", f"errors[{j}]", required=False)
    if verdict == "error" and not errors:
        raise malformed("answer.errors", "is empty but verdict is error: name each error")
    if verdict == "clean" and errors:
        raise _inconsistent("answer.errors lists problems but verdict is clean: give verdict "
                            "error, or no errors")
    reason = obj.get("reason") if isinstance(obj.get("reason"), str) else ""
    return verdict == "clean", [{"kind": e["kind"], "quote": e.get("quote"),
                                 "problem": e["problem"]} for e in errors], reason


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


# -- agentic ---------------------------------------------------------------------------------

def _inconsistent(detail: str) -> BadAnswer:
    return BadAnswer("review_inconsistent", detail)


def step_lines(rendered, message: int) -> dict[str, int]:
    """{part kind: number of 1-based lines} of one message's text parts, as the transcript
    numbers them (render._numbered)."""
    out = {}
    for p in rendered.message_parts(message):
        if p.kind in LINE_PARTS and p.text_end > p.text_start:
            out[p.kind] = rendered.text[p.text_start:p.text_end].count("\n") + 1
    return out


def check_lines(obj: dict, group: list[tuple[int, int]], rendered, findings: list[dict]) -> None:
    """Every line of every step in `group` is judged exactly once (`lines`: ranges
    {message, part, from, to, verdict}), and the verdicts agree with the findings: a failing
    range needs an error or omission of its message, an unresolved range an unresolved finding
    of its message, and every error finding a failing range in its message."""
    want = {m: step_lines(rendered, m) for m, _ in group}
    seen: dict[tuple[int, str], list[tuple[int, int]]] = {}
    verdicts: dict[int, set] = {m: set() for m in want}
    for j, r in enumerate(want_list(obj, "lines", "answer")):
        where = f"lines[{j}]"
        m = want_int(r, "message", where)
        part = r.get("part", "content")
        if m not in want or part not in want[m]:
            raise _inconsistent(f"{where} covers message {m} part {part}, which is not a text "
                                f"part of the steps in this request")
        lo, hi = want_int(r, "from", where, 1), want_int(r, "to", where, 1)
        if hi < lo or hi > want[m][part]:
            raise malformed(where, f"lines {lo}-{hi} are not within 1-{want[m][part]} of "
                                   f"message {m} {part}")
        v = r.get("verdict")
        if v not in JUDGMENTS:
            raise malformed(f"{where}.verdict", f"must be one of {', '.join(JUDGMENTS)}")
        seen.setdefault((m, part), []).append((lo, hi))
        verdicts[m].add(v)
    for m, parts in sorted(want.items()):
        for part, n in parts.items():
            covered, nxt = sorted(seen.get((m, part), [])), 1
            for lo, hi in covered:
                if lo != nxt:
                    what = f"line {nxt} has no verdict" if lo > nxt else f"line {lo} is judged twice"
                    raise _inconsistent(f"message {m} {part}: {what}; judge every line of every "
                                        f"step once")
                nxt = hi + 1
            if nxt != n + 1:
                raise _inconsistent(f"message {m} {part}: line {nxt} has no verdict; judge every "
                                    f"line of every step once ({n} lines)")
        kinds = {f["kind"] for f in findings if f["message"] == m}
        if "fail" in verdicts[m] and not kinds & {"error", "omission"}:
            raise _inconsistent(f"message {m} has lines judged fail but no error or omission finding")
        if "unresolved" in verdicts[m] and "unresolved" not in kinds:
            raise _inconsistent(f"message {m} has lines judged unresolved but no unresolved finding")
        if "error" in kinds and "fail" not in verdicts[m]:
            raise _inconsistent(f"message {m} has an error finding but no line judged fail")


def check_discovery(obj: dict, group: list[tuple[int, int]], rendered=None) -> list[dict]:
    """The findings of a discovery answer for `group` [(message, n_calls)], checked for
    coverage and consistency with the per-call judgments, and with `rendered`, the line
    accounting (check_lines)."""
    owned = {(m, c) for m, n in group for c in range(n)}
    judged: dict[tuple[int, int], dict] = {}
    for j, c in enumerate(want_list(obj, "calls", "answer")):
        key = (want_int(c, "message", f"calls[{j}]"), want_int(c, "call", f"calls[{j}]", 0, 0))
        if key not in owned:
            raise _inconsistent(f"calls[{j}] judges message {key[0]} call {key[1]}, which is not "
                                f"a call of the steps in this request")
        if key in judged:
            raise _inconsistent(f"message {key[0]} call {key[1]} is judged twice")
        for ax in AXES:
            if c.get(ax) not in JUDGMENTS:
                raise malformed(f"calls[{j}].{ax}", f"must be one of {', '.join(JUDGMENTS)}, "
                                                    f"got {c.get(ax)!r:.40}")
        judged[key] = {ax: c[ax] for ax in AXES}
    missing = sorted(owned - set(judged))
    if missing:
        raise _inconsistent(f"message {missing[0][0]} call {missing[0][1]} has no judgment: "
                            "judge every call of the steps in this request")
    findings = []
    for j, f in enumerate(want_list(obj, "findings", "answer")):
        kind = f.get("kind")
        if kind not in KINDS:
            raise malformed(f"findings[{j}].kind", f"must be one of {', '.join(KINDS)}")
        key = (want_int(f, "message", f"findings[{j}]"),
               want_int(f, "call", f"findings[{j}]", 0, 0))
        axes = f.get("axes")
        if (not isinstance(axes, list) or not axes or any(a not in AXES for a in axes)):
            raise malformed(f"findings[{j}].axes", f"must be a non-empty list of "
                                                   f"{', '.join(AXES)}")
        what = want_str(f, "what", f"findings[{j}]")
        if key not in judged:
            raise _inconsistent(f"findings[{j}] names message {key[0]} call {key[1]}, which is "
                                "not a call of the steps in this request")
        want = "unresolved" if kind == "unresolved" else "fail"
        for a in axes:
            if judged[key][a] != want:
                raise _inconsistent(f"findings[{j}] is a {kind} on {a} of message {key[0]} call "
                                    f"{key[1]}, but that dimension is judged {judged[key][a]}")
        findings.append({"kind": kind, "message": key[0], "call": key[1], "axes": list(axes),
                         "what": what})
    for (m, c), js in sorted(judged.items()):
        for a, v in js.items():
            kinds = ("unresolved",) if v == "unresolved" else ("error", "omission")
            if v != "ok" and not any(f["message"] == m and f["call"] == c and a in f["axes"]
                                     and f["kind"] in kinds for f in findings):
                raise _inconsistent(f"message {m} call {c} is judged {v} on {a}, but no "
                                    f"{' or '.join(kinds)} finding of that call names {a}")
    if rendered is not None:
        check_lines(obj, group, rendered, findings)
    return findings


def _selector(s: dict, where: str, need_quote: bool) -> dict:
    out = {"message": want_int(s, "message", where), "line": want_int(s, "line", where, 1)}
    quote = want_str(s, "quote", where, required=need_quote)
    if quote is not None:
        out["quote"] = quote
    occ = want_int(s, "occurrence", where, 0, 0)
    if occ:
        out["occurrence"] = occ
    part = s.get("part", "content")
    if part not in ("content", "reasoning", "tool_calls"):
        raise malformed(f"{where}.part", "must be content, reasoning or tool_calls")
    if part != "content":
        out["part"] = part
    return out


def _resolve(rendered, sel: dict, kind: str, j: int) -> tuple[int, int]:
    from rossjax.curate.selectors import SelectorError, line_interval

    try:
        return line_interval(rendered, sel, kind, j)
    except SelectorError as e:
        raise BadAnswer(e.code, e.detail) from None


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def check_localization(obj: dict, finding: dict, rendered, done: dict) -> dict:
    """The selectors of one finding, resolved and consistent with the findings `done` before
    it ({"exclude": [(sel, iv)], "protect": [(sel, iv)]}). Returns {"exclude": [...],
    "protect": [...], "omission": {...} | None} of (selector, interval) pairs."""
    if finding["kind"] == "omission":
        if not isinstance(obj.get("after"), dict):
            raise malformed("answer.after", "must be an object {message, line, quote, "
                                            "occurrence}: where the missing action belonged")
        sel = _selector(obj["after"], "after", True)
        _resolve(rendered, sel, "after", 0)
        note = obj.get("note") if isinstance(obj.get("note"), str) else finding["what"]
        return {"exclude": [], "protect": [], "omission": {
            "message": sel["message"], "after": sel["quote"], "line": sel["line"], "note": note}}
    excl = [_selector(s, f"exclude[{j}]", False)
            for j, s in enumerate(want_list(obj, "exclude", "answer"))]
    prot = [_selector(s, f"protect[{j}]", False)
            for j, s in enumerate(want_list(obj, "protect", "answer"))]
    if not excl:
        raise malformed("answer.exclude", "is empty: an error needs at least one exclusion")
    out = {"exclude": [], "protect": [], "omission": None}
    for j, s in enumerate(excl):
        if s["message"] != finding["message"]:
            raise _inconsistent(f"exclude[{j}] is in message {s['message']}, but the finding is "
                                f"about message {finding['message']}")
        out["exclude"].append((s, _resolve(rendered, s, "exclude", j)))
    out["protect"] = [(s, _resolve(rendered, s, "protect", j)) for j, s in enumerate(prot)]
    for j, (s, iv) in enumerate(out["exclude"]):
        for k, (p, piv) in enumerate(out["protect"] + done["protect"]):
            if _overlap(iv, piv):
                raise BadAnswer("exclude_protected",
                                f"exclude[{j}] (message {s['message']} line {s['line']}) overlaps "
                                f"the protected {p.get('quote') or 'line'!r:.60} on line "
                                f"{p['line']}")
    for k, (p, piv) in enumerate(out["protect"]):
        for s, iv in done["exclude"]:
            if _overlap(iv, piv):
                raise BadAnswer("exclude_protected",
                                f"protect[{k}] overlaps an exclusion of an earlier finding "
                                f"(message {s['message']} line {s['line']})")
    return out
