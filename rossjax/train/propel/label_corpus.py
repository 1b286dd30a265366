"""`rossjax label-corpus`: a pool of generated tasks -> K solver trials per task -> the label
file `rossjax probe-sweep` reads, plus the rows `rossjax extract` reads, with the same ids, so
the activation store and the labels join without hand assembly.

Domains (`config.domain`):
  induction  pool rows are task objects {"id", "program", "inputs", "message"} or generator
             records; each task is gated (`check_task`), split (5 shown pairs + the message, 5
             hidden inputs), tried K times and each trial scored on the hidden inputs only;
  swe        (configs/propel_swe.py:label) pool rows are bugs {"id", "repo", "patch"} or the
             generator's records; each bug is verified (verify.swe.verify_bug), tried by K = 3
             solver episodes and kept when >= min_valid trials were judged, labelled by its
             solve rate (utility 1 iff it is in (0, 1)): rossjax/train/propel/swe_label.py;
  math       pool rows are {"id", "problem"} or generator records (the generator wrote the
             problem only); each problem is gated (`check_problem`), answered twice by each of
             two oracles (`config.oracles.a` / `.b`), given the agreed answer as its reference
             when all four agree under math-verify (rossjax/verify/math_oracle.py; else invalid:
             oracle disagreement / oracle failure), then tried K times against it.
A record row ("messages": the last assistant message is the generator's answer, e.g. a GRPO
run's history.jsonl) keeps its `rewards.probe_score` and `source.step`. Solvers:
rossjax.train.propel.solvers (model, endpoint, fn, and the programmatic checks).

Outputs (in the output dir):
  labels.jsonl   {"id", "trials": [true|false|null x K], "valid": 0|1, ("invalid_reason"), "group"
                  (the pool row's, else task_group: a hash of the canonical task text), "family",
                  ["probe_score", "step"], (math: "reference", "oracle": status)}: an invalid
                  task has no trials (min_valid drops it from probe training; `valid` is the
                  gate W the sweep's RVP reward uses);
  inputs.jsonl   {"id", "input_ids", "text"}: the task rendered as the probe reads it in GRPO
                  (`reward.probe.render=task`: the canonical task text as a user turn, chat
                  template up to the assistant's answer) — `rossjax extract --config.input=` this;
  tasks.jsonl    the solver tasks (induction: shown pairs, prompt, hidden inputs; math: problem,
                  prompt, reference) for inspection;
  report.json    counts, validity rate, band rate, the solver's trials (`solver`) and the
                  oracles' (`oracles`: their trials and how many problems agreed, disagreed or
                  failed).
"""

from __future__ import annotations

import hashlib
import json
import os
import re

import numpy as np

from rossjax import runlock
from rossjax.errors import ConfigError, InputError
from rossjax.train.propel import solvers
from rossjax.train.propel.eval_generator import topic
from rossjax.train.rl import rollout
from rossjax.verify import induction_task, math_oracle, math_task

DOMAINS = ("induction", "math", "swe")


def _parse_record(text: str, domain: str):
    return (math_task.parse_generated_problem(text) if domain == "math"
            else induction_task.parse_generated_task(text))


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json's "\\ud800": no character, no tokenizer


def _bad_fields(obj: dict) -> str | None:
    """What is wrong with a pool row's shape ("'messages[2].content' must be ..."), or None."""
    msgs = obj.get("messages")
    if msgs is not None and not isinstance(msgs, list):
        return f"'messages' must be a list of messages, got {type(msgs).__name__}"
    for j, m in enumerate(msgs or []):
        if not isinstance(m, dict):
            return f"'messages[{j}]' must be an object, got {type(m).__name__}"
        if m.get("content") is not None and not isinstance(m["content"], str):
            return (f"'messages[{j}].content' must be a string or null, got "
                    f"{type(m['content']).__name__}")
        if isinstance(m.get("content"), str) and _LONE_SURROGATE.search(m["content"]):
            return f"'messages[{j}].content' holds a lone UTF-16 surrogate, which is not a character"
    for key in ("rewards", "source"):
        if obj.get(key) is not None and not isinstance(obj[key], dict):
            return f"{key!r} must be an object, got {type(obj[key]).__name__}"
    for key in ("problem", "program", "message"):
        if isinstance(obj.get(key), str) and _LONE_SURROGATE.search(obj[key]):
            return f"{key!r} holds a lone UTF-16 surrogate, which is not a character"
    return None


