"""The deterministic checks of the agentic procedure (agentic.py). Each failure is a
`BadAnswer` whose detail is the exact sentence the retry request quotes and whose code is the
withheld reason when no retry fixes it.

Discovery: every call of the group is judged once on each axis and check (ok | fail |
unresolved), every finding names a call of the group, every failed dimension is referenced by
an error or omission of that call and every unresolved one by an unresolved finding, and no
finding names a dimension judged ok; every line of every step's text parts has exactly one
verdict, consistent with the findings (`check_lines`; all `review_inconsistent`).
Localization: selectors resolve (curate's codes), an error's exclusions lie in its own message,
and no exclusion overlaps a protected region (`exclude_protected`); or the localizer's
"unresolved" (the finding cannot be located), alone.
"""

from __future__ import annotations

from rossjax.review.answers import BadAnswer, inconsistent, malformed, want_int, want_list, want_str

# the four per-call axes, then the narrative (the step's own statements match the transcript)
# and causal (the step follows from what it had, not from an earlier wrong step) checks
AXES = ("contract", "operation", "environment", "execution", "narrative", "causal")
LINE_PARTS = ("content", "reasoning", "tool_calls")
JUDGMENTS = ("ok", "fail", "unresolved")
KINDS = ("error", "omission", "unresolved")


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
            raise inconsistent(f"{where} covers message {m} part {part}, which is not a text "
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
                    raise inconsistent(f"message {m} {part}: {what}; judge every line of every "
                                        f"step once")
                nxt = hi + 1
            if nxt != n + 1:
                raise inconsistent(f"message {m} {part}: line {nxt} has no verdict; judge every "
                                    f"line of every step once ({n} lines)")
        kinds = {f["kind"] for f in findings if f["message"] == m}
        if "fail" in verdicts[m] and not kinds & {"error", "omission"}:
            raise inconsistent(f"message {m} has lines judged fail but no error or omission finding")
        if "unresolved" in verdicts[m] and "unresolved" not in kinds:
            raise inconsistent(f"message {m} has lines judged unresolved but no unresolved finding")
        if "error" in kinds and "fail" not in verdicts[m]:
            raise inconsistent(f"message {m} has an error finding but no line judged fail")


def check_discovery(obj: dict, group: list[tuple[int, int]], rendered=None) -> list[dict]:
    """The findings of a discovery answer for `group` [(message, n_calls)], checked for
    coverage and consistency with the per-call judgments, and with `rendered`, the line
    accounting (check_lines)."""
    owned = {(m, c) for m, n in group for c in range(n)}
    judged: dict[tuple[int, int], dict] = {}
    for j, c in enumerate(want_list(obj, "calls", "answer")):
        key = (want_int(c, "message", f"calls[{j}]"), want_int(c, "call", f"calls[{j}]", 0, 0))
        if key not in owned:
            raise inconsistent(f"calls[{j}] judges message {key[0]} call {key[1]}, which is not "
                                f"a call of the steps in this request")
        if key in judged:
            raise inconsistent(f"message {key[0]} call {key[1]} is judged twice")
        for ax in AXES:
            if c.get(ax) not in JUDGMENTS:
                raise malformed(f"calls[{j}].{ax}", f"must be one of {', '.join(JUDGMENTS)}, "
                                                    f"got {c.get(ax)!r:.40}")
        judged[key] = {ax: c[ax] for ax in AXES}
    missing = sorted(owned - set(judged))
    if missing:
        raise inconsistent(f"message {missing[0][0]} call {missing[0][1]} has no judgment: "
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
            raise inconsistent(f"findings[{j}] names message {key[0]} call {key[1]}, which is "
                                "not a call of the steps in this request")
        want = "unresolved" if kind == "unresolved" else "fail"
        for a in axes:
            if judged[key][a] != want:
                raise inconsistent(f"findings[{j}] is a {kind} on {a} of message {key[0]} call "
                                    f"{key[1]}, but that dimension is judged {judged[key][a]}")
        findings.append({"kind": kind, "message": key[0], "call": key[1], "axes": list(axes),
                         "what": what})
    for (m, c), js in sorted(judged.items()):
        for a, v in js.items():
            kinds = ("unresolved",) if v == "unresolved" else ("error", "omission")
            if v != "ok" and not any(f["message"] == m and f["call"] == c and a in f["axes"]
                                     and f["kind"] in kinds for f in findings):
                raise inconsistent(f"message {m} call {c} is judged {v} on {a}, but no "
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
    "protect": [...], "omission": {...} | None} of (selector, interval) pairs, or, when the
    localizer answers that the finding cannot be located, {"unresolved": why} (the paper's
    answer: the row is withheld, nothing is guessed)."""
    if obj.get("unresolved") is not None:
        why = want_str(obj, "unresolved", "answer")
        if obj.get("exclude") or obj.get("after") or obj.get("protect"):
            raise inconsistent("answer gives selectors and also says unresolved: give the "
                                "selectors, or only unresolved with why")
        return {"unresolved": why}
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
            raise inconsistent(f"exclude[{j}] is in message {s['message']}, but the finding is "
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
