"""Evidence-constrained verification (RetroGen §3): four signals, each scored by the model on
its own request, and Eq. 4.

  s_rub  each rubric criterion judged full (1) / partial (0.5) / missed (0) on the draft; mean
  s_qual the draft's quality, 1-5 against the expert artifact as reference, mapped to (q-1)/4
  s_grd  the claims of the notes and of the draft, each supported or not by a document of Ê;
         the share supported (a claim "supported" by no id, or by an id outside Ê, is not)
  s_con  the workflow's internal references (entry -> earlier entry), each consistent or not;
         the share consistent; none listed scores 0 (an empty trace earns no free
         consistency: Eq. 4 would hand it +0.25)
  Eq. 4  S = λ (s_rub + s_qual + s_grd + s_con), λ = 0.25

An answer that misses a criterion, names an entry the workflow does not have, or gives a score
out of range fails its check and is asked again (asking.py), then the artifact is invalid.
"""

from __future__ import annotations

import re

from rossjax.reconstruct import prompts
from rossjax.reconstruct.asking import Asker, bad, want_items
from rossjax.reconstruct.trace import render

VERDICTS = {"full": 1.0, "partial": 0.5, "missed": 0.0}
SIGNALS = ("rubric", "quality", "grounding", "consistency")


def eq4(scores: dict, lam: float = 0.25) -> float:
    return lam * sum(scores[k] for k in SIGNALS)


def rubric(asker: Asker, art, task, rub, draft):
    def check(obj):
        items = want_items(obj, "verdicts", "verify_rubric", lo=len(rub), hi=len(rub))
        got = {}
        for j, v in enumerate(items):
            k = v.get("criterion")
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(rub):
                raise bad(f"verify_rubric.verdicts[{j}].criterion",
                          f"must be a criterion number 1..{len(rub)}, got {k!r:.40}")
            if k in got:
                raise bad(f"verify_rubric.verdicts[{j}].criterion", f"repeats criterion {k}")
            if v.get("verdict") not in VERDICTS:
                raise bad(f"verify_rubric.verdicts[{j}].verdict",
                          f"must be full, partial or missed, got {v.get('verdict')!r:.40}")
            got[k] = v["verdict"]
        return [got[k] for k in range(1, len(rub) + 1)]

    verdicts = asker.ask("verify_rubric", prompts.verify_rubric(art, task, rub, draft), check)
    return sum(VERDICTS[v] for v in verdicts) / len(verdicts), {"verdicts": verdicts}


def quality(asker: Asker, art, task, draft):
    def check(obj):
        q = obj.get("score")
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 1 <= q <= 5:
            raise bad("verify_quality.score", f"must be a number from 1 to 5, got {q!r:.40}")
        return float(q)

    q = asker.ask("verify_quality", prompts.verify_quality(art, task, draft), check)
    return (q - 1) / 4, {"rating": q}


def grounding(asker: Asker, art, task, notes, draft, evidence, per_doc):
    ids = {e["id"] for e in evidence}
    n_notes = len(notes)

    def check(obj):
        items = want_items(obj, "claims", "verify_grounding", lo=1)
        out = []
        for j, c in enumerate(items):
            where = f"verify_grounding.claims[{j}]"
            src = c.get("source")
            k = re.fullmatch(r"note ([0-9]{1,6})", src) if isinstance(src, str) else None
            ok_src = src == "draft" or (k is not None and 1 <= int(k.group(1)) <= n_notes)
            if not ok_src:
                raise bad(f"{where}.source", f"must be 'draft' or 'note K' with K in 1..{n_notes}, "
                                             f"got {src!r:.40}")
            if not isinstance(c.get("supported"), bool):
                raise bad(f"{where}.supported", f"must be true or false, got {c.get('supported')!r:.40}")
            ev = c.get("evidence")
            if ev is not None and not isinstance(ev, str):
                raise bad(f"{where}.evidence", f"must be a document id or null, got {ev!r:.40}")
            out.append({"source": src, "supported": c["supported"] and ev in ids, "evidence": ev,
                        "claimed": c["supported"]})
        return out

    claims = asker.ask("verify_grounding", prompts.verify_grounding(
        art, task, notes, draft, evidence, per_doc), check)
    outside = sum(c["claimed"] and not c["supported"] for c in claims)
    return (sum(c["supported"] for c in claims) / len(claims),
            {"claims": len(claims), "supported": sum(c["supported"] for c in claims),
             "supported_outside_evidence": outside})


def consistency(asker: Asker, art, task, trace, draft):
    lines = render(trace) + [f"[{len(trace) + 1}] draft: {draft}"]
    n = len(lines)

    def check(obj):
        items = want_items(obj, "references", "verify_consistency", lo=0)
        out = []
        for j, r in enumerate(items):
            where = f"verify_consistency.references[{j}]"
            e, t = r.get("entry"), r.get("refers_to")
            for key, v in (("entry", e), ("refers_to", t)):
                if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= n:
                    raise bad(f"{where}.{key}", f"must be an entry number 1..{n}, got {v!r:.40}")
            if t >= e:
                raise bad(f"{where}.refers_to", f"must be an earlier entry than {e}, got {t}")
            if not isinstance(r.get("consistent"), bool):
                raise bad(f"{where}.consistent", f"must be true or false, got {r.get('consistent')!r:.40}")
            out.append(r["consistent"])
        return out

    refs = asker.ask("verify_consistency", prompts.verify_consistency(art, task, "\n".join(lines)),
                     check)
    return (sum(refs) / len(refs) if refs else 0.0), {"references": len(refs),
                                                     "consistent": sum(refs)}


def verify(asker: Asker, art: dict, task: str, rub: list, trace: list, draft: str,
           evidence: list, cfg) -> tuple[dict, dict]:
    """(scores {rubric, quality, grounding, consistency}, details per signal)."""
    notes = [e["content"] for e in trace if e["type"] == "note"]
    out, detail = {}, {}
    out["rubric"], detail["rubric"] = rubric(asker, art, task, rub, draft)
    out["quality"], detail["quality"] = quality(asker, art, task, draft)
    out["grounding"], detail["grounding"] = grounding(asker, art, task, notes, draft, evidence,
                                                      cfg.evidence_chars)
    out["consistency"], detail["consistency"] = consistency(asker, art, task, trace, draft)
    return {k: round(float(v), 6) for k, v in out.items()}, detail
