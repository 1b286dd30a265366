"""`rossjax eval-generator --config=configs/eval_generator.py`: judge a task generator (PROPEL) or
a policy.

Generator mode: sample fresh function-induction tasks from the generator, check validity under
the AZR protocol (rossjax.verify.induction_task: 10 inputs + a message, `task_valid`), show the
solver 5 input/output pairs and the message, score each of its K answers on the 5 hidden inputs
(rossjax.train.solvers) and report, as the PROPEL paper does:
  utility rate    share of sampled tasks whose realized solve count lands in [lo*K, hi*K]
                  (invalid tasks count as not useful);
  validity rate   share of sampled tasks that pass `task_valid`;
  Self-BLEU-3     mean BLEU (1-3-grams, uniform weights, brevity penalty) of each task against all
                  others (lower = more diverse);
  Distinct-3      distinct word trigrams / all word trigrams;
  top-topic rate  share of the most common topic. Deviation: topics come from a rule (the first
                  matching operation family in the program, see `topic`), not an LLM classifier.
Solvers: `model` (any checkpoint through the sampler; `solver.path`/`solver.preset`) or the
programmatic `oracle` (the task's own f: always solves), `identity` (`def f(*a): return a[0]`)
and `lookup` (a table of the shown pairs: scores 0, the hidden-split check).

Policy mode (`mode=policy`): K answers per task of a task file, verified by the curation
verifiers; reports pass@k (unbiased estimator) for k in `ks`, coverage (share of tasks solved
at least once) and `outcomes`, the pre-RL mixed-outcome diagnostic: the shares of prompts whose
K samples are mixed (some pass, some fail: the only groups with a GRPO learning signal),
all-pass and all-fail (undecided verdicts count as not passed; their number is reported).
`configs/eval_generator.py:mixed_outcome` is the paper's: 64 prompts x 8 samples at T = 1.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re

import numpy as np

from rossjax.errors import ConfigError
from rossjax.train import solvers
from rossjax.verify import induction_task

_TOPICS = (("string", r"str\(|\.join|\.split|\.upper|\.lower|\[::-1\]|'"),
           ("sorting", r"sorted\(|\.sort\("), ("list", r"\[|append|len\("),
           ("arithmetic", r"[-+*/%]"), ("logic", r"\bif\b|\band\b|\bor\b"))


# ----------------------------------------------------------------------------- metrics

def _ngrams(toks, n):
    return collections.Counter(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))


def bleu(hyp: list[str], refs: list[list[str]], max_n: int = 3) -> float:
    """Sentence BLEU with clipped counts over several references, closest reference length."""
    if not hyp or not refs:
        return 0.0
    logs = []
    for n in range(1, max_n + 1):
        h = _ngrams(hyp, n)
        total = sum(h.values())
        if total == 0:
            return 0.0
        best = collections.Counter()
        for r in refs:
            for g, c in _ngrams(r, n).items():
                best[g] = max(best[g], c)
        clipped = sum(min(c, best[g]) for g, c in h.items())
        if clipped == 0:
            return 0.0
        logs.append(math.log(clipped / total))
    ref_len = min((abs(len(r) - len(hyp)), len(r)) for r in refs)[1]
    bp = 1.0 if len(hyp) > ref_len else math.exp(1 - ref_len / len(hyp))
    return bp * math.exp(sum(logs) / max_n)


def self_bleu(texts: list[str], n: int = 3) -> float:
    toks = [t.split() for t in texts]
    if len(toks) < 2:
        return 0.0
    return float(np.mean([bleu(toks[i], toks[:i] + toks[i + 1:], n) for i in range(len(toks))]))


def distinct_n(texts: list[str], n: int = 3) -> float:
    grams = [g for t in texts for g in _ngrams(t.split(), n).elements()]
    return len(set(grams)) / len(grams) if grams else 0.0


def topic(program: str) -> str:
    for name, pat in _TOPICS:
        if re.search(pat, program.split("\n", 1)[-1]):
            return name
    return "other"


def top_topic_rate(topics: list[str]) -> float:
    return max(collections.Counter(topics).values()) / len(topics) if topics else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def outcome_shares(correct) -> dict:
    """Shares of prompts (rows of a bool [prompts, K] array) whose K samples are mixed, all
    pass or all fail; the three add up to 1."""
    correct = np.asarray(correct, bool)
    n = int(correct.shape[0])
    passed = correct.sum(axis=1)
    k = correct.shape[1] if correct.ndim == 2 else 0
    counts = {"all_pass": int((passed == k).sum()), "all_fail": int((passed == 0).sum())}
    counts["mixed"] = n - counts["all_pass"] - counts["all_fail"]
    return {"prompts": n, "samples_per_prompt": int(k), "counts": counts,
            **{name: counts[name] / n if n else 0.0 for name in ("mixed", "all_pass", "all_fail")}}


def utility_rate(solved, valid_tasks, k: int, lo: float, hi: float) -> float:
    """Share of all sampled tasks that are valid and solved lo*K..hi*K times."""
    ok = [v and lo * k - 1e-9 <= s <= hi * k + 1e-9 for s, v in zip(solved, valid_tasks)]
    return float(np.mean(ok)) if ok else 0.0


# ----------------------------------------------------------------------------- running

def _model(section, tok, seed, field):
    return solvers.load_model(section, tok, seed, field)


def _sample(mc, params, tok, prompts_msgs, n, c, seed):
    return solvers.sample_texts(mc, params, tok, prompts_msgs, n, c, seed)


def check_config(c):
    """One-sentence ConfigErrors for an eval-generator config, before any model loads."""
    if c.mode not in ("generator", "policy"):
        raise ConfigError(f"config.mode {c.mode!r} is not generator or policy.")
    if c.solver.kind not in solvers.KINDS:
        raise ConfigError(f"config.solver.kind {c.solver.kind!r} is not one of "
                          f"{', '.join(solvers.KINDS)}.")
    for field in ("num_tasks", "k", "max_new_tokens"):
        if c[field] < 1:
            raise ConfigError(f"config.{field} is {c[field]}; it must be at least 1.")
    if not 0 <= c.lo <= c.hi <= 1:
        raise ConfigError(f"config.lo {c.lo} and config.hi {c.hi} must satisfy 0 <= lo <= hi <= 1.")
    induction_task.protocol_from(c.get("induction"))
    needed = [("generator", c.generator)] if c.mode == "generator" else []
    if c.solver.kind == "model" or c.mode == "policy":  # policy mode samples solver.path/preset
        needed.append(("solver", c.solver))
    for name, m in needed:
        if not (m.path or m.preset):
            raise ConfigError(f"config.{name}.path and config.{name}.preset are both empty; give a "
                              f"model folder or a preset name.")


def evaluate_generator(c) -> dict:
    """Sample tasks, gate them (check_task), build each valid one's solver task (5 shown pairs +
    message, 5 hidden inputs) and count the solver's successes on the hidden inputs in K trials."""
    protocol = induction_task.protocol_from(c.get("induction"))
    tok = solvers.load_tokenizer(c.tokenizer, c.workdir)
    mc, params = _model(c.generator, tok, c.seed, "config.generator")
    msgs = [[{"role": "user", "content": induction_task.generator_prompt(protocol)}]]
    texts = _sample(mc, params, tok, msgs, c.num_tasks, c, c.seed)
    tasks = [induction_task.parse_generated_task(t) for t in texts]
    valid = [bool(induction_task.check_task(t, protocol).passed) for t in tasks]
    solver_tasks = [induction_task.solver_task(t, protocol, f"gen-{i}") if ok else None
                    for i, (t, ok) in enumerate(zip(tasks, valid))]
    solver = solvers.Solver(c.solver, tok, c, c.seed)
    solved = [sum(bool(x) for x in row)
              for row in solvers.trials(solver, solver_tasks, c.k, c.seed)]
    good = [t["program"] for t in tasks if t]
    return {"mode": "generator", "tasks": len(tasks), "k": c.k,
            "utility_rate": utility_rate(solved, valid, c.k, c.lo, c.hi),
            "validity_rate": float(np.mean(valid)), "self_bleu3": self_bleu(texts),
            "distinct3": distinct_n(texts), "top_topic_rate": top_topic_rate([topic(p) for p in good]),
            "solve_counts": solved}


