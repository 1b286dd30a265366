"""RetroGen: gate, score and serialize reconstructed tool-use trajectories for SFT.

Input record (one JSON object per line):
  {"id": "rg-1", "domain": "finance", "task": "...", "evidence": ["...", ...],
   "trace": [{"type": "note", "content": "..."},
             {"type": "call", "id": "c1", "name": "search", "arguments": {...} | "<json object>"},
             {"type": "observation", "call_id": "c1", "content": "...", "ok": true},  ...],
   "draft": "...",
   "scores": {"rubric": 0.8, "quality": 0.7, "grounding": 0.9, "consistency": 0.85}}

1. Structural gate (deterministic, before any score is read): every call has a name and arguments
   that parse to a JSON object; every call is answered by its observation before the next call or
   the draft; no observation is orphaned, failed (`ok: false`, an `error` field) or empty; the task
   and a final draft exist; the four scores are finite numbers in [0, 1]. A failure discards the
   row with a reason code and a detail sentence.
2. Score = sum_k w_k * score_k (default 0.25 each; weights are used as given, not renormalized).
   Per domain, the threshold is fixed (`threshold`, or `domain_thresholds[domain]`: the paper's
   calibrated PAPER_THRESHOLDS for science, finance and legal ship as the config's defaults) or
   the `quantile` of that domain's gated scores; a row is kept when score >= threshold.
3. Serialization into rollout records (messages) for `rossjax curate`, in the order task,
   evidence (listed after the task in the user turn unless `evidence_in_prompt=False`), trace,
   draft: per trajectory a seeded, order-independent coin picks JSON tool calls
   (`<tool_call>{...}</tool_call>`, each followed by its note with `note_position="after_call"`,
   results in the next user turn as `<tool_response>...</tool_response>`) or ReAct (`Thought:`
   before `Action:` / `Action Input:`, as that format defines, then `Observation:`).
   `artifact_only` keeps task (+ evidence) and draft only (the ablation).
   Selection (`selection`): "threshold" (the method: keep score >= threshold); "next_n_replace"
   (the paper's selection ablation: per domain, the K rows the threshold keeps are replaced by
   the next K by score, ranks K+1..2K, fewer when the domain has fewer below the threshold);
   "signal:NAME" (a single-signal filter: the score is that one signal, weight 1, the others 0;
   thresholds as configured).
4. Loss scope (`loss`): "sequence" (the paper's Eq. 7) marks each rollout `loss_scope:
   "sequence"`, so the compiler supervises every token of the serialized sample (task, evidence,
   observations and template included); "assistant" leaves the usual assistant-only mask.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os

import numpy as np

from rossjax.errors import ConfigError, InputError

SIGNALS = ("rubric", "quality", "grounding", "consistency")
SELECTIONS = ("threshold", "next_n_replace") + tuple(f"signal:{k}" for k in SIGNALS)
DEFAULT_WEIGHTS = {k: 0.25 for k in SIGNALS}
FORMS = ("json", "react")
NOTE_POSITIONS = ("after_call", "before_call")
LOSS_SCOPES = ("sequence", "assistant")
# The paper's per-domain calibrated thresholds for its three domains.
PAPER_THRESHOLDS = {"science": 0.52, "finance": 0.48, "legal": 0.63}


@dataclasses.dataclass
class Scored:
    kept: list          # [{"record", "score", "threshold"}]
    discarded: list     # [{"index", "id", "domain", "reason", "detail"}] (gate failures and
                        # below threshold; index: 0-based position in the input records)
    report: dict        # per domain: counts, mean, median, p25, p75, threshold, mode


def _text(x) -> bool:
    return isinstance(x, str) and bool(x.strip())


def gate(record) -> tuple[str, str] | None:
    """None if the trajectory is structurally sound, else (reason code, detail sentence)."""
    if not isinstance(record, dict):
        return "bad_record", "record is not a JSON object"
    if not _text(record.get("task")):
        return "missing_task", "task is missing or blank"
    trace = record.get("trace")
    if not isinstance(trace, list):
        return "malformed_trace", "trace must be a list of steps"
    pending = None  # the call waiting for its observation
    n_calls = 0
    for i, step in enumerate(trace):
        kind = step.get("type") if isinstance(step, dict) else None
        if kind == "call":
            if pending is not None:
                return "missing_observation", f"trace[{pending[0]}] call has no observation before trace[{i}]"
            if not _text(step.get("name")):
                return "malformed_call", f"trace[{i}].name is missing"
            args = step.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    return "malformed_call", f"trace[{i}].arguments is not valid JSON"
            if not isinstance(args, dict):
                return "malformed_call", f"trace[{i}].arguments is not a JSON object"
            pending = (i, step.get("id"))
            n_calls += 1
        elif kind == "observation":
            if pending is None:
                return "orphan_observation", f"trace[{i}] observation answers no call"
            if step.get("call_id") is not None and pending[1] is not None and step["call_id"] != pending[1]:
                return ("missing_observation",
                        f"trace[{i}].call_id {step['call_id']!r} does not match call {pending[1]!r}")
            if step.get("ok") is False or step.get("error") or not _text(step.get("content")):
                return "failed_retrieval", f"trace[{i}] observation failed or is empty"
            pending = None
        elif kind == "note":
            if not isinstance(step.get("content"), str):
                return "malformed_trace", f"trace[{i}].content of a note must be a string"
        else:
            return "malformed_trace", f"trace[{i}].type {kind!r} is not call, observation or note"
    if pending is not None:
        return "missing_observation", f"trace[{pending[0]}] call has no observation"
    if n_calls == 0 and record.get("artifact_only") is not True:  # the Artifact-Only baseline
        return "no_tool_calls", "trace has no tool call"
    if not _text(record.get("draft")):
        return "missing_draft", "final draft is missing or blank"
    scores = record.get("scores")
    if not isinstance(scores, dict):
        return "invalid_score", "scores must be an object with " + ", ".join(SIGNALS)
    for k in SIGNALS:
        v = scores.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1:
            return "invalid_score", f"scores.{k} is {v!r}, not a finite number in [0, 1]"
    return None


def _check_weights(weights) -> dict:
    w = dict(DEFAULT_WEIGHTS if weights is None else weights)
    if set(w) != set(SIGNALS):
        raise InputError(f"weights must name exactly {SIGNALS}, got {sorted(w)}.")
    for k, v in w.items():
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise InputError(f"weights.{k} must be a finite non-negative number, got {v!r}.")
    if sum(w.values()) <= 0:
        raise InputError("weights must not all be zero.")
    return w


def score_traces(records, weights=None, *, threshold: float = 0.5, quantile: float | None = None,
                 domain_thresholds: dict | None = None, selection: str = "threshold") -> Scored:
    """Gate, score and threshold `records` per domain (see the module docstring).

    threshold: the fixed threshold; quantile: when set (0..1), each domain's threshold is that
    quantile of its gated scores instead (linear interpolation); domain_thresholds: fixed
    per-domain overrides, which win over both; selection: one of SELECTIONS (module docstring).
    """
    if selection not in SELECTIONS:
        raise ConfigError(f"config.selection {selection!r} must be one of {', '.join(SELECTIONS)}")
    if selection.startswith("signal:"):  # one signal alone decides
        weights = {k: float(k == selection.split(":", 1)[1]) for k in SIGNALS}
    w = _check_weights(weights)
    if not math.isfinite(threshold):
        raise InputError(f"threshold must be finite, got {threshold!r}.")
    if quantile is not None and not (isinstance(quantile, (int, float)) and 0 <= quantile <= 1):
        raise InputError(f"quantile must be a number in [0, 1], got {quantile!r}.")
    for d, t in (domain_thresholds or {}).items():
        if not isinstance(t, (int, float)) or not math.isfinite(t):
            raise InputError(f"domain_thresholds.{d} must be a finite number, got {t!r}.")
    by_domain: dict[str, list] = {}
    failed: dict[str, dict] = {}
    discarded = []
    for k, rec in enumerate(records):
        rid = rec.get("id", f"row {k + 1}") if isinstance(rec, dict) else f"row {k + 1}"
        dom = str(rec.get("domain") or "default") if isinstance(rec, dict) else "default"
        bad = gate(rec)
        if bad:
            failed.setdefault(dom, {})[bad[0]] = failed.setdefault(dom, {}).get(bad[0], 0) + 1
            discarded.append({"index": k, "id": rid, "domain": dom, "reason": bad[0],
                              "detail": bad[1]})
            by_domain.setdefault(dom, [])
            continue
        s = sum(w[x] * float(rec["scores"][x]) for x in SIGNALS)
        by_domain.setdefault(dom, []).append((k, rec, s))
    kept, report = [], {}
    for dom in sorted(by_domain):
        rows = by_domain[dom]
        scores = np.array([s for _, _, s in rows], np.float64)
        if domain_thresholds and dom in domain_thresholds:
            thr, mode = float(domain_thresholds[dom]), "fixed (domain)"
        elif quantile is not None and len(scores):
            thr, mode = float(np.quantile(scores, quantile)), f"quantile {quantile:g}"
        else:
            thr, mode = float(threshold), "fixed"
        above = [(k, rec, s) for k, rec, s in rows if s >= thr]
        picked = above
        if selection == "next_n_replace":  # the next K by score stand in for the K selected
            below = sorted((r for r in rows if r[2] < thr), key=lambda r: (-r[2], r[0]))
            picked = below[:len(above)]
        ids = {k for k, _, _ in picked}
        for k, rec, s in rows:
            if k in ids:
                kept.append({"record": rec, "score": s, "threshold": thr})
            elif s >= thr:  # next_n_replace: a selected row, replaced
                discarded.append({"index": k, "id": rec.get("id"), "domain": dom,
                                  "reason": "replaced_by_next_n",
                                  "detail": f"score {s:.4f} >= threshold {thr:.4f}, replaced by "
                                            f"the next-highest (selection next_n_replace)"})
            else:
                discarded.append({"index": k, "id": rec.get("id"), "domain": dom,
                                  "reason": "below_threshold",
                                  "detail": f"score {s:.4f} < threshold {thr:.4f}"})
        n_kept = len(picked)
        q = (lambda p: float(np.percentile(scores, p))) if len(scores) else (lambda p: None)
        report[dom] = {"rows": len(rows) + sum(failed.get(dom, {}).values()),
                       "gate_failed": dict(sorted(failed.get(dom, {}).items())),
                       "scored": len(rows), "kept": n_kept,
                       "mean": float(scores.mean()) if len(scores) else None,
                       "median": q(50), "p25": q(25), "p75": q(75),
                       "threshold": thr, "threshold_mode": mode, "selection": selection,
                       "selected": len(above)}
    return Scored(kept, discarded, report)


def format_report(report: dict) -> str:
    head = f"{'domain':14s} {'rows':>5s} {'gated':>5s} {'kept':>5s} {'mean':>6s} {'median':>6s} " \
           f"{'p25':>6s} {'p75':>6s} {'thresh':>6s}  mode"
    lines = [head]
    f = lambda v: f"{v:6.3f}" if v is not None else f"{'-':>6s}"  # noqa: E731
    for d, r in report.items():
        lines.append(f"{d:14s} {r['rows']:5d} {r['scored']:5d} {r['kept']:5d} {f(r['mean'])} "
                     f"{f(r['median'])} {f(r['p25'])} {f(r['p75'])} {f(r['threshold'])}  "
                     f"{r['threshold_mode']}")
    return "\n".join(lines)


def _args(step) -> dict:
    a = step.get("arguments", {})
    return json.loads(a) if isinstance(a, str) else a


def serialize(record: dict, form: str = "json", *, artifact_only: bool = False,
              system: str | None = None, evidence_in_prompt: bool = True,
              note_position: str = "after_call") -> list[dict]:
    """Chat messages for one gated trajectory: user task (+ evidence), assistant turns with
    tool calls and their notes, user turns with the observations, a final assistant draft."""
    if form not in FORMS:
        raise InputError(f"serialization form must be one of {FORMS}, got {form!r}.")
    if note_position not in NOTE_POSITIONS:
        raise InputError(f"note_position must be one of {NOTE_POSITIONS}, got {note_position!r}.")
    msgs = [{"role": "system", "content": system}] if system else []
    prompt = record["task"].strip()
    ev = record.get("evidence") or []
    if evidence_in_prompt and ev:
        ev = [ev] if isinstance(ev, str) else ev
        prompt += "\n\nEvidence:\n" + "\n".join(f"- {e}" for e in ev)
    msgs.append({"role": "user", "content": prompt})
    notes: list[str] = []
    if not artifact_only:
        for step in record["trace"]:
            if step["type"] == "note":
                if step["content"].strip():
                    notes.append(step["content"].strip())
            elif step["type"] == "call":
                call = {"name": step["name"], "arguments": _args(step)}
                if form == "json":
                    tag = "<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>"
                    body = "\n".join([tag] + notes if note_position == "after_call"
                                     else notes + [tag])
                else:
                    body = "\n".join([f"Thought: {n}" for n in notes] +
                                     [f"Action: {call['name']}",
                                      "Action Input: " + json.dumps(call["arguments"], ensure_ascii=False)])
                msgs.append({"role": "assistant", "content": body})
                notes = []
            else:
                obs = step["content"].strip()
                msgs.append({"role": "user", "content": f"<tool_response>\n{obs}\n</tool_response>"
                             if form == "json" else f"Observation: {obs}"})
    draft = record["draft"].strip()
    if form == "react" and not artifact_only:
        final = "\n".join([f"Thought: {n}" for n in notes] + [f"Final Answer: {draft}"])
    else:
        final = "\n".join(notes + [draft])
    msgs.append({"role": "assistant", "content": final})
    return msgs


def pick_form(record_id: str, seed: int, react_prob: float) -> str:
    """Seeded per-trajectory coin, independent of row order (a hash of seed and id)."""
    h = hashlib.blake2b(f"{seed}:{record_id}".encode(), digest_size=8).digest()
    return "react" if int.from_bytes(h, "little") / 2.0 ** 64 < react_prob else "json"


def to_rollouts(kept: list, *, seed: int = 0, react_prob: float = 0.5, artifact_only: bool = False,
                system: str | None = None, evidence_in_prompt: bool = True,
                note_position: str = "after_call", loss: str = "sequence") -> list[dict]:
    """Rollout records (docs/data.md) for the kept trajectories, ready for `rossjax curate`."""
    if not 0 <= react_prob <= 1:
        raise InputError(f"react_prob must be in [0, 1], got {react_prob!r}.")
    if loss not in LOSS_SCOPES:
        raise InputError(f"loss must be one of {LOSS_SCOPES}, got {loss!r}.")
    out = []
    for k in kept:
        rec = k["record"]
        form = pick_form(str(rec.get("id")), seed, react_prob)
        out.append({
            "id": str(rec.get("id")),
            "task": {"id": str(rec.get("task_id", rec.get("id"))),
                     "domain": str(rec.get("domain") or "default"), "prompt": rec["task"]},
            "source": {"run": "retrogen", "step": 0},
            "messages": serialize(rec, form, artifact_only=artifact_only, system=system,
                                  evidence_in_prompt=evidence_in_prompt,
                                  note_position=note_position),
            "loss_scope": loss,
            "reward": float(k["score"]),
            "verifier": {"name": "retrogen", "passed": True,
                         "evidence": f"score {k['score']:.4f} >= threshold {k['threshold']:.4f}; "
                                     f"form {form}"},
        })
    return out


def run(cfg, workdir: str | None = None) -> Scored:
    """Read cfg.input (.jsonl[.gz]), score, write `workdir` (default cfg.output)/{retrogen.jsonl,
    discarded.jsonl, report.json}. Every input line ends kept or discarded with a reason (a line
    that is not JSON is discarded as `invalid_json`), and report.json's counts add up to the input
    rows."""
    from collections import Counter

    from rossjax.curate.schema import iter_json_lines

    out_dir = workdir or cfg.output
    if not cfg.input or not out_dir:
        raise ConfigError("retrogen needs --config.input (trajectories .jsonl) and "
                         "--config.output (a directory).")
    if not os.path.exists(cfg.input):
        raise FileNotFoundError(f"{cfg.input}: no such trajectory file (config.input)")
    records, lines, unreadable = [], [], []
    for row in iter_json_lines(cfg.input):
        if row.record is None:
            unreadable.append({"row": row.row, "id": None, "domain": None, "reason": "invalid_json",
                               "detail": row.reason})
        else:
            records.append(row.record)
            lines.append(row.row)
    res = score_traces(records, dict(cfg.weights), threshold=cfg.threshold, quantile=cfg.quantile,
                       domain_thresholds=dict(cfg.domain_thresholds),
                       selection=cfg.get("selection", "threshold"))
    name = os.path.basename(cfg.input)
    for d in res.discarded:  # name the input line, so a person can find the trajectory
        d["row"] = lines[d.pop("index")]
        d["detail"] = f"{name} row {d['row']}: {d['detail']}"
    res.discarded[:0] = unreadable
    rows = to_rollouts(res.kept, seed=cfg.seed, react_prob=cfg.react_prob,
                       artifact_only=cfg.artifact_only, system=cfg.system or None,
                       evidence_in_prompt=cfg.evidence_in_prompt,
                       note_position=cfg.get("note_position", "after_call"),
                       loss=cfg.get("loss", "sequence"))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "retrogen.jsonl"), "w") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    with open(os.path.join(out_dir, "discarded.jsonl"), "w") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in res.discarded)
    n_in = len(records) + len(unreadable)
    if len(rows) + len(res.discarded) != n_in:  # the accounting promise; never write a lie
        raise AssertionError(f"{len(rows)} kept + {len(res.discarded)} discarded != {n_in} rows")
    forms = [r["verifier"]["evidence"].rsplit(" ", 1)[-1] for r in rows]
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump({"input": cfg.input, "rows": n_in, "kept": len(rows),
                   "discarded": dict(sorted(Counter(d["reason"] for d in res.discarded).items())),
                   "forms": {x: forms.count(x) for x in FORMS}, "artifact_only": cfg.artifact_only,
                   "selection": cfg.get("selection", "threshold"), "loss": cfg.get("loss", "sequence"),
                   "domains": res.report}, f, indent=2)
    return res
