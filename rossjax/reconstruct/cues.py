"""Cues of an expert artifact found by rules (citations, statutes, case names, figures,
organizations, periods), and the leak rules that keep the artifact's content out of the task.

Rules run first because they are exact and free; the model adds what they cannot see (anchor.py)
and every model cue must occur verbatim in the artifact. Which cue kinds the task may name:
an organization or a period says what to research (a 10-K task must name its company and
year); a citation, statute, case name or figure is what the research must find, so naming one
in the task leaks the answer (LEAK_KINDS).
"""

from __future__ import annotations

import re

_NAME = r"[A-Z][A-Za-z'\-]+"
_YEAR = r"(?:19|20)\d{2}[a-z]?"
RULES: tuple[tuple[str, re.Pattern], ...] = (
    ("citation", re.compile(rf"\b{_NAME}(?: et al\.| (?:and|&) {_NAME})? \({_YEAR}\)")),
    ("citation", re.compile(rf"\b{_NAME}(?: et al\.| (?:and|&) {_NAME}),? {_YEAR}\b")),
    ("citation", re.compile(r"\[\d+(?:\s*[,\u2013-]\s*\d+)*\]")),
    ("statute", re.compile(r"\b\d+\s+U\.S\.C\.\s+§+\s*\d+[\w()\-.]*[\w)]")),
    ("statute", re.compile(r"§+\s*\d+[\w()\-.]*[\w)]")),
    ("statute", re.compile(r"\b(?:Section|Article|Rule|Regulation)\s+\d+[\w()\-]*[\w)]")),
    ("case", re.compile(rf"\b{_NAME}(?: {_NAME})* v\. {_NAME}(?: (?:of |the |and )?{_NAME})*")),
    ("figure", re.compile(r"\$\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:million|billion|thousand|trillion))?")),
    ("figure", re.compile(r"\b\d+(?:\.\d+)?\s?%")),
    ("organization", re.compile(
        r"\b[A-Z][\w&.\-]*(?: [A-Z][\w&.\-]*)* (?:Inc\.|Corp\.|Corporation|LLC|Ltd\.|plc|N\.A\.)")),
    ("period", re.compile(rf"\b(?:fiscal(?: year)?|FY)\s?{_YEAR}\b", re.I)),
)
KINDS = ("citation", "statute", "case", "figure", "organization", "period", "entity", "dataset",
         "method", "term", "date", "other")
LEAK_KINDS = ("citation", "statute", "case", "figure")
_WORD = re.compile(r"[a-z0-9]+")


def rule_cues(text: str) -> list[dict]:
    """[{"text", "kind", "source": "rule"}] in order of first occurrence, each text once; a match
    inside a longer match (the "§ 107" of "17 U.S.C. § 107") is left out."""
    found = []
    for kind, pat in RULES:
        for m in pat.finditer(text):
            found.append((m.start(), m.end(), kind, m.group(0).strip()))
    found.sort(key=lambda f: (f[0], -(f[1] - f[0])))
    out, seen, end = [], set(), -1
    for s, e, kind, t in found:
        if e <= end:  # inside the previous, longer cue
            continue
        end = max(end, e)
        if t.lower() not in seen:
            seen.add(t.lower())
            out.append({"text": t, "kind": kind, "source": "rule"})
    return out


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def sentence_of(text: str, cue: str, max_words: int = 40) -> str:
    """The artifact's sentence holding `cue` (its first occurrence), at most `max_words` words
    around it: the query artifact-conditioned retrieval sends for the cue."""
    i = text.find(cue)
    if i < 0:
        return cue
    lo = max(text.rfind(". ", 0, i), text.rfind("\n", 0, i)) + 1
    hi_dot = text.find(". ", i + len(cue))
    hi = len(text) if hi_dot < 0 else hi_dot + 1
    ws = text[lo:hi].split()
    return " ".join(ws[:max_words])


def leak(task: str, artifact: str, cues: list[dict], *, ngram: int, max_chars: int,
         max_ratio: float) -> str | None:
    """None if the task keeps the artifact's content out, else the rule it breaks, as a sentence
    the model is shown on the retry (and the withheld detail when no retry fixes it)."""
    limit = min(max_chars, int(max_ratio * len(artifact)))
    if len(task) > limit:
        return (f"the task has {len(task)} characters, more than {limit} (leak rule length: "
                f"at most {max_chars} and at most {max_ratio:g} of the artifact's length)")
    low = task.lower()
    for c in cues:
        if c["kind"] in LEAK_KINDS and c["text"].lower() in low:
            return (f"the task names the artifact's {c['kind']} {c['text']!r} (leak rule cue: a "
                    f"{c['kind']} is what the research must find)")
    tw, aw = words(task), words(artifact)
    grams = {tuple(aw[i:i + ngram]) for i in range(len(aw) - ngram + 1)}
    for i in range(len(tw) - ngram + 1):
        if tuple(tw[i:i + ngram]) in grams:
            return (f"the task repeats {ngram} consecutive words of the artifact: "
                    f"{' '.join(tw[i:i + ngram])!r} (leak rule n-gram)")
    return None