def read_pool(path: str, domain: str = "induction") -> list[dict]:
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
        bad = _bad_fields(obj)
        if bad:
            raise InputError(f"{path} row {n}: field {bad}.")
        if "messages" in obj:
            # the generator's answer: the last assistant message ("" when there is none)
            said = [m for m in obj["messages"] if m.get("role") == "assistant"]
            text = (said[-1].get("content") or "") if said else ""
            task = _parse_record(text, domain)
            r = obj.get("rewards") or {}
            if "probe_score" in r:
                extra["probe_score"] = r["probe_score"]
            if "step" in (obj.get("source") or {}):
                extra["step"] = obj["source"]["step"]
        elif domain == "math" and isinstance(obj.get("problem"), str):
            task = {"problem": obj["problem"].strip()}
            text = math_task.task_text(task)
        elif domain == "induction" and isinstance(obj.get("program"), str) and isinstance(
                obj.get("inputs"), list):
            task = {"program": obj["program"], "inputs": [str(x) for x in obj["inputs"]],
                    "message": obj.get("message") or ""}
            text = induction_task.task_text(task)
        else:
            want = "'problem'" if domain == "math" else "'program' + 'inputs'"
            raise InputError(f"{path} row {n}: needs 'messages' (a generator record) or {want} "
                             f"(a {domain} task).")
        if "group" in obj:
            extra["group"] = str(obj["group"])
        out.append({"id": obj["id"], "task": task, "text": text, "extra": extra})
    if not out:
        raise InputError(f"{path}: the pool has no rows.")
    return out


def probe_input(task: dict | None, text: str, tok, template: str,
                domain: str = "induction") -> tuple[list[int], str]:
    """Token ids and text of what the probe reads for a task (grpo_setup's render="task")."""
    canon = math_task.task_text if domain == "math" else induction_task.task_text
    content = canon(task) if task else (text or " ")
    rendered = rollout.render_prompt([{"role": "user", "content": content}], template, tok)
    return tok.encode(rendered), rendered


def task_group(task: dict | None, text: str, domain: str = "induction") -> str:
    """The default `group` of a label row: a hash of the task's canonical text with whitespace
    collapsed, so copies of one task (generators repeat themselves) share a group and the probe
    sweep's grouped splits keep them on one side of train / validation / test."""
    canon = math_task.task_text if domain == "math" else induction_task.task_text
    body = " ".join((canon(task) if task else (text or "")).split())
    return "task:" + hashlib.sha1(body.encode()).hexdigest()[:16]


OUTPUTS = ("labels.jsonl", "inputs.jsonl", "tasks.jsonl", "report.json")


def _write_jsonl(path, rows):
    with open(path + ".tmp", "w") as f:  # whole or not at all: a kill leaves no half file
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(path + ".tmp", path)


def check_config(c, out: str):
    if c.domain not in DOMAINS:
        raise ConfigError(f"configs/label_corpus.py: field 'domain' is {c.domain!r}, not one of "
                          f"{', '.join(DOMAINS)}.")
    if not c.pool or not out:
        raise ConfigError("configs/label_corpus.py: fields 'pool' and 'output' (or --workdir) must be set.")
    for key in ("k", "batch_tasks"):  # batch_tasks 0 sampled no task at all
        if c[key] < 1:
            raise ConfigError(f"configs/label_corpus.py: field {key!r} is {c[key]}; it must be at "
                              f"least 1.")
    if not 0 <= c.lo <= c.hi <= 1:
        raise ConfigError(f"configs/label_corpus.py: fields 'lo' {c.lo:g} and 'hi' {c.hi:g} must "
                          f"satisfy 0 <= lo <= hi <= 1.")
    solvers.check_section(c.solver, "config.solver")
    if c.domain == "swe":
        from rossjax.train.propel import swe_label

        swe_label.check_config(c)
    if c.domain == "math":
        solvers.check_oracles(c.oracles)
        if c.oracles.attempts < 1:
            raise ConfigError(f"config.oracles.attempts is {c.oracles.attempts}; it must be at "
                              f"least 1.")


def induction_tasks(c, pool):
    """(valid, solver tasks, invalid reasons, {}) of an induction pool."""
    protocol = induction_task.protocol_from(c.induction)
    checks = [induction_task.check_task(p["task"], protocol) for p in pool]
    valid = [bool(v.passed) for v in checks]
    stasks = [induction_task.solver_task(p["task"], protocol, p["id"]) if ok else None
              for p, ok in zip(pool, valid)]
    # why each invalid task is invalid: the validity check's own sentence
    why = [None if ok and t is not None else
           (v.evidence if not ok else "the task gives no hidden inputs to solve")
           for ok, t, v in zip(valid, stasks, checks)]
    return [ok and t is not None for ok, t in zip(valid, stasks)], stasks, why, {}