def evaluate_policy(c) -> dict:
    from rossjax.train import rollout
    from rossjax.verify import verify_many

    tok = solvers.load_tokenizer(c.tokenizer, c.workdir)
    mc, params = _model(c.solver, tok, c.seed, "config.solver")
    src = rollout.TaskSource(c.tasks, c.seed, field="config.tasks")
    tasks = src.next(c.num_tasks)
    msgs = [rollout.prompt_messages(t) for t in tasks]
    answers = _sample(mc, params, tok, msgs, c.k, c, c.seed)
    records = [{"task": rollout.task_for_record(tasks[i // c.k]),
                "messages": [*msgs[i // c.k], {"role": "assistant", "content": a}]}
               for i, a in enumerate(answers)]
    verdicts = verify_many(records, workers=c.workers)
    correct = np.asarray([bool(v.passed) for v in verdicts]).reshape(len(tasks), c.k)
    out = {"mode": "policy", "tasks": len(tasks), "k": c.k, "temperature": c.temperature,
           "coverage": float(np.mean(correct.any(axis=1))), "outcomes": outcome_shares(correct),
           "undecided_samples": int(sum(v.passed is None for v in verdicts))}
    for k in c.ks:
        if k <= c.k:
            out[f"pass@{k}"] = float(np.mean([pass_at_k(c.k, int(r.sum()), k) for r in correct]))
    return out


def run(c, workdir: str) -> dict:
    """`rossjax eval-generator` (configs/eval_generator.py): evaluate, write
    WORKDIR/eval_generator.json, return the results."""
    c.workdir = workdir
    check_config(c)
    os.makedirs(c.workdir, exist_ok=True)
    out = evaluate_generator(c) if c.mode == "generator" else evaluate_policy(c)
    with open(os.path.join(c.workdir, "eval_generator.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out
