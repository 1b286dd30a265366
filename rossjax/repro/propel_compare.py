"""`rossjax repro propel`'s comparisons with the paper's baselines and variants, in miniature.

Arms beside base / probe / heuristic (rossjax/repro/propel.py), each GRPO run at the probe run's
steps, batch, learning rate and seed:

  sil          solver in the loop (PROPEL's Table 3 baseline, configs/propel_sil.py): each valid
               candidate is posed K=8 times to the same programmatic solver during RL
               (propel_tasks.solver_fn: its programs judged in the sandbox on the hidden inputs)
               and paid the realized U_S. Cost: the GRPO stage's wall-clock (compile and export
               included, like every arm's) and the solver trials its metrics count; the probe's
               one-off cost is the pool it was trained on (n_pool x K trials, paid before RL).
  wco          worst case over 3 probes (`reward.probe.ensemble`): the selected probe and two more
               swept on other split seeds of the same label corpus (other training rows).
  adversarial  the selected probe and the adversarial auxiliary probe (`reward.probe.auxiliary`):
               seed 0's probe run's history labelled by the solver -> `rossjax aux-set` (positives:
               the corpus' band tasks; negatives: the run's false positives and its collapsed
               family) -> `rossjax extract` + `rossjax probe-sweep`; one aux probe for every seed.
  transfer_base / transfer
               cold transfer: another generator (the same shape and corpus, trained from another
               init seed), before and after GRPO with the base generator's probe read from the
               base generator (`reward.probe.reference.path`): probe and reference fixed, the
               policy swapped.

`--quick` runs `sil` only (the others: full runs; each adds a GRPO run per seed, the transfer a
second generator, ~3.5 min here); tests/test_repro_propel_compare.py checks their wiring.
"""

from __future__ import annotations

import json
import os

QUICK = ("sil",)
FULL = ("sil", "wco", "adversarial", "transfer_base", "transfer")
NAMES = {"sil": "GRPO, solver in the loop", "wco": "GRPO, WCO of 3 probes",
         "adversarial": "GRPO, probe + adversarial aux", "transfer_base": "other generator",
         "transfer": "other generator, GRPO, probe (cold)"}
UNTRAINED = ("transfer_base",)   # evaluated as they are (like "base")
WCO_SPLIT_SEEDS = (1, 2)         # the ensemble's extra probes


def arms(quick: bool) -> tuple:
    return QUICK if quick else FULL


def sil_reward() -> list[str]:
    return ["--config.reward.solver.kind=fn",
            "--config.reward.solver.fn=rossjax.repro.propel_tasks:solver_fn"]


def plan(arm: str, ctx: dict) -> dict:
    """What one arm's GRPO run is: its config, policy and reward flags (ctx: gen_hf, probe,
    and, for the arms that need them, wco / aux / gen2 from `prepare`)."""
    if arm == "sil":
        return {"config": "propel_sil.py:runlocal", "policy": ctx["gen_hf"], "reward": sil_reward()}
    if arm not in ("wco", "adversarial", "transfer"):
        raise ValueError(f"arm {arm!r} has no GRPO run")
    probe = f"--config.reward.probe.path={ctx['probe']}"
    if arm == "wco":
        return {"config": "propel_azr.py:runlocal", "policy": ctx["gen_hf"],
                "reward": [probe, f"--config.reward.probe.ensemble={','.join(ctx['wco'])}"]}
    if arm == "adversarial":
        return {"config": "propel_azr.py:runlocal", "policy": ctx["gen_hf"],
                "reward": [probe, f"--config.reward.probe.auxiliary={ctx['aux']}"]}
    return {"config": "propel_azr.py:runlocal", "policy": ctx["gen2"],  # transfer
            "reward": [probe, f"--config.reward.probe.reference.path={ctx['gen_hf']}"]}


def prepare(arm: str, st, ctx: dict, workdir: str, size: dict) -> None:
    """The shared pieces an arm needs, each a cached stage: the ensemble's probes, the auxiliary
    probe (after seed 0's probe run) or the second generator."""
    if arm == "wco" and "wco" not in ctx:
        ctx["wco"] = [st.run(f"wco_probe_{k}", lambda k=k: sweep(
            workdir, os.path.join(workdir, "activations"), os.path.join(workdir, "labels",
                                                                        "labels.jsonl"),
            os.path.join(workdir, f"sweep_split{k}"), split_seed=k)) for k in WCO_SPLIT_SEEDS]
    if arm == "adversarial" and "aux" not in ctx:
        ctx["aux"] = st.run("aux_probe", lambda: aux_probe(workdir, ctx))
    if arm in ("transfer_base", "transfer") and "gen2" not in ctx:
        ctx["gen2"] = st.run("train_generator2", lambda: ctx["train_generator"](
            workdir, size, ctx["rows"], seed=1, name="generator2"))