def math_tasks(c, pool, tok):
    """(valid, solver tasks, invalid reasons, oracle report) of a math pool: W, then the
    two-oracle reference policy on the problems that pass it."""
    checks = [math_task.check_problem(p["task"]) for p in pool]
    asked = [math_task.solver_task(p["task"]["problem"], p["id"]) if v.passed else None
             for p, v in zip(pool, checks)]
    oracles = [solvers.Solver(c.oracles[n], tok, c, c.seed, f"config.oracles.{n}") for n in "ab"]
    labels = solvers.oracle_labels(oracles, asked, c.oracles.attempts, c.seed, c.batch_tasks)
    stasks, why = [], []
    for p, v, lab in zip(pool, checks, labels):
        ok = lab is not None and lab.status == "agreed"
        stasks.append(math_task.solver_task(p["task"]["problem"], p["id"], lab.reference)
                      if ok else None)
        why.append(None if ok else (lab.reason if lab is not None else v.evidence))
    counts = {s: sum(lab is not None and lab.status == s for lab in labels)
              for s in math_oracle.STATUSES}
    report = {"a": oracles[0].report(), "b": oracles[1].report(),
              "attempts": c.oracles.attempts, **counts}
    return [t is not None for t in stasks], stasks, why, {"labels": labels, "report": report}


def run(c, workdir: str = "") -> dict:
    """`rossjax label-corpus` (configs/label_corpus.py): returns the report plus "output"."""
    out = c.output or (os.path.join(workdir, "label_corpus") if workdir else "")
    check_config(c, out)
    if c.domain == "swe":
        from rossjax.agents.swe_label import read_pool as read_swe_pool

        pool = read_swe_pool(c.pool)
    else:
        pool = read_pool(c.pool, c.domain)
    lock = runlock.acquire(out, "rossjax label-corpus")  # one run per output dir: none mix
    try:
        return _label(c, out, pool)
    finally:
        if lock is not None:
            lock.release()


def _label(c, out: str, pool: list[dict]) -> dict:
    for name in OUTPUTS:  # an earlier run's files must not pass for this run's if it stops
        if os.path.isfile(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    tok = solvers.load_tokenizer(c.tokenizer, out)
    if c.domain == "swe":
        from rossjax.train.propel import swe_label

        return swe_label.label(c, out, pool, tok, _write_jsonl)
    math = c.domain == "math"
    valid, stasks, why, oracle = math_tasks(c, pool, tok) if math else induction_tasks(c, pool)
    solver = solvers.Solver(c.solver, tok, c, c.seed)
    trials = solvers.trials(solver, stasks, c.k, c.seed, c.batch_tasks)
    labels, inputs = [], []
    for n, (p, ok, tr, reason) in enumerate(zip(pool, valid, trials, why)):
        if math:
            fam = math_task.topic(p["task"]["problem"]) if p["task"] else "unparsed"
            lab = oracle["labels"][n]
            extra = {"oracle": lab.status if lab else "not asked",
                     **({"reference": lab.reference} if lab and lab.reference else {})}
        else:
            fam = topic(p["task"]["program"]) if p["task"] else "unparsed"
            extra = {}
        labels.append({"id": p["id"], "trials": tr, "valid": int(ok),
                       **({"invalid_reason": reason} if not ok else {}),
                       "group": p["extra"].get("group") or task_group(p["task"], p["text"], c.domain),
                       "family": fam, **extra,
                       **{k: v for k, v in p["extra"].items() if k != "group"}})
        ids, text = probe_input(p["task"], p["text"], tok, c.template, c.domain)
        inputs.append({"id": p["id"], "input_ids": ids, "text": text})
    _write_jsonl(os.path.join(out, "labels.jsonl"), labels)
    _write_jsonl(os.path.join(out, "inputs.jsonl"), inputs)
    _write_jsonl(os.path.join(out, "tasks.jsonl"), [t for t in stasks if t is not None])
    k_lo, k_hi = c.lo * c.k - 1e-9, c.hi * c.k + 1e-9
    solved = [sum(bool(x) for x in tr) for tr in trials]
    report = {"tasks": len(pool), "valid": int(sum(valid)), "k": c.k, "domain": c.domain,
              "solver": solver.report(), "validity_rate": float(np.mean(valid)),
              "invalid": {lab["id"]: lab["invalid_reason"] for lab in labels if not lab["valid"]},
              "band_rate": float(np.mean([ok and k_lo <= s <= k_hi for ok, s in zip(valid, solved)])),
              **({"oracles": oracle["report"]} if math else {"protocol": dict(c.induction)})}
    with open(os.path.join(out, "report.json.tmp"), "w") as f:  # last: the run is complete
        json.dump(report, f, indent=1)
    os.replace(os.path.join(out, "report.json.tmp"), os.path.join(out, "report.json"))
    return {**report, "output": out}
