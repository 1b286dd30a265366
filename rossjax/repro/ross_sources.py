"""`rossjax repro ross`'s second part: the Continued control and MOPD as a second source.

The ROSS paper relearns the rollouts of two upstream settings, verifier-reward RL and
multi-teacher on-policy distillation (MOPD), and compares relearning against simply continuing
the upstream run for the same extra budget (Continued RL, Continued MOPD). In miniature:

Upstream checkpoint U: the positive-SFT model of ross.py (the same seed's). It imitates the
noisy policy's verifier-positive rollouts, which is what a 0/1 verifier reward reinforces, so
it stands in for the upstream RL policy at the end of its run; the noisy policy's rollouts are
that run's history. It is a stand-in, not an RL run: no GRPO produced U or its history.

RL source, from U, for the same extra budget of EXTRA optimizer updates of 32 rollouts each:
  * ROSS from U: `rossjax train` (ross recipe, fine-tuning lr) on the ROSS-curated history.
  * Continued RL: `rossjax grpo` (configs/grpo_verifier.py:runlocal with the repro task, the
    verifier as its reward through `reward.fn`, Dr. GRPO advantages, IcePop's band, one update a
    step) from U: 8 prompts x 4 samples = 32 rollouts an update. Same updates x rollouts and
    the same peak lr; GRPO also samples its rollouts, which relearning reads from the history
    (that sampling is extra compute Continued gets, not ROSS). The stage times are reported.

MOPD source: two clean teachers (`rossjax train` on the clean teacher's traces of their own
problems, trained once for all seeds): `carry` (problems with a pair that carries) and `plain`
(none), routed by the task field `family`. `rossjax distill` (configs/distill_onpolicy.py
settings, sampled-token reverse KL) distils U for MOPD_STEPS steps: the MOPD upstream M, whose
history.jsonl (tokens, teacher log-probs) is reviewed (review_text below: errors are found
from the arithmetic, as the noisy policy's planted ones were), curated by `rossjax curate` and:
  * ROSS on MOPD: M fine-tuned by `rossjax train` (ross recipe) for EXTRA updates of 32 rows.
  * Continued MOPD: M's distill run resumed from its last checkpoint (a copy of its workdir,
    grpo.steps raised by EXTRA; the mechanism of distill_onpolicy.py:continued) for EXTRA more
    steps of 8 x 4 completions: the same updates x rollouts.
"""

from __future__ import annotations

import json
import os
import re
import shutil

from rossjax.repro import stages, tasks, warmup

# quick: the machinery, not the effects, in about a minute and a half more; eval_n: the
# held-out problems its arms are graded on
SIZES = {"full": dict(extra=60, mopd_steps=60, teacher_steps=200, contexts=8, group=4),
         "quick": dict(extra=8, mopd_steps=8, teacher_steps=40, contexts=8, group=4,
                       eval_n=64)}
LR = warmup.FINETUNE["lr"]  # every arm from a trained checkpoint: the fine-tuning peak lr
ARMS = ("ross_upstream", "continued_rl", "mopd", "ross_mopd", "continued_mopd")
NAMES = {"ross_upstream": "upstream + ROSS", "continued_rl": "Continued RL",
         "mopd": "MOPD upstream", "ross_mopd": "MOPD + ROSS", "continued_mopd": "Continued MOPD"}
_PAIR = re.compile(r"([a-z]):(\d)\+(\d)")


def pairs_of(prompt: str) -> tuple:
    return tuple((int(a), int(b)) for _, a, b in _PAIR.findall(prompt))


def reward(prompt: str, completion: str, task: dict) -> float:
    """The verifier as GRPO's reward (`reward.fn`): 1 if every pair's last value is its sum."""
    return float(tasks.grade(pairs_of(prompt), completion)["correct"])


def family(p) -> str:
    return "carry" if any(a + b >= 10 for a, b in p) else "plain"


def write_tasks(path: str, problems) -> str:
    """Task objects (rossjax grpo/distill `data.tasks`) with the teacher route `family`."""
    return stages.write_jsonl(path, [
        {"id": "pairs-" + tasks.prompt_text(p).replace(" ", "_"), "domain": "math",
         "family": family(p), "prompt": tasks.prompt_text(p), "reference": tasks.answer_of(p)}
        for p in problems])


