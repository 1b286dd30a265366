"""`rossjax eval-generator --config=configs/eval_generator.py`: judge a task generator (PROPEL) or
a policy.

Generator mode: sample fresh tasks from the generator, each prompted with its own context
(rossjax.verify.generator_context: Math, two example problems from a pool; AZR, the seed
function, reference tasks and the banned imports; `context=instruction`: one fixed instruction),
gate them, and score the solver's K answers per valid task (rossjax.train.propel.solvers):
  induction (`domain=induction`)  the AZR protocol (rossjax.verify.induction_task: 10 inputs + a
                  message, `task_valid`); the solver sees 5 input/output pairs and the message
                  and each answer is scored on the 5 hidden inputs;
  math (`domain=math`)  the generator writes a problem only (`check_problem`); two oracles answer
                  it twice each and it is valid only when all four agree (the agreed answer is
                  the reference; rossjax/verify/math_oracle.py); the solver's answers are checked
                  against it with math-verify.
Reported as the PROPEL paper does:
  utility rate    share of sampled tasks whose realized solve count lands in [lo*K, hi*K]
                  (invalid tasks count as not useful);
  validity rate   share of sampled tasks that are valid (math: W and the oracles agree);
  Self-BLEU-3     Montahaei et al.'s: each task's sentence BLEU (1-3-grams, weights 1/3,
                  clipped counts against all other tasks, closest-reference brevity penalty,
                  NLTK's smoothing method1: epsilon 0.1 added to a zero n-gram match count) on
                  whitespace tokens, averaged (lower = more diverse);
  Distinct-3      distinct word trigrams / all word trigrams;
  top-topic rate  share of the most common topic. Deviation: topics come from a rule (the first
                  matching operation family in the program, see `topic`; math:
                  `math_task.topic`), not an LLM classifier;
  solver / oracles  what the solver and the oracles did (tasks, trials, answers that never came;
                  endpoints: requests, retries, cache hits, tokens).
Solvers (rossjax.train.propel.solvers): `model` (a checkpoint on the rollout engine), `endpoint` (an
OpenAI-compatible server), `fn` (module:function), or the programmatic `oracle` (the task's own
answer: always solves), `identity` and `lookup` (induction: a table of the shown pairs, scores
0, the hidden-split check).

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
from rossjax.train.propel import solvers
from rossjax.verify import generator_context, induction_task, math_oracle, math_task

DOMAINS = ("induction", "math")
EPSILON = 0.1  # NLTK SmoothingFunction().method1's default, as Montahaei et al. use it

_TOPICS = (("string", r"str\(|\.join|\.split|\.upper|\.lower|\[::-1\]|'"),
           ("sorting", r"sorted\(|\.sort\("), ("list", r"\[|append|len\("),
           ("arithmetic", r"[-+*/%]"), ("logic", r"\bif\b|\band\b|\bor\b"))


# ----------------------------------------------------------------------------- metrics

def _ngrams(toks, n):
    return collections.Counter(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))


def _log_precisions(hyp_grams, best, max_n: int):
    """log p_n for n = 1..max_n with NLTK's method1 smoothing, or None when no unigram matches
    (NLTK returns 0 then). `best(n, gram)` is the gram's largest count in any reference."""
    logs = []
    for n in range(1, max_n + 1):
        h = hyp_grams[n - 1]
        clipped = sum(min(c, best(n, g)) for g, c in h.items())
        if n == 1 and clipped == 0:
            return None
        total = max(1, sum(h.values()))  # NLTK: a hypothesis shorter than n counts 0 / 1
        logs.append(math.log((clipped if clipped else EPSILON) / total))
    return logs


def _bp(hyp_len: int, ref_lens) -> float:
    ref_len = min(ref_lens, key=lambda r: (abs(r - hyp_len), r))  # closest, ties to the shorter
    if hyp_len > ref_len:
        return 1.0
    return 0.0 if hyp_len == 0 else math.exp(1 - ref_len / hyp_len)


