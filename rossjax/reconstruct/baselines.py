"""The methods one run reconstructs with (config.method), RetroGen and the paper's baselines,
all from the same anchor (task x̂, rubric, Ê) and scored by the same four signals:

  retrogen       the agent works from x̂ and Ê (ids and titles) with the corpus tools; y* is
                 never shown to it (only induction, cues, retrieval and the quality judge read it)
  forwardgen     the same agent from x̂ alone: no Ê, the same tools and budget
  artifact_only  the SAME reconstruction as retrogen (the same prompts, so a shared cache_dir
                 replays its answers), with the tool calls, observations and notes removed: the
                 record keeps x̂ and ỹ, and the scores the retrogen record was selected by
                 (scored on the full trajectory, never re-scored on the empty one, whose
                 consistency would be the judge's view of nothing). `rossjax retrogen
                 :artifact_only` makes the same baseline from retrogen's records at
                 serialization time.

The selection ablations (next-N replace, single-signal filters) act on scored records in
`rossjax retrogen` (curate/retrogen.py `selection`), not here.
"""

from __future__ import annotations

from rossjax.reconstruct import prompts, verify
from rossjax.reconstruct.anchor import initialize
from rossjax.reconstruct.asking import Asker
from rossjax.reconstruct.trace import reconstruct

METHODS = ("retrogen", "forwardgen", "artifact_only")


def _public(evidence: list[dict]) -> list[dict]:
    return [{k: e[k] for k in ("id", "title", "cues", "score")} for e in evidence]


def run_artifact(asker: Asker, art: dict, index, tools, cfg) -> dict:
    """The record of one artifact (curate/retrogen.py's schema plus provenance), or Settled."""
    a = initialize(asker, art, index, cfg)
    # artifact_only reconstructs exactly as retrogen (same draws, same prompts), then strips
    method = "retrogen" if cfg.method == "artifact_only" else cfg.method
    rec = reconstruct(asker, art, a.task, a.evidence, tools, method, cfg)
    scores, detail = verify.verify(asker, art, a.task, a.rubric, rec["trace"], rec["draft"],
                                   a.evidence, cfg)
    out = {
        "id": art["id"] if cfg.method == "retrogen" else f"{art['id']}@{cfg.method}",
        "task_id": art["id"], "domain": art["domain"], "task": a.task,
        "evidence": [f"{e['id']}: {e['title']}" for e in a.evidence],
        "trace": rec["trace"], "draft": rec["draft"], "scores": scores,
        "score": round(verify.eq4(scores, cfg.lam), 6), "method": cfg.method,
        "artifact": {"id": art["id"], "kind": art.get("kind", ""), "chars": len(art["text"])},
        "rubric": a.rubric, "cues": a.cues, "cues_dropped": a.cues_dropped,
        "evidence_docs": _public(a.evidence), "plan": rec["plan"], "diversity": rec["draws"],
        "tool_steps": rec["tool_steps"], "verification": detail,
        "leak_retries": a.leak_retries, "prompt_version": prompts.PROMPT_VERSION,
    }
    if cfg.method == "artifact_only":
        out.update(trace=[], plan=[], artifact_only=True, tool_steps=0,
                   scored_on="the retrogen trajectory this record was stripped from")
    return out