def review_text(pairs, text: str) -> dict:
    """The reviewer for a model's own rollouts: a line with wrong arithmetic is an error, and it
    is recovered when the next line is `wait, ` restating that pair right; then tasks.review
    (accept / revise with keep anchors / drop). A line of no known form drops the rollout."""
    lines, planted, recovered = text.split("\n"), [], []
    for ln, line in enumerate(lines, 1):
        m = tasks._STEP.match(line)
        if not m:
            return {"status": "drop"}
        if int(m[4]) != int(m[2]) + int(m[3]):
            nxt = tasks._STEP.match(lines[ln]) if ln < len(lines) else None
            planted.append(ln)
            recovered.append(bool(nxt) and lines[ln].startswith(tasks.RECOVERY)
                             and nxt[1] == m[1] and int(nxt[4]) == int(nxt[2]) + int(nxt[3]))
    return tasks.review(text, planted, recovered)


def reviewed_history(history: str, out: str) -> dict:
    """history.jsonl with the reviewer's annotation on each verifier-positive row (the verdict is
    the run's own, from `reward`); returns what the history holds."""
    rows, stats = [], dict(rows=0, verifier_passed=0, accept=0, revise=0, drop=0, imitation=0)
    with open(history) as f:
        for line in f:
            r = json.loads(line)
            text = r["messages"][-1]["content"] or ""
            pairs = pairs_of(r["task"]["prompt"])
            stats["rows"] += 1
            stats["imitation"] += tasks.grade(pairs, text)["planted"]
            if r["verifier"]["passed"]:
                r["annotation"] = review_text(pairs, text)
                stats["verifier_passed"] += 1
                stats[r["annotation"]["status"]] += 1
            rows.append(r)
    stages.write_jsonl(out, rows)
    return stats


def teachers(workdir: str, st, tok_path: str, train_p, steps: int) -> tuple[dict, dict]:
    """The two clean teachers (trained once, seed 100): ({family: hf folder}, what each holds)."""
    out, info = {}, {}
    for fam in ("carry", "plain"):
        probs = [p for p in train_p if family(p) == fam]
        roll = os.path.join(workdir, "teachers", f"{fam}.jsonl")
        wd = os.path.join(workdir, "teachers", fam)

        def build(fam=fam, probs=probs, roll=roll, wd=wd):
            stages.write_jsonl(roll, [tasks.rollout_record(i, p, tasks.clean_trace(p), [], [],
                                                           0, f"clean-{fam}")
                                      for i, p in enumerate(probs)])
            cur = stages.curated_summary(stages.curate(roll, wd + "-curated", tok_path,
                                                       rows="verifier_positive",
                                                       mask_mode="eligible"))
            init = stages.init_model(os.path.join(workdir, "init", "teachers"), 100,
                                     **warmup.SHAPE)
            stages.train(wd + "-curated", wd, "positive_sft", seed=100, steps=steps, init=init,
                         rows=cur["kept"], **warmup.train_kw(finetune=False))
            return {"problems": len(probs), "rows": cur["kept"]}

        info[fam] = st.run(f"teacher_{fam}", build)
        out[fam] = os.path.join(wd, "hf")
    return out, info


def _rl_args(cfg: str, workdir: str, model: str, tasks_file: str, size: dict, seed: int,
             steps: int) -> list[str]:
    """The flags `rossjax grpo` and `rossjax distill` share here: the repro task and model, one
    update of contexts x group rollouts a step at the constant fine-tuning lr."""
    return [f"--config={cfg}", f"--workdir={workdir}", f"--config.model.path={model}",
            f"--config.data.tasks={tasks_file}", f"--config.grpo.steps={steps}",
            f"--config.grpo.contexts={size['contexts']}",
            f"--config.grpo.group_size={size['group']}",
            f"--config.grpo.max_new_tokens={MAX_NEW}", "--config.grpo.loss_chunk=128",
            "--config.lora.enabled=False", f"--config.optim.peak_lr={LR}",
            f"--config.optim.end_lr={LR}", f"--config.train.seed={seed}",
            f"--config.data.seed={seed}", "--config.reward.workers=0",
            f"--config.reward.fn={__name__}:reward",
            # a multiple of it ends each run (mopd_steps is one of extra): the continued run's
            # config differs from its upstream's in grpo.steps alone
            f"--config.checkpoint.save_every={size['extra']}"]


