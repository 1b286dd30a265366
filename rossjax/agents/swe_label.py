"""PROPEL's SWE label corpus, agent side (`rossjax label-corpus --config=configs/propel_swe.py:label`):
a pool of generated bugs, each verified against its clean repository (verify.swe.verify_bug)
and, when valid, tried by K = 3 solver episodes (agents.swe.solver_trials_many); a bug is kept
for the probe when at least `min_valid` (2) of its trials could be judged, and labelled by its
solve rate: utility 1 iff 0 < solved / judged < 1 (the open band of K = 3).

    pool = read_pool("runs/propel_swe/history.jsonl")      # or {"id", "repo", "patch"} rows
    rows = label_pool(pool, policy, k=3, min_valid=2)       # one row per pool row, kept or not

Pool rows: {"id", "repo", "patch"} (a repository folder or a name shipped in data/swe/ and the
unified diff of the bug), or a generator record (a GRPO history.jsonl row of configs/
propel_swe.py or agents.swe.write_bug's row: "task": {"repo"}, "patch", and its "messages",
"token_ids" and "agent" spans, which the probe input is taken from). A record's
`rewards.probe_score` and `source.step` are kept.

The policy: an agent policy `policy(messages, tools) -> message` (an endpoint's OpenAIPolicy, a
module:function), or a per-task factory (an object whose `per_task` is true, called with
(base, patch, rid) for each bug's policy), which is how the `:label,runlocal` stand-in below
works. `REVERTING_STANDIN` is NOT a solver: it is handed the bug's patch and, on a seeded coin
per episode, writes the clean files back or answers at once, so the mechanics (trials, the
band, the drop rule) run without a model; its labels say nothing about any model.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading

from rossjax.agents.swe import solver_trials_many
from rossjax.errors import InputError

_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)


def read_pool(path: str) -> list[dict]:
    """[{id, repo, patch, record (the row when it is a generator record), extra}]."""
    if not os.path.isfile(path):
        raise InputError(f"configs/propel_swe.py:label: field 'pool' is {path!r}, which is not "
                         "a file.")
    out, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path} row {n}: not JSON ({e.msg}).") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
                raise InputError(f"{path} row {n}: field 'id' is missing or not a string.")
            if obj["id"] in seen:
                raise InputError(f"{path} row {n}: field 'id' {obj['id']!r} repeats an earlier "
                                 "row.")
            seen.add(obj["id"])
            repo = obj.get("repo", (obj.get("task") or {}).get("repo"))
            if not isinstance(repo, str) or not repo:
                raise InputError(f"{path} row {n}: needs 'repo' (or 'task.repo'): the "
                                 "repository the bug is in.")
            patch = obj.get("patch")
            if patch is not None and not isinstance(patch, str):
                raise InputError(f"{path} row {n}: field 'patch' must be a string or null.")
            extra = {}
            if "probe_score" in (obj.get("rewards") or {}):
                extra["probe_score"] = obj["rewards"]["probe_score"]
            if "step" in (obj.get("source") or {}):
                extra["step"] = obj["source"]["step"]
            out.append({"id": obj["id"], "repo": repo, "patch": patch, "extra": extra,
                        "record": obj if "messages" in obj else None})
    if not out:
        raise InputError(f"{path}: the pool has no rows.")
    return out


def label_pool(pool: list[dict], policy, *, k: int = 3, min_valid: int = 2,
               suite_timeout_s: float = 30.0, workers: int = 1, **episode) -> list[dict]:
    """One label row per pool row, in pool order: {"id", "repo", "valid", "trials",
    "solve_rate", "utility", "kept", ("invalid_reason" | "dropped")}."""
    from rossjax.agents.swe_env import clean_baseline
    from rossjax.verify.swe import verify_bug

    rows, jobs = [], []
    for p in pool:
        row = {"id": p["id"], "repo": p["repo"], "valid": 0, "trials": [], "solve_rate": None,
               "utility": None, "kept": False}
        try:
            base = clean_baseline(p["repo"], suite_timeout_s)
        except InputError as e:
            row["invalid_reason"] = f"repo_refused: {e}"
            rows.append(row)
            continue
        row["repo"] = base.name
        v = (verify_bug(base, p["patch"], timeout_s=suite_timeout_s) if p["patch"]
             else None)
        if v is None or not v.passed:
            row["invalid_reason"] = (v.evidence if v is not None
                                     else "no_patch: the row carries no patch")
        else:
            row["valid"] = 1
            jobs.append((len(rows), (base, p["patch"], p["id"])))
        rows.append(row)
    for i, (trials, _) in zip([i for i, _ in jobs], _trials([j for _, j in jobs], policy, k,
                                                            suite_timeout_s, workers, episode)):
        judged = [t for t in trials if t is not None]
        row = rows[i]
        row["trials"] = list(trials)
        if len(judged) < min_valid:
            row["dropped"] = (f"{len(judged)} of {k} trials could be judged, fewer than "
                              f"min_valid {min_valid}")
            continue
        solved = sum(bool(t) for t in judged)
        row["solve_rate"] = solved / len(judged)
        row["utility"] = int(0 < solved < len(judged))
        row["kept"] = True
    return rows


def _trials(jobs, policy, k, suite_timeout_s, workers, episode):
    if not jobs:
        return []
    if not getattr(policy, "per_task", False):
        return solver_trials_many(jobs, policy, k=k, suite_timeout_s=suite_timeout_s,
                                  workers=workers, **episode)
    out = []
    for base, patch, rid in jobs:  # a per-task policy: each bug's episodes with its own
        out += solver_trials_many([(base, patch, rid)], policy(base, patch, rid), k=k,
                                  suite_timeout_s=suite_timeout_s, workers=workers, **episode)
    return out


class _Reverter:
    """One bug's stand-in policy: episode j (in the order episodes start) writes the clean
    files back iff a seeded coin for (rid, j) comes up below p_fix; else it answers at once."""

    def __init__(self, base, patch: str, rid: str, p_fix: float, seed: int):
        names = sorted(set(_DIFF_FILE.findall(patch)))
        clean = {n: base.files[n] for n in names if n in base.files}
        self.fix = ("python - <<'RJ_STANDIN_EOF'\nimport json\n"
                    f"for p, t in json.loads({json.dumps(json.dumps(clean))}).items():\n"
                    "    open(p, 'w', encoding='utf-8').write(t)\nRJ_STANDIN_EOF")
        self.rid, self.p_fix, self.seed = rid, float(p_fix), int(seed)
        self.episodes, self.lock = 0, threading.Lock()

    def _coin(self, j: int) -> bool:
        h = hashlib.sha256(f"{self.seed}:{self.rid}:{j}".encode()).digest()
        return int.from_bytes(h[:8], "big") / 2**64 < self.p_fix

    def __call__(self, messages, tools):
        if messages[-1]["role"] == "user":  # an episode's first turn
            with self.lock:
                j, self.episodes = self.episodes, self.episodes + 1
            if self._coin(j):
                return {"content": "THOUGHT: restore the files the bug changed (stand-in).",
                        "tool_calls": [{"id": "c0", "type": "function", "function": {
                            "name": "bash", "arguments": json.dumps({"command": self.fix})}}]}
        return {"content": "done", "tool_calls": []}


class RevertingStandin:
    """A per-task stand-in factory (see the module doc): NOT a solver."""

    per_task = True

    def __init__(self, p_fix: float = 0.5, seed: int = 0):
        self.p_fix, self.seed = p_fix, seed

    def __call__(self, base, patch, rid):
        return _Reverter(base, patch, rid, self.p_fix, self.seed)


REVERTING_STANDIN = RevertingStandin()