def bleu(hyp: list[str], refs: list[list[str]], max_n: int = 3) -> float:
    """Sentence BLEU with clipped counts over several references, closest reference length,
    uniform weights and NLTK's smoothing method1 (= nltk sentence_bleu(refs, hyp,
    (1/max_n,)*max_n, SmoothingFunction().method1))."""
    if not hyp or not refs:
        return 0.0
    ref_grams = [[_ngrams(r, n) for r in refs] for n in range(1, max_n + 1)]
    logs = _log_precisions([_ngrams(hyp, n) for n in range(1, max_n + 1)],
                           lambda n, g: max(rg[g] for rg in ref_grams[n - 1]), max_n)
    if logs is None:
        return 0.0
    return _bp(len(hyp), [len(r) for r in refs]) * math.exp(math.fsum(logs) / max_n)


def self_bleu(texts: list[str], n: int = 3) -> float:
    """Self-BLEU-n (Montahaei et al.): the mean over texts of `bleu(text, all other texts)`.
    Each n-gram's largest and second-largest counts over all texts (and who holds the largest)
    give the largest count among the *others* in O(1), so the whole is linear in the tokens."""
    toks = [t.split() for t in texts]
    if len(toks) < 2:
        return 0.0
    grams = [[_ngrams(t, m) for m in range(1, n + 1)] for t in toks]
    top: list[dict] = [{} for _ in range(n)]  # gram -> (largest, holder, second largest)
    for i, per in enumerate(grams):
        for m in range(n):
            for g, c in per[m].items():
                c1, who, c2 = top[m].get(g, (0, -1, 0))
                top[m][g] = (c, i, c1) if c > c1 else (c1, who, max(c2, c))
    lens = [len(t) for t in toks]
    scores = []
    for i, per in enumerate(grams):
        if not toks[i]:
            scores.append(0.0)
            continue

        def best(m, g, i=i):
            c1, who, c2 = top[m - 1][g]
            return c2 if who == i else c1
        logs = _log_precisions(per, best, n)
        others = lens[:i] + lens[i + 1:]
        scores.append(0.0 if logs is None else _bp(lens[i], others) * math.exp(math.fsum(logs) / n))
    return float(np.mean(scores))


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
    if c.get("domain", "induction") not in DOMAINS:
        raise ConfigError(f"config.domain {c.domain!r} is not one of {', '.join(DOMAINS)}.")
    for field in ("num_tasks", "k", "max_new_tokens"):
        if c[field] < 1:
            raise ConfigError(f"config.{field} is {c[field]}; it must be at least 1.")
    if not 0 <= c.lo <= c.hi <= 1:
        raise ConfigError(f"config.lo {c.lo} and config.hi {c.hi} must satisfy 0 <= lo <= hi <= 1.")
    induction_task.protocol_from(c.get("induction"))
    if c.mode == "policy":  # policy mode samples solver.path/preset itself
        if not (c.solver.path or c.solver.preset):
            raise ConfigError("config.solver.path and config.solver.preset are both empty; give a "
                              "model folder or a preset name.")
        return
    solvers.check_section(c.solver, "config.solver")
    if not (c.generator.path or c.generator.preset):
        raise ConfigError("config.generator.path and config.generator.preset are both empty; give "
                          "a model folder or a preset name.")
    if c.get("domain") == "math":
        solvers.check_oracles(c.oracles)
        if c.oracles.attempts < 1:
            raise ConfigError(f"config.oracles.attempts is {c.oracles.attempts}; it must be at "
                              f"least 1.")