def extract(model: str, inputs: str, store: str) -> str:
    """`rossjax extract` of repro propel's probes (layers 1-2, mean pooling); returns the store."""
    from rossjax.repro import stages
    from rossjax.resources import config_path as repo_config

    stages.cli(["extract", f"--config={repo_config('extract.py')}", f"--config.model={model}",
                f"--config.input={inputs}", f"--config.output={store}", "--config.layers=(1, 2)",
                "--config.pooling=mean"])
    return store


def sweep(workdir: str, store: str, labels: str, out: str, split_seed: int = 0) -> str:
    """`rossjax probe-sweep` of repro propel's probes (linear heads, one seed): a store, its
    labels, an output folder and the split seed; returns the selected probe's path."""
    from rossjax.repro import stages
    from rossjax.resources import config_path as repo_config

    stages.cli(["probe-sweep", f"--config={repo_config('probe_sweep.py')}",
                f"--config.stores=('{store}',)", f"--config.labels={labels}",
                f"--config.output={out}", "--config.heads=('linear',)", "--config.seeds=(0,)",
                "--config.folds=3", f"--config.split_seed={split_seed}"])
    return os.path.join(out, "selected_probe")


def label_history(history: str, folder: str, tok, seed: int = 7) -> dict:
    """A GRPO run's history.jsonl labelled as `rossjax label-corpus` labels a run (the solver's
    K trials, valid, family, and the probe score and step aux-set reads) -> run labels.jsonl and
    inputs.jsonl under `folder`."""
    from rossjax.repro import stages
    from rossjax.repro.propel_tasks import score_tasks
    from rossjax.train.propel.label_corpus import probe_input

    rows = [json.loads(x) for x in open(history, encoding="utf-8") if x.strip()]
    texts = [r["messages"][-1].get("content") or "" for r in rows]
    scored = score_tasks(texts, seed=seed, ids={i: f"run-{i}" for i in range(len(rows))})
    labels, inputs = [], []
    for i, (r, text, s) in enumerate(zip(rows, texts, scored)):
        score = (r.get("rewards") or {}).get("probe_score")
        labels.append({"id": f"run-{i}", "trials": [bool(x) for x in s["trials"]],
                       "valid": int(s["valid"]), "family": s["family"],
                       "probe_score": float(score) if score is not None else 0.0,
                       "step": int((r.get("source") or {}).get("step", 0))})
        ids, rendered = probe_input(s["task"] if s["valid"] else None, text, tok, "chatml")
        inputs.append({"id": f"run-{i}", "input_ids": ids, "text": rendered})
    stages.write_jsonl(os.path.join(folder, "labels.jsonl"), labels)
    stages.write_jsonl(os.path.join(folder, "inputs.jsonl"), inputs)
    return {"rows": len(rows), "valid": sum(x["valid"] for x in labels)}


def aux_probe(workdir: str, ctx: dict) -> str:
    """Seed 0's probe run labelled -> `rossjax aux-set` -> extract -> probe-sweep."""
    from rossjax.repro import stages
    from rossjax.resources import config_path as repo_config

    run_dir, aux = os.path.join(workdir, "aux", "run_labels"), os.path.join(workdir, "aux", "set")
    label_history(os.path.join(workdir, "runs", "probe-s0", "history.jsonl"), run_dir, ctx["tok"])
    labels = os.path.join(workdir, "labels")
    stages.cli(["aux-set", f"--config={repo_config('aux_set.py')}",
                f"--config.original_labels={os.path.join(labels, 'labels.jsonl')}",
                f"--config.original_inputs={os.path.join(labels, 'inputs.jsonl')}",
                f"--config.run_labels={os.path.join(run_dir, 'labels.jsonl')}",
                f"--config.run_inputs={os.path.join(run_dir, 'inputs.jsonl')}",
                f"--config.output={aux}"])
    store = extract(ctx["gen_hf"], os.path.join(aux, "aux_inputs.jsonl"),
                    os.path.join(workdir, "aux", "activations"))
    return sweep(workdir, store, os.path.join(aux, "aux_labels.jsonl"),
                 os.path.join(workdir, "aux", "sweep"))


def cost(st, stage: str, workdir: str) -> dict:
    """A GRPO stage's wall-clock (its stage record) and the solver trials its metrics count."""
    with open(st.path(stage)) as f:
        seconds = float(json.load(f)["seconds"])
    trials = 0
    path = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            trials = sum(int(json.loads(x).get("solver_trials", 0) or 0) for x in f if x.strip())
    return {"grpo_seconds": seconds, "solver_trials": trials}


