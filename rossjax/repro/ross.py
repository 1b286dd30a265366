"""`rossjax repro ross`: masked relearning does not imitate the errors its rollouts contain.

Pipeline (every stage a real rossjax command): the noisy policy of tasks.py writes historical
rollouts (verifier verdicts stored; the programmatic reviewer annotates the verifier-positive
ones) -> `rossjax curate` three times, once per recipe's rows and mask -> `rossjax train`
from the shared warm-up (warmup.py) per recipe and seed, same steps, batch and optimizer ->
`rossjax export` -> greedy and sampled completions of held-out problems graded by tasks.grade.

Metrics per run: held-out accuracy (greedy and sampled; exact answer, and the fraction of sums
right), error-imitation rate (a completion writes the policy's planted error, a forgotten
carry), recovery-line rate, wrong-step rate, completion length in tokens; per recipe the curated
TER (excluded / eligible assistant tokens).
"""

from __future__ import annotations

import os

import numpy as np

from rossjax.repro import stages, tasks, warmup

RECIPES = ("ross", "ross_no_mask", "positive_sft")
CURATE_FLAGS = {"ross": dict(rows="accepted", mask_mode="annotated"),
                "ross_no_mask": dict(rows="accepted", mask_mode="eligible"),
                "positive_sft": dict(rows="verifier_positive", mask_mode="eligible")}

# Relearning runs start from the shared warm-up (warmup.py) with the same steps and batch.
SIZES = {"full": dict(n_train=3000, n_test=256, steps=250, samples=4),
         "quick": dict(n_train=1500, n_test=128, steps=100, samples=2)}
POLICY = dict(forget=0.7, recover=0.8, lucky=0.5)
MAX_NEW = 64