def generator_texts(c, tok, protocol) -> list[str]:
    """num_tasks answers of the generator, each prompted with its own context (the same draws
    GRPO makes for the same seed and index); one fixed instruction: one prompt, sampled
    num_tasks times."""
    math = c.get("domain") == "math"
    domain = "math" if math else "induction"
    section = c.get("math") if math else c.get("induction")
    ctx = generator_context.context_from(section, domain, c.seed, f"config.{domain}")
    mc, params = _model(c.generator, tok, c.seed, "config.generator")

    def prompt(shown):
        return (math_task.generator_prompt(shown) if math
                else induction_task.generator_prompt(protocol, shown))
    if ctx.kind == "instruction":
        return _sample(mc, params, tok, [[{"role": "user", "content": prompt([])}]],
                       c.num_tasks, c, c.seed)
    msgs = [[{"role": "user", "content": prompt(ctx.examples(i))}] for i in range(c.num_tasks)]
    return _sample(mc, params, tok, msgs, 1, c, c.seed)


def evaluate_generator(c) -> dict:
    """Sample tasks, gate them, give each valid one its solver task (induction: 5 shown pairs +
    message, 5 hidden inputs; math: the oracles' agreed reference) and count the solver's
    successes in K trials."""
    protocol = induction_task.protocol_from(c.get("induction"))
    tok = solvers.load_tokenizer(c.tokenizer, c.workdir)
    texts = generator_texts(c, tok, protocol)
    solver = solvers.Solver(c.solver, tok, c, c.seed)
    out = {"mode": "generator", "domain": c.get("domain", "induction"), "tasks": len(texts),
           "k": c.k}
    if c.get("domain") == "math":
        tasks = [math_task.parse_generated_problem(t) for t in texts]
        gate = [bool(math_task.check_problem(t).passed) for t in tasks]
        asked = [math_task.solver_task(t["problem"], f"gen-{i}") if ok else None
                 for i, (t, ok) in enumerate(zip(tasks, gate))]
        oracles = [solvers.Solver(c.oracles[n], tok, c, c.seed, f"config.oracles.{n}")
                   for n in "ab"]
        labels = solvers.oracle_labels(oracles, asked, c.oracles.attempts, c.seed)
        solver_tasks = [math_task.solver_task(a["problem"], a["id"], lab.reference)
                        if lab is not None and lab.status == "agreed" else None
                        for a, lab in zip(asked, labels)]
        topics = [math_task.topic(t["problem"]) for t, ok in zip(tasks, gate) if ok]
        out["gate_rate"] = float(np.mean(gate))  # W alone, before the oracles
        out["oracles"] = {"a": oracles[0].report(), "b": oracles[1].report(),
                          **{s: sum(lab is not None and lab.status == s for lab in labels)
                             for s in math_oracle.STATUSES}}
    else:
        tasks = [induction_task.parse_generated_task(t) for t in texts]
        gate = [bool(induction_task.check_task(t, protocol).passed) for t in tasks]
        solver_tasks = [induction_task.solver_task(t, protocol, f"gen-{i}") if ok else None
                        for i, (t, ok) in enumerate(zip(tasks, gate))]
        topics = [topic(t["program"]) for t in tasks if t]
    valid = [t is not None for t in solver_tasks]
    solved = [sum(bool(x) for x in row)
              for row in solvers.trials(solver, solver_tasks, c.k, c.seed)]
    return {**out, "utility_rate": utility_rate(solved, valid, c.k, c.lo, c.hi),
            "validity_rate": float(np.mean(valid)), "self_bleu3": self_bleu(texts),
            "distinct3": distinct_n(texts), "top_topic_rate": top_topic_rate(topics),
            "solver": solver.report(), "solve_counts": solved}


def evaluate_policy(c) -> dict:
    from rossjax.train.rl import rollout
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
    path = os.path.join(c.workdir, "eval_generator.json")
    if os.path.isfile(path):  # an earlier run's result must not pass for this one's if it stops
        os.remove(path)
    out = evaluate_generator(c) if c.mode == "generator" else evaluate_policy(c)
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(path + ".tmp", path)  # whole or not at all
    return out
