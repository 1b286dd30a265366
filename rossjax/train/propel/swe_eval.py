"""`rossjax swe-eval --config=configs/propel_swe.py:eval`: PROPEL's held-out SWE evaluation of a bug
generator. On each repository of the eval split (agents.swe.repo_splits: never seen by the probe
or the RL run) the generator writes `bugs_per_repo` bugs (the episodes of `rossjax swe-pool`,
rossjax/train/propel/swe_pool.py); each verified bug gets K = 3 solver episodes
(agents.swe_label.label_pool: kept with >= `min_valid` judged trials). Reported:

  realized_utility  share of ALL sampled bugs that are valid, judged and in band (0 < solved <
                    judged: the open band of K = 3); invalid or under-judged bugs count as not
                    useful; `band_rate` is the same share among the judged bugs only;
  validity_rate     share of sampled bugs that verify (verify.swe.verify_bug);
  top_file_rate     share of valid bugs that edit their repository's most-edited file (summed
                    over repositories: sum of each repository's top-file count / valid bugs);
  self_bleu3 / distinct3  Self-BLEU-3 and Distinct-3 (rossjax.train.propel.eval_generator's)
                    over the valid bugs' changed lines (agents.swe_pool.changed_text), per
                    repository, averaged weighted by valid bugs (Self-BLEU: repositories with
                    >= 2 valid bugs);
  top_topic_rate    share of the commonest bug kind (agents.swe_pool.bug_topic, a rule);
  collapse          {top_file_rate, top_topic_rate}: the two shares that rise when a generator
                    collapses onto one place or one kind of change.
Writes report.json (+ bugs.jsonl, one row per sampled bug) in config.output (default
WORKDIR/swe_eval) and returns the report with `summary` (the printed lines).
"""

from __future__ import annotations

import collections
import json
import os
import time

import ml_collections
import numpy as np

from rossjax.errors import ConfigError
from rossjax.train.propel.eval_generator import distinct_n, self_bleu, top_topic_rate

FIELD = "configs/propel_swe.py:eval"


def metrics(bugs: list[dict]) -> dict:
    """The report's figures (module doc) from one row per sampled bug: {"repo", "patch",
    "valid", "utility" (1 | 0 | None)}."""
    from rossjax.agents.swe_pool import bug_topic, changed_text, edited_files

    n = len(bugs)
    valid = [b for b in bugs if b["valid"]]
    judged = [b for b in valid if b.get("utility") is not None]
    by_repo = collections.defaultdict(list)
    for b in valid:
        by_repo[b["repo"]].append(b)
    top_files, sb, sb_w, d3, d3_w = {}, 0.0, 0, 0.0, 0
    for repo, rows in sorted(by_repo.items()):
        files = collections.Counter(f for b in rows for f in edited_files(b["patch"]))
        name, count = max(files.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0))
        top_files[repo] = {"file": name, "bugs": count, "of": len(rows)}
        texts = [changed_text(b["patch"]) for b in rows]
        if len(texts) >= 2:
            sb, sb_w = sb + self_bleu(texts) * len(texts), sb_w + len(texts)
        d3, d3_w = d3 + distinct_n(texts) * len(texts), d3_w + len(texts)
    topics = [bug_topic(b["patch"]) for b in valid]
    top_file_rate = (sum(t["bugs"] for t in top_files.values()) / len(valid)) if valid else 0.0
    topic_rate = top_topic_rate(topics)
    return {"sampled": n, "valid": len(valid), "judged": len(judged),
            "realized_utility": sum(b.get("utility") == 1 for b in bugs) / n if n else 0.0,
            "band_rate": float(np.mean([b["utility"] for b in judged])) if judged else 0.0,
            "validity_rate": len(valid) / n if n else 0.0,
            "top_file_rate": top_file_rate, "top_files": top_files,
            "self_bleu3": sb / sb_w if sb_w else 0.0, "distinct3": d3 / d3_w if d3_w else 0.0,
            "top_topic_rate": topic_rate, "topics": dict(collections.Counter(topics).most_common()),
            "collapse": {"top_file_rate": top_file_rate, "top_topic_rate": topic_rate}}


def pool_view(c) -> ml_collections.ConfigDict:
    """The swe-pool settings of this evaluation's generator episodes."""
    return ml_collections.ConfigDict(dict(
        generator=c.generator, agent=c.agent, episodes_per_repo=c.bugs_per_repo,
        tokenizer=c.tokenizer, template=c.template, seed=c.seed))


def check_config(c) -> None:
    from rossjax.train.propel import swe_pool

    swe_pool.check_config(pool_view(c))
    if c.solver.kind not in ("endpoint", "fn"):
        raise ConfigError(f"{FIELD}: config.solver.kind is {c.solver.kind!r}; the SWE solver is an "
                          "agent policy: 'endpoint' or 'fn' (module:function).")
    if c.solver.kind == "endpoint" and not c.solver.endpoint.model:
        raise ConfigError(f"{FIELD}: config.solver.endpoint.model is empty: name the solver.")
    if not 1 <= c.min_valid <= c.k:
        raise ConfigError(f"{FIELD}: config.min_valid is {c.min_valid}; it must be from 1 to k "
                          f"({c.k}).")