MAX_NEW = 64  # ross.MAX_NEW: the completions the evaluation samples


def continued_rl(workdir: str, upstream: str, tasks_file: str, size: dict, seed: int) -> dict:
    """`rossjax grpo` from U for EXTRA steps (module doc)."""
    from rossjax.resources import config_path as repo_config

    stages.cli(["grpo", *_rl_args(f"{repo_config('grpo_verifier.py')}:runlocal", workdir,
                                  upstream, tasks_file, size, seed, size["extra"]),
                "--config.grpo.minibatches=1", "--config.grpo.num_iterations=1"])
    stages.export_finished("grpo", workdir, size["extra"])
    return stages.read_metrics(workdir)


def distill_config(workdir: str, teacher: dict) -> str:
    """A config file over distill_onpolicy.py:runlocal with the two teachers and their routes
    (config flags cannot add dict keys)."""
    from rossjax.resources import config_path as repo_config

    path = os.path.join(workdir, "mopd_config.py")
    os.makedirs(workdir, exist_ok=True)
    with open(path, "w") as f:
        f.write(f"""import importlib.util
_s = importlib.util.spec_from_file_location("distill_onpolicy", {repo_config('distill_onpolicy.py')!r})
_m = importlib.util.module_from_spec(_s)
_s.loader.exec_module(_m)


def get_config(arg=None):
    c = _m.get_config("runlocal")
    c.distill.teachers = {teacher!r}
    c.distill.tokenizers = {{k: "" for k in c.distill.teachers}}
    c.distill.routes = {{k: k for k in c.distill.teachers}}
    c.distill.route_field = "family"
    return c
""")
    return path


def distill(workdir: str, cfg: str, upstream: str, tasks_file: str, size: dict, seed: int,
            steps: int) -> dict:
    """`rossjax distill` (a resume when WORKDIR holds a checkpoint) up to `steps` steps."""
    stages.cli(["distill", *_rl_args(cfg, workdir, upstream, tasks_file, size, seed, steps)])
    stages.export_finished("distill", workdir, steps)
    return stages.read_metrics(workdir)


