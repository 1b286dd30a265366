"""`rossjax label-corpus`: a pool of generated induction tasks -> K solver trials per task under
the AZR protocol -> the label file `rossjax probe-sweep` reads, plus the rows `rossjax extract`
reads, with the same ids, so the activation store and the labels join without hand assembly.

Pool rows (JSONL/.gz): a task object {"id", "program", "inputs", "message"} or a record with
"messages" whose last assistant message is the generator's answer (e.g. a GRPO run's
history.jsonl; its `rewards.probe_score` and `source.step` are carried over). Each task is gated
(`check_task`), split (5 shown pairs + the message, 5 hidden inputs), tried K times by the solver
(rossjax.train.solvers) and each trial scored on the hidden inputs only.

Outputs (in the output dir):
  labels.jsonl   {"id", "trials": [true|false|null x K], "valid": 0|1, ("invalid_reason"), "group", "family",
                  ["probe_score", "step"]}: an invalid task has no trials (min_valid drops it
                  from probe training; `valid` is the gate W the sweep's RVP reward uses);
  inputs.jsonl   {"id", "input_ids", "text"}: the task rendered as the probe reads it in GRPO
                  (`reward.probe.render=task`: the canonical task text as a user turn, chat
                  template up to the assistant's answer) — `rossjax extract --config.input=` this;
  tasks.jsonl    the solver tasks (shown pairs, prompt, hidden inputs) for inspection;
  report.json    counts, validity rate, band rate.
"""

from __future__ import annotations

import json
import os

import numpy as np

from rossjax.errors import ConfigError, InputError
from rossjax.train import rollout, solvers
from rossjax.train.eval_generator import topic
from rossjax.verify import induction_task


def read_pool(path: str) -> list[dict]:
    """[{id, task (parsed or None), text, extra}] from a pool file (see module doc)."""
    from rossjax.curate.schema import iter_json_lines

    if not os.path.isfile(path):
        raise ConfigError(f"configs/label_corpus.py: field 'pool' is {path!r}, which is not a file.")
    out, seen = [], set()
    for n, obj, reason, *_ in iter_json_lines(path):
        if reason:
            raise InputError(f"{reason}.")
        if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
            raise InputError(f"{path} row {n}: field 'id' is missing or not a string.")
        if obj["id"] in seen:
            raise InputError(f"{path} row {n}: field 'id' {obj['id']!r} repeats an earlier row.")
        seen.add(obj["id"])
        extra = {}
        if isinstance(obj.get("messages"), list):
            text = obj["messages"][-1].get("content") or "" if obj["messages"] else ""
            task = induction_task.parse_generated_task(text)
            r = obj.get("rewards") or {}
            if "probe_score" in r:
                extra["probe_score"] = r["probe_score"]
            if "step" in (obj.get("source") or {}):
                extra["step"] = obj["source"]["step"]
        elif isinstance(obj.get("program"), str) and isinstance(obj.get("inputs"), list):
            task = {"program": obj["program"], "inputs": [str(x) for x in obj["inputs"]],
                    "message": obj.get("message") or ""}
            text = induction_task.task_text(task)
        else:
            raise InputError(f"{path} row {n}: needs 'messages' (a generator record) or "
                             "'program' + 'inputs' (a task).")
        if "group" in obj:
            extra["group"] = str(obj["group"])
        out.append({"id": obj["id"], "task": task, "text": text, "extra": extra})
    if not out:
        raise InputError(f"{path}: the pool has no rows.")
    return out


def probe_input(task: dict | None, text: str, tok, template: str) -> tuple[list[int], str]:
    """Token ids and text of what the probe reads for a task (grpo_setup's render="task")."""
    content = induction_task.task_text(task) if task else (text or " ")
    rendered = rollout.render_prompt([{"role": "user", "content": content}], template, tok)
    return tok.encode(rendered), rendered


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def run(c, workdir: str = "") -> dict:
    """`rossjax label-corpus` (configs/label_corpus.py): returns the report plus "output"."""
    out = c.output or (os.path.join(workdir, "label_corpus") if workdir else "")
    if not c.pool or not out:
        raise ConfigError("configs/label_corpus.py: fields 'pool' and 'output' (or --workdir) must be set.")
    if c.k < 1:
        raise ConfigError(f"configs/label_corpus.py: field 'k' is {c.k}; it must be at least 1.")
    if c.solver.kind not in solvers.KINDS:
        raise ConfigError(f"configs/label_corpus.py: field 'solver.kind' is {c.solver.kind!r}, not "
                          f"one of {', '.join(solvers.KINDS)}.")
    protocol = induction_task.protocol_from(c.induction)
    pool = read_pool(c.pool)
    os.makedirs(out, exist_ok=True)
    tok = solvers.load_tokenizer(c.tokenizer, out)
    checks = [induction_task.check_task(p["task"], protocol) for p in pool]
    valid = [bool(v.passed) for v in checks]
    stasks = [induction_task.solver_task(p["task"], protocol, p["id"]) if ok else None
              for p, ok in zip(pool, valid)]
    # why each invalid task is invalid: the validity check's own sentence
    why = [None if ok and t is not None else
           (v.evidence if not ok else "the task gives no hidden inputs to solve")
           for ok, t, v in zip(valid, stasks, checks)]
    valid = [ok and t is not None for ok, t in zip(valid, stasks)]
    solver = solvers.Solver(c.solver, tok, c, c.seed)
    trials = solvers.trials(solver, stasks, c.k, c.seed, c.batch_tasks)
    labels, inputs = [], []
    for p, ok, tr, reason in zip(pool, valid, trials, why):
        fam = topic(p["task"]["program"]) if p["task"] else "unparsed"
        labels.append({"id": p["id"], "trials": tr, "valid": int(ok),
                       **({"invalid_reason": reason} if not ok else {}),
                       "group": p["extra"].get("group", p["id"]), "family": fam,
                       **{k: v for k, v in p["extra"].items() if k != "group"}})
        ids, text = probe_input(p["task"], p["text"], tok, c.template)
        inputs.append({"id": p["id"], "input_ids": ids, "text": text})
    _write_jsonl(os.path.join(out, "labels.jsonl"), labels)
    _write_jsonl(os.path.join(out, "inputs.jsonl"), inputs)
    _write_jsonl(os.path.join(out, "tasks.jsonl"), [t for t in stasks if t is not None])
    k_lo, k_hi = c.lo * c.k - 1e-9, c.hi * c.k + 1e-9
    solved = [sum(bool(x) for x in tr) for tr in trials]
    report = {"tasks": len(pool), "valid": int(sum(valid)), "k": c.k, "solver": c.solver.kind,
              "validity_rate": float(np.mean(valid)),
              "invalid": {lab["id"]: lab["invalid_reason"] for lab in labels if not lab["valid"]},
              "band_rate": float(np.mean([ok and k_lo <= s <= k_hi for ok, s in zip(valid, solved)])),
              "protocol": dict(c.induction)}
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    return {**report, "output": out}