def summary(r: dict) -> list[str]:
    m = r["metrics"]
    g = r["generator"]
    lines = [f"rossjax swe-eval: {m['sampled']} bugs over {len(r['repos'])} held-out repositories "
             f"({', '.join(r['repos'])}; {g['kind']} generator {g.get('fn') or g.get('model')}), "
             f"K={r['k']} ({r['solver']['kind']}, {r['solver']['trials']} solver trials)",
             f"  realized utility {m['realized_utility']:.3f} (in band among {m['judged']} judged: "
             f"{m['band_rate']:.3f}); validity {m['validity_rate']:.3f}",
             f"  top-edited-file rate {m['top_file_rate']:.3f}; Self-BLEU-3 {m['self_bleu3']:.3f}; "
             f"Distinct-3 {m['distinct3']:.3f}; top-topic rate {m['top_topic_rate']:.3f}",
             f"  collapse: top file {m['collapse']['top_file_rate']:.3f}, top topic "
             f"{m['collapse']['top_topic_rate']:.3f} -> {r['output']}/report.json"]
    return lines + [f"  invalid {i}: {why[:160]}" for i, why in list(r["invalid"].items())[:5]]


def run(c, workdir: str) -> dict:
    from rossjax.agents.swe_label import label_pool
    from rossjax.agents.swe_pool import edited_files, is_kept, split_repos, verdict_of
    from rossjax.train.propel import swe_pool
    from rossjax.train.propel.swe_label import policy

    check_config(c)
    out = c.output or os.path.join(workdir or ".", "swe_eval")
    os.makedirs(out, exist_ok=True)
    if os.path.isfile(os.path.join(out, "report.json")):
        os.remove(os.path.join(out, "report.json"))
    t0 = time.perf_counter()
    repos = split_repos(c.split, tuple(c.repos))
    recs = swe_pool.episodes(pool_view(c), repos, out, c.seed)
    kept = [r for r in recs if is_kept(r)]
    s = c.swe
    labels = label_pool([{"id": r["id"], "repo": r["task"]["repo"], "patch": r["patch"]}
                         for r in kept], policy(c.solver), k=c.k, min_valid=c.min_valid,
                        suite_timeout_s=s.suite_timeout_s, workers=s.workers, style=s.style,
                        max_turns=s.max_turns, env={"step_timeout_s": s.step_timeout_s,
                                                    "episode_timeout_s": s.episode_timeout_s})
    lab = {r["id"]: r for r in labels}
    bugs = []
    for r in recs:
        v, row = verdict_of(r), lab.get(r["id"], {})
        name = row.get("repo") or os.path.basename(str(r["task"]["repo"]).rstrip("/"))
        bugs.append({"id": r["id"], "repo": name, "patch": r.get("patch"),
                     "valid": bool(row.get("valid")), "files": edited_files(r.get("patch")),
                     "trials": row.get("trials", []), "solve_rate": row.get("solve_rate"),
                     "utility": row.get("utility") if row.get("kept") else None,
                     **({} if row.get("valid") else
                        {"invalid_reason": row.get("invalid_reason") or v["evidence"]}),
                     **({"dropped": row["dropped"]} if "dropped" in row else {})})
    swe_pool.write_jsonl(os.path.join(out, "bugs.jsonl"), bugs)
    trials = [t for b in bugs for t in b["trials"]]
    g = c.generator
    report = {"domain": "swe", "repos": sorted({b["repo"] for b in bugs}) or list(repos),
              "bugs_per_repo": c.bugs_per_repo, "k": c.k, "min_valid": c.min_valid,
              "generator": {"kind": g.kind, **({"fn": g.fn} if g.kind == "fn" else
                                               {"model": g.endpoint.model} if g.kind == "endpoint"
                                               else {"model": swe_pool.reference(g)})},
              "solver": {"kind": c.solver.kind, "trials": len(trials),
                         "solved": sum(t is True for t in trials),
                         "undecided": sum(t is None for t in trials),
                         **({"fn": c.solver.fn} if c.solver.kind == "fn" else
                            {"model": c.solver.endpoint.model})},
              "metrics": metrics(bugs),
              "per_repo": {name: metrics([b for b in bugs if b["repo"] == name])
                           for name in sorted({b["repo"] for b in bugs})},
              "invalid": {b["id"]: b["invalid_reason"] for b in bugs if "invalid_reason" in b},
              "dropped": {b["id"]: b["dropped"] for b in bugs if "dropped" in b},
              "seconds": round(time.perf_counter() - t0, 1), "output": out}
    for v in report["per_repo"].values():
        v.pop("collapse"), v.pop("top_files")
    report["summary"] = summary(report)
    with open(os.path.join(out, "report.json.tmp"), "w") as f:
        json.dump(report, f, indent=1)
    os.replace(os.path.join(out, "report.json.tmp"), os.path.join(out, "report.json"))
    return report