def run(workdir: str, st, tok_path: str, tok, train_p, test_p, seeds: int, samples: int,
        src: dict, ross_rows: int, evaluate) -> tuple[dict, dict, dict]:
    """The five arms for every seed: (runs, curated, info), runs as ross.run's."""
    from tqdm import tqdm

    tasks_file = write_tasks(os.path.join(workdir, "sources", "tasks.jsonl"), train_p)
    teacher, teacher_info = teachers(os.path.join(workdir, "sources"), st, tok_path, train_p,
                                     src["teacher_steps"])
    cfg = distill_config(os.path.join(workdir, "sources"), teacher)
    runs = {a: [] for a in ARMS}
    curated, info = {}, {"teachers": teacher_info,
                         "mopd_history": [], "seconds": {a: [] for a in ARMS}}
    ft = warmup.train_kw(finetune=True)
    test_p = test_p[:src.get("eval_n", len(test_p))]
    for s in tqdm(range(seeds), desc="repro ross sources", unit="seed", disable=None):
        d = os.path.join(workdir, "sources", f"s{s}")
        up = os.path.join(workdir, "runs", f"positive_sft-s{s}", "hf")
        hf = {"mopd": os.path.join(d, "mopd", "hf")}
        m = {"ross_upstream": st.run(f"train_ross_upstream_s{s}", lambda: stages.train(
            os.path.join(workdir, "curated", "ross"), os.path.join(d, "ross_upstream"), "ross",
            seed=s, steps=src["extra"], init=up, rows=ross_rows, **ft)),
             "continued_rl": st.run(f"continued_rl_s{s}", lambda: continued_rl(
                 os.path.join(d, "continued_rl"), up, tasks_file, src, s)),
             "mopd": st.run(f"mopd_s{s}", lambda: distill(
                 os.path.join(d, "mopd"), cfg, up, tasks_file, src, s, src["mopd_steps"]))}
        hist = st.run(f"mopd_review_s{s}", lambda: reviewed_history(
            os.path.join(d, "mopd", "history.jsonl"), os.path.join(d, "mopd_reviewed.jsonl")))
        info["mopd_history"].append(hist)
        trained = list(ARMS)
        if hist["accept"] + hist["revise"]:  # the rows `curate --rows=accepted` can keep
            curated[f"ross_mopd_s{s}"] = cur = st.run(f"curate_ross_mopd_s{s}", lambda: (
                stages.curated_summary(stages.curate(
                    os.path.join(d, "mopd_reviewed.jsonl"), os.path.join(d, "curated_mopd"),
                    tok_path, rows="accepted", mask_mode="annotated"))))
            m["ross_mopd"] = st.run(f"train_ross_mopd_s{s}", lambda: stages.train(
                os.path.join(d, "curated_mopd"), os.path.join(d, "ross_mopd"), "ross", seed=s,
                steps=src["extra"], init=hf["mopd"], rows=cur["kept"], **ft))
        else:  # nothing to relearn: reported (summary, table, claims), not invented
            st.log(f"repro ross: MOPD history of seed {s} has no accepted verifier-positive "
                   f"rows ({hist}); {NAMES['ross_mopd']} not trained")
            trained.remove("ross_mopd")

        def cont(d=d, s=s):
            # the paper's Continued MOPD: resume the upstream run (a copy: M's workdir stays as
            # ROSS relearned it) with its length raised by EXTRA steps
            wd = os.path.join(d, "continued_mopd")
            if not os.path.exists(wd):
                shutil.copytree(os.path.join(d, "mopd"), wd,
                                ignore=shutil.ignore_patterns("hf", "metrics.png"))
            return distill(wd, cfg, up, tasks_file, src, s, src["mopd_steps"] + src["extra"])

        m["continued_mopd"] = st.run(f"continued_mopd_s{s}", cont)
        for a in trained:
            ev = st.run(f"eval_{a}_s{s}", lambda a=a: evaluate(
                os.path.join(d, a, "hf"), tok, test_p, samples, seed=s))
            runs[a].append({"seed": s, "loss": m[a].get("loss"), "kl": m[a].get("kl"),
                            "reward_mean": m[a].get("reward_mean"), **ev})
        for a in ARMS:
            info["seconds"][a].append(stage_seconds(st, a, s))
    return runs, curated, info


_STAGE = {"ross_upstream": "train_ross_upstream", "continued_rl": "continued_rl",
          "mopd": "mopd", "ross_mopd": "train_ross_mopd", "continued_mopd": "continued_mopd"}


def stage_seconds(st, arm: str, s: int) -> float | None:
    """The wall seconds of an arm's training stage as Stages stored them."""
    path = st.path(f"{_STAGE[arm]}_s{s}")
    if not os.path.exists(path):  # an arm not trained (no rows)
        return None
    with open(path) as f:
        return json.load(f).get("seconds")


def _texts(what: str) -> tuple[str, str]:
    return (f"{what}: ROSS relearning imitates the planted error less than continuing the "
            f"upstream run for the same extra updates x rollouts, sampling at T=1",
            f"{what}: ROSS relearning is at least as accurate as continuing, greedy "
            f"(accuracy and pairs right each not below by more than their mean std)")


def _pair_claims(s: dict, ross: str, cont: str, upstream: str, what: str, not_worse) -> list:
    name = lambda a: f"{NAMES.get(a, a)} {{:.3f}}"  # noqa: E731
    imit = [s[a]["sampled_imitation"]["mean"] for a in (ross, cont)]
    ups = (f" (upstream: {upstream[1]} {s[upstream[0]]['sampled_imitation']['mean']:.3f})"
           if upstream[0] in s else "")
    acc = {k: [s[a][k]["mean"] for a in (ross, cont)]
           for k in ("greedy_accuracy", "greedy_pairs_correct")}
    imit_claim, acc_claim = _texts(what)
    return [
        {"claim": imit_claim, "holds": imit[0] < imit[1],
         "evidence": f"{name(ross).format(imit[0])}, {name(cont).format(imit[1])}{ups}"},
        {"claim": acc_claim, "holds": all(not_worse(s[ross][k], s[cont][k]) for k in acc),
         "evidence": "; ".join(f"{k.split('_', 1)[1].replace('_correct', '')} "
                               f"{name(ross).format(v[0])}, {name(cont).format(v[1])}"
                               for k, v in acc.items())},
    ]


