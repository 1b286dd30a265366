"""`rossjax label-corpus --config=configs/propel_swe.py:label`: the SWE label corpus (PROPEL's
U_S for K = 3), the trainer side of rossjax/agents/swe_label.py: the solver policy from the
config's solver section, the probe's input rows, the files and the printed next steps.

Outputs (in the output dir, as label_corpus.py's other domains):
  labels.jsonl   the kept bugs only: {"id", "trials": [true|false|null x 3], "valid": 1,
                  "group" and "family" (the repository: grouped folds never split a repository),
                  "solve_rate" (solved / judged), "utility" (1 iff 0 < solve_rate < 1),
                  ["probe_score", "step"]}; a bug that is invalid or has fewer than
                  `min_valid` judged trials is not kept (report.json says why, per id);
  inputs.jsonl   {"id", "input_ids", "text", "turn_spans"} of the kept bugs: a generator
                  record's exact ids with one span per generated turn (its assistant
                  message_spans), else the rendered messages (one span), else the bug's patch as
                  a user turn (one span) — `rossjax extract --config.use_turns=True` reads it;
  tasks.jsonl    every valid bug {"id", "repo", "patch"};
  report.json    counts, the solver's trials, invalid and dropped reasons, `next`: the commands
                  that come next (extract, then probe-sweep), printed by the command.
"""

from __future__ import annotations

import json
import os
import shlex

import numpy as np

from rossjax.errors import ConfigError

FIELD = "configs/propel_swe.py:label"


def check_config(c) -> None:
    if c.solver.kind not in ("endpoint", "fn"):
        raise ConfigError(f"{FIELD}: config.solver.kind is {c.solver.kind!r}; the SWE solver is an "
                          "agent policy: 'endpoint' (an OpenAI-compatible server) or 'fn' "
                          "(module:function).")
    if not 1 <= c.min_valid <= c.k:
        raise ConfigError(f"{FIELD}: field 'min_valid' is {c.min_valid}; it must be from 1 to k "
                          f"({c.k}).")
    if not c.reference:
        raise ConfigError(f"{FIELD}: field 'reference' is empty: name the generator's frozen "
                          "reference model (an HF folder or preset:NAME), which the probe reads "
                          "in the printed extract step.")


def policy(section):
    """The solver's agent policy: an endpoint (PROPEL's sampling sent in the request) or a
    module:function (a per-task factory when its `per_task` is true)."""
    from rossjax.verify.base import load_fn

    if section.kind == "fn":
        return load_fn(section.fn, "config.solver.fn")
    from rossjax.agents.rollout import OpenAIPolicy
    from rossjax.train.propel.solvers import endpoint_filters

    ep = section.endpoint
    return OpenAIPolicy(ep.base_url or os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
                        ep.model, api_key=os.environ.get(ep.api_key_env or "OPENAI_API_KEY", "EMPTY"),
                        timeout_s=float(ep.timeout_s), temperature=float(ep.temperature),
                        max_tokens=int(ep.max_tokens), **endpoint_filters(ep))


def probe_input(p: dict, tok, template: str) -> dict:
    """What the probe reads of a bug (module doc), with its turn spans."""
    from rossjax.templates import render_prompt

    rec = p.get("record") or {}
    ids, spans = rec.get("token_ids"), (rec.get("agent") or {}).get("message_spans")
    msgs = rec.get("messages") or []
    if isinstance(ids, list) and ids and spans:
        turns = [[int(a), int(b)] for i, a, b in spans
                 if i < len(msgs) and msgs[i].get("role") == "assistant" and b > a]
        if turns:
            return {"id": p["id"], "input_ids": [int(x) for x in ids],
                    "text": tok.decode(ids), "turn_spans": turns}
    if msgs:
        text = render_prompt(msgs, template, tok)
    else:
        text = render_prompt([{"role": "user", "content": f"Repository {p['repo']}. The bug:\n"
                                                          f"{p['patch'] or ''}"}], template, tok)
    ids = tok.encode(text)
    return {"id": p["id"], "input_ids": ids, "text": text, "turn_spans": [[0, len(ids)]]}


def next_steps(c, out: str) -> list[str]:
    """The commands after this one, runnable as printed (paths are this run's)."""
    q = shlex.quote
    acts = os.path.join(out, "activations")
    layers = "(" + ",".join(str(x) for x in c.layers) + ("," if len(c.layers) == 1 else "") + ")"
    return [f"rossjax extract --config=configs/extract.py --config.model={q(c.reference)} "
            f"--config.input={q(os.path.join(out, 'inputs.jsonl'))} --config.output={q(acts)} "
            f"--config.layers={q(layers)} --config.use_turns=True "
            f"--config.turn_pooling={c.turn_pooling}",
            f"rossjax probe-sweep --config=configs/probe_sweep.py --config.domain=swe "
            f"--config.stores={q('(' + json.dumps(acts) + ',)')} "
            f"--config.labels={q(os.path.join(out, 'labels.jsonl'))} --config.band=open "
            f"--config.min_valid={c.min_valid} "
            f"--config.output={q(os.path.join(out, 'probe_sweep'))}"]


def label(c, out: str, pool: list[dict], tok, write_jsonl) -> dict:
    from rossjax.agents.swe_label import label_pool

    s = c.swe
    rows = label_pool(pool, policy(c.solver), k=c.k, min_valid=c.min_valid,
                      suite_timeout_s=s.suite_timeout_s, workers=s.workers, style=s.style,
                      max_turns=s.max_turns,
                      env={"step_timeout_s": s.step_timeout_s,
                           "episode_timeout_s": s.episode_timeout_s})
    by_id = {p["id"]: p for p in pool}
    kept = [r for r in rows if r["kept"]]
    labels = [{"id": r["id"], "trials": r["trials"], "valid": 1, "group": r["repo"],
               "family": r["repo"], "solve_rate": r["solve_rate"], "utility": r["utility"],
               **by_id[r["id"]]["extra"]} for r in kept]
    write_jsonl(os.path.join(out, "labels.jsonl"), labels)
    write_jsonl(os.path.join(out, "inputs.jsonl"),
                [probe_input({**by_id[r["id"]], "repo": r["repo"]}, tok, c.template)
                 for r in kept])
    write_jsonl(os.path.join(out, "tasks.jsonl"),
                [{"id": r["id"], "repo": r["repo"], "patch": by_id[r["id"]]["patch"]}
                 for r in rows if r["valid"]])
    trials = [t for r in rows for t in r["trials"]]
    report = {"tasks": len(rows), "valid": sum(r["valid"] for r in rows), "kept": len(kept),
              "k": c.k, "min_valid": c.min_valid, "domain": "swe",
              "solver": {"kind": c.solver.kind, "trials": len(trials),
                         "solved": sum(t is True for t in trials),
                         "undecided": sum(t is None for t in trials),
                         **({"fn": c.solver.fn} if c.solver.kind == "fn" else
                            {"model": c.solver.endpoint.model})},
              "validity_rate": float(np.mean([r["valid"] for r in rows])),
              "band_rate": float(np.mean([r["utility"] for r in kept])) if kept else 0.0,
              "repos": sorted({r["repo"] for r in rows}),
              "invalid": {r["id"]: r["invalid_reason"] for r in rows if not r["valid"]},
              "dropped": {r["id"]: r["dropped"] for r in rows if "dropped" in r},
              "next": next_steps(c, out)}
    with open(os.path.join(out, "report.json.tmp"), "w") as f:  # last: the run is complete
        json.dump(report, f, indent=1)
    os.replace(os.path.join(out, "report.json.tmp"), os.path.join(out, "report.json"))
    return {**report, "output": out}
