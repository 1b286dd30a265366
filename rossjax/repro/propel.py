"""`rossjax repro propel`: a probe on a frozen model's activations steers a task generator
toward the solver's learnable band.

Pipeline: templated induction tasks of five families (propel_tasks.py) -> `rossjax curate` +
`rossjax train`: the base generator -> it writes a pool of tasks, each gated by the protocol's
validity check and tried K times by the solver on the hidden inputs (AZR protocol: 5 shown
pairs + message, 5 hidden) -> labels.jsonl + inputs.jsonl (`rossjax label-corpus`'s format and
probe rendering) -> `rossjax extract` on the frozen base generator -> `rossjax probe-sweep` ->
`rossjax grpo` (configs/propel_azr.py) with the probe reward behind the validity gate, and with
a verifier-free heuristic reward (propel_tasks.heuristic_reward) -> `rossjax export` -> each
generator writes fresh tasks, scored like the pool.

The pool's labels and the generators' scores come from the programmatic solver below, which
`rossjax label-corpus` and `rossjax eval-generator` cannot load (they drive a model solver), so
this module writes their formats with their own functions (label_corpus.probe_input,
eval_generator's metrics).

Metrics per generator: utility rate (valid and solved 1..3 times in K=8: the learnable band),
validity rate, Self-BLEU-3 and Distinct-3 (rossjax.train.propel.eval_generator), the top-family
share (the collapse metric) and family mix; for each GRPO run its wall-clock and solver trials.
The paper's comparisons (solver in the loop, WCO, the adversarial auxiliary probe, cold
transfer) are the arms of propel_compare.py; `--quick` runs solver in the loop only.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os

import numpy as np

from rossjax.repro import propel_compare as cmp, propel_tasks as pt, stages, warmup
from rossjax.repro.propel_tasks import HI, LO, K, score_tasks
from rossjax.repro.report import summary as _ms

ARMS = ("base", "probe", "heuristic")
NAMES = {"base": "base generator", "probe": "GRPO, probe reward", "heuristic": "GRPO, heuristic"}
# Full: the paper's 30 GRPO steps, at 4 x 8 rollouts a step so that 3 seeds fit in 20 minutes
# on 2 CPU cores. Quick (what `make test` runs; no test reads a direction from it): 4 GRPO steps
# of 8 x 8 per arm, and the generator on rows of 192 tokens (the longest curated row is 181:
# 256 only added padding). The generator keeps its 300 steps: at 150 (loss 0.19 against 0.17)
# the base generator's validity fell from 0.67 to 0.21, under the 0.3 the test needs. It takes
# 16 rollouts a step, not 32 (issue 46): validity 0.65 against 0.68 at 32 and 0.40 at 8, in 58 s
# of training against 98 s.
SIZES = {
    "full": dict(n_corpus=3000, gen_steps=300, n_pool=500, n_eval=128, grpo_steps=30,
                 contexts=4, group=8),
    "quick": dict(n_corpus=1500, gen_steps=300, gen_seq=192, gen_batch=16, n_pool=400,
                  n_eval=96, grpo_steps=4, contexts=8, group=8),
}
MAX_NEW = 160
SOLVER = pt.SOLVER
GRPO_LR = 5e-4


def _corpus(path: str, n: int) -> dict:
    rng = np.random.default_rng(7)
    rows, fams = [], collections.Counter()
    for i in range(n):
        t = pt.sample_task(rng)
        fams[t["family"]] += 1
        rows.append({"id": f"corpus-{i}", "task": {"id": f"corpus-{i}", "domain": "induction_gen"},
                     "source": {"run": "repro-task-templates", "step": 0},
                     "messages": [{"role": "user", "content": pt.PROMPT},
                                  {"role": "assistant", "content": pt.task_answer(t)}],
                     "reward": 1.0, "verifier": {"name": "induction_task_valid", "passed": True,
                                                 "evidence": "templated task"}})
    stages.write_jsonl(path, rows)
    return dict(fams)


def generate(hf_dir: str, tok, n: int, seed: int) -> list[str]:
    model = stages.load_model(hf_dir)
    return [c["text"] for c in stages.complete(model, tok, [pt.PROMPT], max_new=MAX_NEW,
                                               temperature=1.0, num_samples=n, seed=seed)[0]]


def label_pool(folder: str, hf_dir: str, tok, n: int) -> dict:
    """The probe's training data from the base generator's own tasks, in label-corpus format."""
    from rossjax.train.propel.label_corpus import probe_input
    from rossjax.verify import induction_task as it

    texts = generate(hf_dir, tok, n, seed=1234)
    scored = score_tasks(texts, seed=99, ids={i: f"pool-{i}" for i in range(n)})
    labels, inputs = [], []
    for i, (text, s) in enumerate(zip(texts, scored)):
        rid = f"pool-{i}"
        # Group = the task's canonical text: the base generator repeats itself, and a copy in
        # both a training and a validation fold would inflate the probe's held-out accuracy.
        same = it.task_text(s["task"]) if s["valid"] else text
        labels.append({"id": rid, "trials": [bool(x) for x in s["trials"]],
                       "valid": int(s["valid"]), "family": s["family"],
                       "group": hashlib.sha1(same.encode()).hexdigest()[:16]})
        ids, rendered = probe_input(s["task"] if s["valid"] else None, text, tok, "chatml")
        inputs.append({"id": rid, "input_ids": ids, "text": rendered})
    stages.write_jsonl(os.path.join(folder, "labels.jsonl"), labels)
    stages.write_jsonl(os.path.join(folder, "inputs.jsonl"), inputs)
    return summarize_scores(scored, texts)


def summarize_scores(scored: list[dict], texts: list[str]) -> dict:
    from rossjax.train.propel.eval_generator import distinct_n, self_bleu, utility_rate

    valid = [s["valid"] for s in scored]
    return {"utility": utility_rate([s["solves"] for s in scored], valid, K, LO, HI),
            "n": len(scored),
            "validity": float(np.mean(valid)), "self_bleu3": self_bleu(texts),
            "distinct3": distinct_n(texts),
            "families": dict(collections.Counter(s["family"] for s in scored if s["valid"])),
            "examples": texts[:3]}


def probe(folder: str, gen_hf: str) -> dict:
    """`rossjax extract` on the frozen base generator, then `rossjax probe-sweep`."""
    store = cmp.extract(gen_hf, os.path.join(folder, "labels", "inputs.jsonl"),
                        os.path.join(folder, "activations"))
    return {"path": cmp.sweep(folder, store, os.path.join(folder, "labels", "labels.jsonl"),
                              os.path.join(folder, "sweep"))}


def probe_summary(path: str) -> dict:
    """What the sweep chose and how well it did (its manifest's summary, validation folds)."""
    with open(path + ".json") as f:
        m = json.load(f)
    s = m.get("summary") or {}
    return {"layer": m.get("layer"), "head": m.get("head"), "pooling": m.get("pooling"),
            "val_balanced_accuracy": s.get("val_balanced_accuracy"),
            "val_balanced_accuracy_std": s.get("val_balanced_accuracy_std"),
            "note": m.get("selection_note", ""),
            # runs from before the split was recorded used the sweep's then default: random
            "split_detail": m.get("split_detail", "random 80/10/10, groups ignored")}


def grpo(workdir: str, gen_hf: str, tasks_file: str, size: dict, seed: int, reward: list[str],
         config: str = "propel_azr.py:runlocal"):
    from rossjax.resources import config_path as repo_config

    name, _, variant = config.partition(":")
    stages.cli(["grpo", f"--config={repo_config(name)}:{variant}", f"--workdir={workdir}",
                f"--config.model.path={gen_hf}", f"--config.data.tasks={tasks_file}",
                f"--config.grpo.steps={size['grpo_steps']}",
                f"--config.grpo.contexts={size['contexts']}",
                f"--config.grpo.group_size={size['group']}",
                f"--config.grpo.max_new_tokens={MAX_NEW}", "--config.grpo.loss_chunk=256",
                "--config.lora.enabled=False", f"--config.optim.peak_lr={GRPO_LR}",
                f"--config.optim.end_lr={GRPO_LR}", f"--config.train.seed={seed}",
                f"--config.data.seed={seed}", "--config.reward.workers=2",
                f"--config.checkpoint.save_every={size['grpo_steps']}", *reward])
    return stages.export_finished("grpo", workdir, size["grpo_steps"])


def train_generator(workdir: str, size: dict, rows: int, seed: int = 0,
                    name: str = "generator") -> str:
    """The templated-task generator of one init seed (WORKDIR/<name>/hf); seed 1: the cold
    transfer arm's other generator (propel_compare)."""
    init = stages.init_model(os.path.join(workdir, "init" + (f"{seed}" if seed else "")), seed,
                             **warmup.SHAPE)
    gen = os.path.join(workdir, name)
    stages.train(os.path.join(workdir, "curated"), gen, "positive_sft", seed=seed,
                 steps=size["gen_steps"], init=init, rows=rows,
                 **warmup.train_kw(False, seq_len=size.get("gen_seq", 256),
                                   batch=size.get("gen_batch")))
    return os.path.join(gen, "hf")


def run(workdir: str, seeds: int, quick: bool, log=print) -> dict:
    from tqdm import tqdm

    size = SIZES["quick" if quick else "full"]
    key = dict(size=size, solver=SOLVER, band=(K, LO, HI), lr=GRPO_LR, shape=warmup.SHAPE,
               train=warmup.TRAIN, max_new=MAX_NEW)
    st = stages.Stages(workdir, log, key=key)
    tok_path, tok = stages.ascii_tokenizer(os.path.join(os.path.dirname(workdir), "tokenizer"))
    corpus = os.path.join(workdir, "corpus.jsonl")
    corpus_mix = st.run("corpus", lambda: _corpus(corpus, size["n_corpus"]))
    cur = os.path.join(workdir, "curated")
    rep = st.run("curate", lambda: stages.curated_summary(stages.curate(
        corpus, cur, tok_path, rows="verifier_positive", mask_mode="eligible")))
    st.run("train_generator", lambda: train_generator(workdir, size, rep["kept"]))
    gen_hf = os.path.join(workdir, "generator", "hf")
    pool = st.run("label_pool", lambda: label_pool(os.path.join(workdir, "labels"), gen_hf, tok,
                                                   size["n_pool"]))
    pr = st.run("probe", lambda: probe(workdir, gen_hf))
    pr = {**pr, **probe_summary(pr["path"])}
    tasks_file = os.path.join(workdir, "generator_tasks.jsonl")
    stages.write_jsonl(tasks_file, [{"id": f"gen-{i}", "domain": "induction_gen", "prompt": pt.PROMPT,
                                     "protocol": {"n_inputs": 10, "n_visible": 5, "split": "first"}}
                                    for i in range(64)])
    ctx = {"gen_hf": gen_hf, "probe": pr["path"], "tok": tok, "rows": rep["kept"],
           "train_generator": train_generator}
    plans = {"probe": {"config": "propel_azr.py:runlocal", "policy": gen_hf,
                       "reward": [f"--config.reward.probe.path={pr['path']}"]},
             "heuristic": {"config": "propel_azr.py:runlocal", "policy": gen_hf, "reward": [
                 "--config.reward.fn=rossjax.repro.propel_tasks:heuristic_reward"]}}
    arms = (*ARMS, *cmp.arms(quick))
    runs = {a: [] for a in arms}
    todo = [(s, a) for s in range(seeds) for a in arms]
    for s, a in tqdm(todo, desc="repro propel", unit="run", disable=None):
        cmp.prepare(a, st, ctx, workdir, size)
        extra = {}
        if a == "base":
            hf = gen_hf
        elif a in cmp.UNTRAINED:
            hf = ctx["gen2"]
        else:
            p = plans.get(a) or cmp.plan(a, ctx)
            rd = os.path.join(workdir, "runs", f"{a}-s{s}")
            hf = st.run(f"grpo_{a}_s{s}", lambda p=p, rd=rd, s=s: grpo(
                rd, p["policy"], tasks_file, size, s, p["reward"], config=p["config"]))
            extra = cmp.cost(st, f"grpo_{a}_s{s}", rd)

        def ev(hf=hf, s=s):
            texts = generate(hf, tok, size["n_eval"], seed=100 + s)
            return summarize_scores(score_tasks(texts, seed=200 + s), texts)
        runs[a].append({"seed": s, **st.run(f"eval_{a}_s{s}", ev), **extra})
    summary = {a: {**{k: _ms([r[k] for r in rs]) for k in ("utility", "validity", "self_bleu3",
                                                            "distinct3")}, **cmp.summary(rs)}
               for a, rs in runs.items()}
    return {"experiment": "propel", "quick": quick, "seeds": seeds, "size": size,
            "solver": SOLVER, "k": K, "band": [LO, HI], "corpus_mix": corpus_mix, "pool": pool,
            "pool_trials": cmp.pool_trials(pool, K), "probe": pr, "runs": runs,
            "summary": summary}


def names(res: dict) -> dict:
    return {**NAMES, **cmp.NAMES}


def table(res: dict):
    from rossjax.repro.report import ms

    headers = ["generator", "utility", "validity", "Self-BLEU-3", "Distinct-3", "top-family share",
               "top family", "GRPO s", "solver trials (RL)"]
    rows = []
    for a in res["runs"]:
        s = res["summary"][a]
        fams = collections.Counter()
        for r in res["runs"][a]:
            fams.update(r["families"])
        top = fams.most_common(1)[0][0] if fams else "-"
        share = ms(s["top_share"]) if "top_share" in s else "-"
        cost = ([ms(s["grpo_seconds"], 0), ms(s["solver_trials"], 0)] if "grpo_seconds" in s
                else ["-", "-"])
        rows.append([names(res)[a], ms(s["utility"]), ms(s["validity"]), ms(s["self_bleu3"]),
                     ms(s["distinct3"]), share, top, *cost])
    return headers, rows


def claims(res: dict) -> list[dict]:
    u = {a: res["summary"][a]["utility"]["mean"] for a in ARMS}
    ev = ", ".join(f"{NAMES[a]} {u[a]:.3f}" for a in ARMS)
    return [{"claim": "the probe reward raises the utility (learnable-band) rate over the base "
                      "generator", "holds": u["probe"] > u["base"], "evidence": ev},
            {"claim": "the probe reward beats the verifier-free heuristic on utility",
             "holds": u["probe"] > u["heuristic"], "evidence": ev},
            _kept(res["summary"]), *cmp.claims(res, names(res))]


def _kept(s: dict) -> dict:
    """Validity and diversity kept: the probe run's validity and Distinct-3 not below the base
    generator's, nor its Self-BLEU-3 above, by more than the two arms' mean std (one seed: at all)."""
    slack = lambda k: (s["probe"][k]["std"] + s["base"][k]["std"]) / 2  # noqa: E731
    p, b = ({k: s[a][k]["mean"] for k in ("validity", "distinct3", "self_bleu3")}
            for a in ("probe", "base"))
    holds = (p["validity"] >= b["validity"] - slack("validity")
             and p["distinct3"] >= b["distinct3"] - slack("distinct3")
             and p["self_bleu3"] <= b["self_bleu3"] + slack("self_bleu3"))
    return {"claim": "the probe reward keeps the base generator's validity and diversity "
                     "(validity, Distinct-3 not lower, Self-BLEU-3 not higher, beyond the arms' "
                     "mean std)", "holds": holds,
            "evidence": "; ".join(f"{NAMES[a]} validity {s[a]['validity']['mean']:.3f}, Distinct-3 "
                                  f"{s[a]['distinct3']['mean']:.3f}, Self-BLEU-3 "
                                  f"{s[a]['self_bleu3']['mean']:.3f}" for a in ("base", "probe"))}


def plot(res: dict, folder: str) -> list[str]:
    from rossjax.repro import report

    s, arms = res["summary"], list(res["summary"])
    labels = [names(res)[a] for a in arms]
    panels = (("utility", "utility rate (band 1..3 of 8)"), ("validity", "validity rate"),
              ("self_bleu3", "Self-BLEU-3 (lower: diverse)"),
              ("distinct3", "Distinct-3 (higher: diverse)"),
              ("top_share", "top-family share (collapse)"))
    fig, ax = report.figure(len(panels))
    for j, (key, title) in enumerate(panels):
        report.bars(ax[j], labels, [s[a][key] for a in arms], title)
    return [report.save(fig, folder, "propel.png")]


def notes(res: dict) -> list[str]:
    z, p = res["size"], res["pool"]
    return [
        f"Base generator: a {warmup.SHAPE} model trained {z['gen_steps']} steps on "
        f"{z['n_corpus']} templated tasks (families {res['corpus_mix']}).",
        f"Solver {res['solver']} (propel_tasks.Solver), K={res['k']} trials per task on the 5 "
        f"hidden inputs; band: solved {res['band'][0] * res['k']:.0f}..{res['band'][1] * res['k']:.0f} "
        f"times.",
        f"Probe: trained on {z['n_pool']} tasks the base generator wrote (utility {p['utility']:.3f}, "
        f"validity {p['validity']:.3f}); activations of the frozen base generator (`rossjax extract`, "
        f"mean pooling, layers 1-2); `rossjax probe-sweep` (linear heads, "
        f"{res['probe'].get('split_detail', 'random 80/10/10, groups ignored')}; group = the "
        f"task's canonical text, so copies stay on one side when the split is grouped) chose "
        f"layer {res['probe']['layer']}: validation balanced accuracy "
        f"{res['probe']['val_balanced_accuracy']:.3f} ± {res['probe']['val_balanced_accuracy_std']:.3f}"
        f"{'; ' + res['probe']['note'] if res['probe']['note'] else ''}.",
        f"GRPO: configs/propel_azr.py:runlocal with the base generator, full fine-tuning, lr "
        f"{GRPO_LR}, {z['grpo_steps']} steps of {z['contexts']} x {z['group']} tasks; the "
        f"heuristic run's reward is propel_tasks.heuristic_reward (validity gate, then more "
        f"operators and larger constants score higher). Evaluation: {z['n_eval']} fresh tasks "
        f"per generator and seed at T=1.",
        "Family 'other': a valid task whose message names none of the five families, so the "
        "solver cannot use the hint and searches all it knows; for this solver an uninformative "
        "hint is a cheap way into the band, which the utility rate counts like any other band "
        "task. Top-family share (the collapse metric): the most common family's share of an "
        "arm's valid tasks, per seed (look at it before reading utility).",
        *cmp.notes(res),
    ]