def top_share(families: dict) -> float:
    """The collapse metric: the most common family's share of the valid tasks (0 if none)."""
    n = sum(families.values())
    return max(families.values()) / n if n else 0.0


def _ev(s: dict, arm: str, key: str, names: dict, digits: int = 3) -> str:
    from rossjax.repro.report import ms

    return f"{names[arm]} {ms(s[arm][key], digits)}"


def claims(res: dict, names: dict) -> list[dict]:
    """The comparison claims for the arms present in res["summary"] (none for a summary without
    them, e.g. README's table of an older run)."""
    s, out = res["summary"], []
    seeds = f"; {s['probe']['utility']['n']} seed(s), mean ± std over seeds"
    if "sil" in s:
        u = lambda a: s[a]["utility"]["mean"]  # noqa: E731
        slack = (s["probe"]["utility"]["std"] + s["sil"]["utility"]["std"]) / 2
        out.append({"claim": "at the same GRPO steps the probe reward's utility is similar to "
                             "solver-in-the-loop's (not lower beyond the arms' mean std)",
                    "holds": bool(u("probe") >= u("sil") - slack),
                    "evidence": "; ".join(_ev(s, a, "utility", names) for a in ("probe", "sil"))
                    + seeds})
        if "grpo_seconds" in s["sil"] and "grpo_seconds" in s["probe"]:
            t = {a: s[a]["grpo_seconds"]["mean"] for a in ("probe", "sil")}
            n = {a: s[a]["solver_trials"]["mean"] for a in ("probe", "sil")}
            out.append({"claim": "the probe reward's GRPO run is cheaper than solver-in-the-loop's: "
                                 "no solver trials during RL and less wall-clock",
                        "holds": bool(n["probe"] == 0 < n["sil"] and t["probe"] < t["sil"]),
                        "evidence": "; ".join(
                            f"{_ev(s, a, 'grpo_seconds', names, 0)} s, {n[a]:.0f} solver trials"
                            for a in ("probe", "sil"))
                        + f"; the probe's labels cost {res.get('pool_trials', 0)} trials once"
                        + seeds})
    for arm, what in (("wco", "worst case over 3 probes (WCO)"),
                      ("adversarial", "the adversarial auxiliary probe")):
        if arm in s:
            out.append({"claim": f"{what} collapses less than the single probe (lower top-family "
                                 f"share)",
                        "holds": bool(s[arm]["top_share"]["mean"] < s["probe"]["top_share"]["mean"]),
                        "evidence": "; ".join(f"{_ev(s, a, 'top_share', names)} (utility "
                                              f"{s[a]['utility']['mean']:.3f})"
                                              for a in ("probe", arm)) + seeds})
    if "transfer" in s and "transfer_base" in s:
        out.append({"claim": "cold transfer: the base generator's probe, read from the base "
                             "generator, raises another generator's utility",
                    "holds": bool(s["transfer"]["utility"]["mean"]
                                  > s["transfer_base"]["utility"]["mean"]),
                    "evidence": "; ".join(_ev(s, a, "utility", names)
                                          for a in ("transfer_base", "transfer")) + seeds})
    return out


def summary(runs: list[dict]) -> dict:
    """Per-arm extras: the collapse metric and, for GRPO arms, the cost (means over seeds)."""
    from rossjax.repro.report import summary as _ms

    out = {"top_share": _ms([top_share(r["families"]) for r in runs])}
    if runs and "grpo_seconds" in runs[0]:
        out.update({k: _ms([r[k] for r in runs]) for k in ("grpo_seconds", "solver_trials")})
    return out


def pool_trials(pool: dict, k: int) -> int:
    """The probe's one-off label cost: K trials per valid pooled task."""
    return int(round(pool["n"] * pool["validity"])) * k if "n" in pool else 0


def notes(res: dict) -> list[str]:
    arms = [a for a in FULL if a in res["summary"]]
    if not arms:
        return []
    left = [a for a in FULL if a not in arms]
    return [f"Comparison arms (rossjax/repro/propel_compare.py): {', '.join(arms)}"
            + (f"; {', '.join(left)} run in full runs only" if left else "")
            + ". GRPO s: the GRPO stage's wall-clock (compile and export included) on this "
            "machine, under whatever else ran on it; seed 0's probe run is a workdir's first GRPO "
            "stage and compiles what later stages find in DIR/jax-cache, which counts against "
            "the probe; solver trials (RL): those the run's metrics count (solver-in-the-loop's K=8 "
            f"per valid candidate); the probe's labels cost {res.get('pool_trials', 0)} solver "
            "trials once, before any RL run."]
