"""The methods one run reconstructs with (config.method), RetroGen and the paper's baselines,
all from the same anchor (task x̂, rubric, Ê) and scored by the same four signals:

  retrogen       the artifact y* and Ê are shown to the agent at every step (artifact-anchored)
  forwardgen     the same agent from x̂ alone: no artifact, no Ê, the same tools and budget
  artifact_only  x̂ -> ỹ in one answer, no intermediate interactions (no trace: the record
                 carries artifact_only, which the retrogen gate accepts without tool calls)
  next_n         next-N replace: anchored for the first `next_n` tool steps, then the artifact
                 is replaced by forward generation for the rest of the steps and the draft

A run with the same `cache_dir` as an earlier one replays its anchor answers, so methods are
compared on the same tasks and rubrics.
"""

from __future__ import annotations

from rossjax.reconstruct import prompts, verify
from rossjax.reconstruct.anchor import initialize
from rossjax.reconstruct.asking import Asker, want_text
from rossjax.reconstruct.trace import reconstruct

METHODS = ("retrogen", "forwardgen", "artifact_only", "next_n")


def _public(evidence: list[dict]) -> list[dict]:
    return [{k: e[k] for k in ("id", "title", "cues", "score")} for e in evidence]


def run_artifact(asker: Asker, art: dict, index, tools, cfg) -> dict:
    """The record of one artifact (curate/retrogen.py's schema plus provenance), or Settled."""
    a = initialize(asker, art, index, cfg)
    if cfg.method == "artifact_only":
        draft = asker.ask("direct", prompts.direct(art, a.task),
                          lambda o: want_text(o, "text", "direct"))
        rec = {"plan": [], "trace": [], "draft": draft, "draws": {}, "tool_steps": 0}
    else:
        rec = reconstruct(asker, art, a.task, a.evidence, tools, cfg.method, cfg)
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
        out["artifact_only"] = True
    return out