def claims(s: dict, not_worse) -> list[dict]:
    """The sources' claims, each where the summary (or README's table) has both of its arms."""
    out = []
    if "ross_upstream" in s and "continued_rl" in s:
        out += _pair_claims(s, "ross_upstream", "continued_rl", ("positive_sft", "positive SFT"),
                            "RL source", not_worse)
    if "ross_mopd" in s and "continued_mopd" in s:
        out += _pair_claims(s, "ross_mopd", "continued_mopd", ("mopd", NAMES["mopd"]),
                            "MOPD source", not_worse)
    elif "continued_mopd" in s:  # a run whose MOPD histories had no rows to relearn
        out += [{"claim": c, "holds": False, "evidence": f"{NAMES['ross_mopd']} not trained: "
                 f"no accepted verifier-positive row in the MOPD history"}
                for c in _texts("MOPD source")]
    return out


def plot(s: dict, folder: str) -> list[str]:
    from rossjax.repro import report

    arms = [a for a in ("positive_sft", *ARMS) if a in s]
    if not set(ARMS) & set(arms):
        return []
    names = [NAMES.get(a, "positive SFT (U)") for a in arms]
    fig, ax = report.figure(2)
    report.bars(ax[0], names, [s[a]["sampled_imitation"] for a in arms],
                "planted-error imitation (T=1)", "fraction of completions")
    report.bars(ax[1], names, [s[a]["greedy_accuracy"] for a in arms],
                "held-out accuracy (greedy)")
    return [report.save(fig, folder, "ross_sources.png")]


def notes(res: dict) -> list[str]:
    z, info = res["sources"], res["sources_info"]
    sec = {a: round(sum(v) / len(v)) for a, v in info["seconds"].items() if v and None not in v}
    h = info["mopd_history"]
    mean = lambda k: sum(x[k] for x in h) / len(h)  # noqa: E731
    return [
        f"Sources (ross_sources.py): the upstream checkpoint U is the positive-SFT model of the "
        f"same seed (it imitates the noisy policy's verifier-positive rollouts; a stand-in for "
        f"the upstream RL policy, not an RL run). Same extra budget for relearning and "
        f"continuing: {z['extra']} optimizer updates of 32 rollouts (ROSS: `rossjax train`, "
        f"32 curated rows a step, cosine lr peak {LR}; Continued RL: `rossjax grpo`, "
        f"{z['contexts']} prompts x {z['group']} samples, one update a step; Continued MOPD: "
        f"`rossjax distill` resumed, {z['contexts']} x {z['group']} a step; both constant lr "
        f"{LR}); GRPO and distill also sample their rollouts, which relearning reads from "
        f"the history. "
        + (f"Quick run: these arms are graded on the first {z['eval_n']} held-out problems. "
           if "eval_n" in z else "")
        + "Mean wall seconds of each arm's training stage: "
        + ", ".join(f"{NAMES[a]} {v} s" for a, v in sec.items()) + ".",
        f"MOPD: two clean teachers (`rossjax train` on the clean traces of their own problems, "
        f"{z['teacher_steps']} steps, once for all seeds): carry "
        f"({info['teachers']['carry']['problems']} problems), plain "
        f"({info['teachers']['plain']['problems']}), routed by the task field `family`; "
        f"`rossjax distill` (sampled-token reverse KL) from U for {z['mopd_steps']} steps of "
        f"{z['contexts']} x {z['group']}. Its history (mean over seeds): {mean('rows'):.0f} "
        f"rollouts, {mean('verifier_passed'):.0f} verifier-positive (reviewer: accept "
        f"{mean('accept'):.0f}, revise {mean('revise'):.0f}, drop {mean('drop'):.0f}), "
        f"{mean('imitation'):.0f} writing the planted error.",
    ]