def make_rollouts(path: str, problems, seed: int, policy: dict, run: str) -> dict:
    rng = np.random.default_rng(seed)
    rows, stats = [], dict(rows=0, verifier_passed=0, clean=0, planted_recovered=0,
                           planted_unrecovered_passed=0, planted_lines=0)
    for i, p in enumerate(problems):
        text, planted, recovered, ok = tasks.noisy_trace(rng, p, **policy)
        rows.append(tasks.rollout_record(i, p, text, planted, recovered, step=i // 64, run=run))
        stats["rows"] += 1
        stats["verifier_passed"] += ok
        stats["planted_lines"] += len(planted)
        if ok:
            key = ("clean" if not planted else "planted_recovered" if all(recovered)
                   else "planted_unrecovered_passed")
            stats[key] += 1
    stages.write_jsonl(path, rows)
    return stats


def evaluate(hf_dir: str, tok, test, samples: int, seed: int) -> dict:
    model = stages.load_model(hf_dir)
    prompts = [tasks.prompt_text(d) for d in test]
    out = {}
    for mode, temp, k in (("greedy", 0.0, 1), ("sampled", 1.0, samples)):
        groups = stages.complete(model, tok, prompts, max_new=MAX_NEW, temperature=temp,
                                 num_samples=k, seed=seed)
        grades = [(tasks.grade(d, c["text"]), c["tokens"]) for d, g in zip(test, groups) for c in g]
        out[mode] = {
            "accuracy": float(np.mean([g["correct"] for g, _ in grades])),
            "sums_correct": float(np.mean([g["sums_correct"] for g, _ in grades])),
            "imitation": float(np.mean([g["planted"] for g, _ in grades])),
            "recovery": float(np.mean([g["recovery"] for g, _ in grades])),
            "wrong_step": float(np.mean([g["wrong_step"] for g, _ in grades])),
            "length": float(np.mean([n for _, n in grades])),
        }
        if mode == "greedy":
            out["examples"] = [c["text"] for g in groups[:3] for c in g]
    return out


def run(workdir: str, seeds: int, quick: bool, log=print) -> dict:
    from tqdm import tqdm

    size = SIZES["quick" if quick else "full"]
    st = stages.Stages(workdir, log)
    tok_path, tok = stages.ascii_tokenizer(os.path.join(os.path.dirname(workdir), "tokenizer"))
    warm = warmup.build(os.path.dirname(workdir), quick, tok_path, log)
    reserve = warmup.problems()[1]
    test_p, train_p = reserve[:size["n_test"]], reserve[size["n_test"]:][:size["n_train"]]
    base_eval = st.run("warmup_eval", lambda: evaluate(warm["hf"], tok, test_p, size["samples"],
                                                       seed=0))

    # The noisy policy's history, curated once per recipe.
    rollouts = os.path.join(workdir, "rollouts", "noisy_policy.jsonl")
    pool = st.run("rollouts", lambda: make_rollouts(rollouts, train_p, 0, POLICY,
                                                    "repro-noisy-policy"))
    curated = {r: st.run(f"curate_{r}", lambda r=r: stages.curated_summary(stages.curate(
        rollouts, os.path.join(workdir, "curated", r), tok_path, **CURATE_FLAGS[r])))
        for r in RECIPES}

    runs = {r: [] for r in RECIPES}
    todo = [(s, r) for s in range(seeds) for r in RECIPES]
    for s, r in tqdm(todo, desc="repro ross", unit="run", disable=None):
        wd = os.path.join(workdir, "runs", f"{r}-s{s}")
        m = st.run(f"train_{r}_s{s}", lambda: stages.train(
            os.path.join(workdir, "curated", r), wd, r, seed=s, steps=size["steps"],
            init=warm["hf"], tokens=curated[r]["tokens"], **warmup.train_kw()))
        ev = st.run(f"eval_{r}_s{s}", lambda: evaluate(os.path.join(wd, "hf"), tok, test_p,
                                                       size["samples"], seed=s))
        runs[r].append({"seed": s, "train_loss": m.get("loss"), **ev})
    return {"experiment": "ross", "quick": quick, "seeds": seeds, "size": size,
            "warmup": {**warm, "eval": base_eval}, "shape": warmup.SHAPE, "policy": POLICY,
            "pool": pool, "curated": curated, "runs": runs, "summary": summarize(runs, curated)}


def _ms(v) -> dict:
    v = np.asarray(v, np.float64)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
            "n": int(len(v))}


def summarize(runs: dict, curated: dict) -> dict:
    out = {}
    for r, rs in runs.items():
        out[r] = {f"{mode}_{k}": _ms([x[mode][k] for x in rs])
                  for mode in ("greedy", "sampled")
                  for k in ("accuracy", "sums_correct", "imitation", "recovery", "wrong_step",
                            "length")}
        out[r]["ter"] = curated[r]["ter"]
        out[r]["rows"] = curated[r]["kept"]
    return out


NAMES = {"ross": "ROSS", "ross_no_mask": "ROSS w/o mask", "positive_sft": "positive SFT"}


def table(res: dict):
    from rossjax.repro.report import ms

    headers = ["recipe", "rows", "TER", "accuracy", "sums right", "imitation", "imitation T=1",
               "recovery T=1", "length"]
    w = res["warmup"]["eval"]
    rows = [["warm-up (start)", res["warmup"]["rows"], "-", f"{w['greedy']['accuracy']:.3f}",
             f"{w['greedy']['sums_correct']:.3f}", f"{w['greedy']['imitation']:.3f}",
             f"{w['sampled']['imitation']:.3f}", f"{w['sampled']['recovery']:.3f}",
             f"{w['greedy']['length']:.1f}"]]
    for r, s in res["summary"].items():
        rows.append([NAMES[r], s["rows"], f"{s['ter']:.3f}", ms(s["greedy_accuracy"]),
                     ms(s["greedy_sums_correct"]), ms(s["greedy_imitation"]),
                     ms(s["sampled_imitation"]), ms(s["sampled_recovery"]),
                     ms(s["greedy_length"], 1)])
    return headers, rows


def claims(res: dict) -> list[dict]:
    s = res["summary"]
    others = [r for r in RECIPES if r != "ross"]
    imi = {r: s[r]["sampled_imitation"] for r in RECIPES}
    acc = {r: s[r]["greedy_sums_correct"] for r in RECIPES}
    fmt = lambda d: ", ".join(f"{NAMES[r]} {d[r]['mean']:.3f}" for r in RECIPES)  # noqa: E731
    # "At least as accurate": not below another recipe by more than the two runs' mean std.
    not_worse = all(acc["ross"]["mean"] >= acc[o]["mean"] - (acc["ross"]["std"] + acc[o]["std"]) / 2
                    for o in others)
    return [
        {"claim": "ROSS imitates the planted error (a forgotten carry) least, sampling at T=1",
         "holds": all(imi["ross"]["mean"] < imi[o]["mean"] for o in others),
         "evidence": fmt(imi)},
        {"claim": "ROSS is at least as accurate (greedy, fraction of sums right; not below "
                  "another recipe by more than their mean std)",
         "holds": not_worse, "evidence": fmt(acc)},
    ]


def plot(res: dict, folder: str) -> list[str]:
    from rossjax.repro import report

    s = res["summary"]
    names = [NAMES[r] for r in RECIPES]
    fig, ax = report.figure(3)
    report.bars(ax[0], names, [s[r]["sampled_imitation"] for r in RECIPES],
                "planted-error imitation (T=1)", "fraction of completions")
    report.bars(ax[1], names, [s[r]["greedy_sums_correct"] for r in RECIPES],
                "held-out accuracy (greedy, sums right)")
    report.bars(ax[2], names, [s[r]["greedy_length"] for r in RECIPES],
                "completion length (greedy)", "tokens")
    return [report.save(fig, folder, "ross.png")]


def notes(res: dict) -> list[str]:
    p, c, w = res["pool"], res["curated"], res["warmup"]
    return [
        f"Noisy policy {res['policy']}: {p['rows']} rollouts, {p['verifier_passed']} verifier-"
        f"positive ({p['clean']} clean, {p['planted_recovered']} with every planted error "
        f"recovered, {p['planted_unrecovered_passed']} right answers over an unrecovered error, "
        f"which the reviewer drops).",
        "Curated rows: " + "; ".join(f"{NAMES[r]} {c[r]['kept']} rows, TER {c[r]['ter']:.3f}, "
                                     f"withheld {c[r]['withheld']}" for r in RECIPES) + ".",
        f"Model: Qwen2-shaped {res['shape']}, ASCII tokens; warm-up {w['steps']} steps on "
        f"{w['rows']} clean demonstrations of other problems, then {res['size']['steps']} steps "
        f"per recipe and seed (batch {warmup.TRAIN['batch']} x {warmup.TRAIN['seq_len']} packed "
        f"tokens, peak lr {warmup.TRAIN['lr']}). Seeds change the data order of relearning; the "
        f"warm-up is shared.",
        f"Held-out: {res['size']['n_test']} problems never trained on; greedy and "
        f"{res['size']['samples']} samples at T=1 each. Imitation: a completion writes a sum minus "
        f"10 on a pair that carries. Recovery: a 'wait, ' line, which ROSS keeps (it follows an "
        f"error in the context), so it is not counted as imitation.",
    ]
