"""PROPEL's rewards as a GRPO run builds them (grpo_setup.Run calls in here): the probe reward on a
frozen reference model, and the solver-in-the-loop (SIL) baseline that pays realized utility.

Probe reward. The reference is the policy's base (with LoRA: adapters off) unless
`reward.probe.reference` names a model of its own (a folder or a preset, any family and width):
cold transfer. Then each candidate's task text is rendered with the reference's chat template,
tokenized with the reference's tokenizer and run through the reference, so the probe reads the
activations it was swept on whatever the policy's tokenizer is. Every probe's manifest names the
reference it was trained on (probes/sweep.py) and another one is refused
(`reward.check_reference`).

SIL (`reward.functions=("solver",)`, configs/propel_sil.py): every candidate that passes the
validity check W is posed to the solver (rossjax/train/propel/solvers.py `Solver`, `trials`) K times (an
induction task under the AZR protocol; a math problem once the two reference oracles agree on its
answer, as label-corpus labels it) and paid the realized U_S = 1[lo <= solved / decided <= hi]
(band "open": 0 < rate < 1), the label `rossjax label-corpus` + `probe-sweep` give a task; an invalid task,
or one whose reference run fails, gets `invalid_reward`; a valid task with fewer than
`min_valid` decided trials gets NaN (advantage 0). SWE (configs/propel_swe.py:sil, validity
"env"): `SweSolverReward` runs K bash solver episodes over each valid bug instead
(agents.swe.solver_trials). Trials and tasks tried are counted per step,
with the process's peak memory (`memory_metrics`), for PROPEL's cost comparison (Table 3).
"""

from __future__ import annotations

import dataclasses
import os
import resource

import numpy as np

from rossjax.errors import ConfigError
from rossjax.probes import labels as labels_mod, reward as reward_lib
from rossjax.verify import induction_task, math_task

SOLVER_FIELD = "config.reward.solver"
REFERENCE_FIELD = "config.reward.probe.reference"


def render_fn(cfg, tok, template: str):
    """What the probe reads for a candidate (must match how its training rows were rendered):
    `task`, the canonical task text as a user turn up to the answer (label-corpus's inputs.jsonl),
    or `record`, the policy's own token ids."""
    if cfg.reward.probe.render not in ("task", "record"):
        raise ConfigError(f"config.reward.probe.render {cfg.reward.probe.render!r} is not task or record.")
    from rossjax.train.rl import rollout

    def render(rec):
        msgs = [{"role": "user", "content": canonical_text(rec)}]
        return tok.encode(rollout.render_prompt(msgs, template, tok)), None
    if cfg.reward.probe.render == "task":
        return render
    # record: the stored ids, with the assistant turns' spans for a probe over turns; a row with
    # no ids (the bootstrap probe's templated text rows) is rendered as a task
    return lambda rec: ((rec["token_ids"], agent_turn_spans(rec))
                        if rec.get("token_ids") is not None else render(rec))


def agent_turn_spans(rec) -> list | None:
    """[(start, end)] token spans of an agentic row's assistant turns (its `agent.
    message_spans`: one per generated turn; probes/turns.py aggregates over them), else None."""
    agent = rec.get("agent") or {}
    msgs = rec["messages"]
    out = [(int(t0), int(t1)) for i, t0, t1 in agent.get("message_spans") or []
           if msgs[i].get("role") == "assistant" and t1 > t0]
    # no span map (the ids do not spell the rendering): the runs of sampled tokens, one a turn
    return out or [tuple(s) for s in agent.get("policy_spans") or []] or None


def is_math(rec) -> bool:
    return str((rec.get("task") or {}).get("domain", "")).startswith("math")


def canonical_text(rec) -> str:
    """A candidate's task in the canonical form label-corpus stores for the probe (induction: the
    ```python / ```inputs / ```message blocks; math: the ```problem block), else its raw text."""
    content = rec["messages"][-1].get("content") or " "
    if is_math(rec):
        problem = math_task.parse_generated_problem(content)
        return math_task.task_text(problem) if problem else content
    task = induction_task.parse_generated_task(content)
    return induction_task.task_text(task) if task else content


def own_reference(cfg) -> bool:
    """True when `reward.probe.reference` names a model other than the policy's base."""
    ref = cfg.reward.probe.get("reference")
    return ref is not None and bool(ref.get("path") or ref.get("preset"))


def _reference_tokenizer(ref, workdir: str):
    from rossjax.tokenizers import load_tokenizer
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    spec = ref.get("tokenizer") or ref.get("path")
    if not spec:
        raise ConfigError(f"{REFERENCE_FIELD}.tokenizer is empty and the reference is a preset; "
                          "give the tokenizer the probe's activations were extracted with.")
    if spec == "ascii":
        spec = write_ascii_tokenizer(os.path.join(workdir, "reference_tokenizer"))
    try:
        return load_tokenizer(spec)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{REFERENCE_FIELD}.tokenizer {spec!r} cannot be loaded ({e}); give "
                          "the reference model's tokenizer (a folder or tokenizer.json).") from None


def reference_model(run):
    """(ModelConfig, params, render, spec) of the model the probe reads: the policy's base, or
    the cold-transfer reference `reward.probe.reference` with its own tokenizer and template."""
    cfg = run.cfg
    if not own_reference(cfg):
        spec = cfg.model.path or f"preset:{cfg.model.preset}"
        return run.model_cfg, run.ref, render_fn(cfg, run.tok, cfg.template), spec
    from rossjax.models import loading

    ref = cfg.reward.probe.reference
    if cfg.reward.probe.render == "record":
        raise ConfigError(f"config.reward.probe.render is 'record' (the policy's token ids), which "
                          f"a reference with its own tokenizer ({REFERENCE_FIELD}) cannot read; "
                          "use render=task.")
    tok = _reference_tokenizer(ref, run.workdir)
    section = {"path": ref.get("path", ""), "preset": ref.get("preset", ""),
               "dtype": ref.get("dtype", "float32"), "param_dtype": ref.get("dtype", "float32")}
    # a preset keeps its own vocabulary, as `rossjax extract --config.model=preset:NAME` built it
    model_cfg, params = loading.load_model(section, seed=int(ref.get("seed", 0)),
                                           field=REFERENCE_FIELD)
    if tok.vocab_size > model_cfg.vocab_size:
        raise ConfigError(f"{REFERENCE_FIELD}.tokenizer has {tok.vocab_size} tokens but the "
                          f"reference model only {model_cfg.vocab_size}; give the reference's own "
                          "tokenizer.")
    spec = section["path"] or f"preset:{section['preset']}"
    return model_cfg, params, render_fn(cfg, tok, ref.get("template") or cfg.template), spec


def probe_reward(run):
    """(ProbeReward, banner lines) for the run's `reward.probe` section."""
    p, cfg = run.cfg.reward.probe, run.cfg
    model_cfg, params, render, spec = reference_model(run)
    field = REFERENCE_FIELD if own_reference(cfg) else "config.reward.probe (reference: config.model)"
    as_dict = dataclasses.asdict(model_cfg)
    calibration = p.get("calibration", "auto")

    def load(path):
        scorer = reward_lib.ProbeScorer.load(path, calibration)
        reward_lib.check_reference(path, scorer.manifest, spec, as_dict, field)
        return scorer

    paths = [x for x in [p.path, *p.ensemble.split(",")] if x]
    scorers = [reward_lib.bootstrap_validity_probe(model_cfg, params, render, seed=cfg.train.seed)
               if x == "bootstrap" else load(x) for x in paths]
    for sc in scorers:  # the bootstrap probe has no manifest calibration of its own
        sc.calibrated = reward_lib.calibrated_for(sc.manifest.get("domain"), calibration)
    aux = load(p.auxiliary) if p.auxiliary else None
    # the policy's base lives on the run's mesh: the reference pass runs there (rows split);
    # a reference of its own is loaded onto one device
    pr = reward_lib.ProbeReward(model_cfg, params, scorers, render, auxiliary=aux,
                                partitioner=None if own_reference(cfg) else run.part)
    named = list(zip(paths, scorers)) + ([(p.auxiliary + " (auxiliary)", aux)] if aux else [])
    names = [f"{x} ({sc.probe.head}, layer {sc.layer}, {sc.pooling} pooling, "
             f"{'calibrated' if sc.calibrated else 'raw'} scores)" for x, sc in named]
    if own_reference(cfg):
        names.append(f"read from the reference {spec} ({model_cfg.model_type}, d_model "
                     f"{model_cfg.d_model}), not the policy")
    return pr, names


def check_config(r) -> None:
    """One sentence for a bad probe calibration, cold-transfer reference or SIL section
    (grpo_config.check_config calls this before a model loads)."""
    if "probe" in r.functions:
        p = r.probe
        reward_lib.calibrated_for(None, p.get("calibration", "auto"))
        ref = p.get("reference")
        if ref is not None and ref.get("path") and not os.path.isdir(ref.path):
            raise ConfigError(f"{REFERENCE_FIELD}.path {ref.path!r} is not a model folder.")
        if ref is not None and ref.get("path") and ref.get("preset"):
            raise ConfigError(f"{REFERENCE_FIELD}: give path or preset, not both.")
    if "solver" in r.functions:
        check_solver_config(r)


# ----------------------------------------------------------------------------- SIL


VALIDITY = {"validity": "induction", "math_validity": "math",  # W -> the task the solver gets
            "env": "swe"}  # agentic: the SWE generator env's verdict (configs/propel_swe.py)
SWE_SOLVER_KINDS = ("fn", "endpoint")  # an agent policy: module:function or OpenAI-compatible


def check_solver_config(r) -> None:
    """One sentence for a bad `reward.solver` section, before a model loads."""
    from rossjax.train.propel import solvers

    s = r.get("solver")
    if s is None:
        raise ConfigError(f"config.reward.functions lists 'solver' but the config has no "
                          f"{SOLVER_FIELD} section; start from configs/propel_sil.py.")
    solvers.check_section(s, SOLVER_FIELD)
    if VALIDITY.get(s.validity) == "swe" and s.kind not in SWE_SOLVER_KINDS:
        raise ConfigError(f"{SOLVER_FIELD}.kind {s.kind!r}: an SWE solver is an agent policy "
                          f"in the bash env, one of {', '.join(SWE_SOLVER_KINDS)} (fn: a "
                          "module:function policy(messages, tools) -> {content, tool_calls}).")
    if s.k < 1:
        raise ConfigError(f"{SOLVER_FIELD}.k is {s.k}; it must be at least 1.")
    if VALIDITY.get(s.validity) == "swe":
        from rossjax.agents.swe import MAX_WORKERS

        w = s.get("workers", 1)
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_WORKERS:
            raise ConfigError(f"{SOLVER_FIELD}.workers is {w!r}; it must be an integer from 1 to "
                              f"{MAX_WORKERS} (solver episodes run at once; 1: one after another).")
    if s.validity not in VALIDITY:
        raise ConfigError(f"{SOLVER_FIELD}.validity {s.validity!r} is not one of "
                          f"{', '.join(VALIDITY)}: the solver-in-the-loop reward poses induction "
                          "tasks or math problems.")
    if VALIDITY[s.validity] == "math":
        if s.get("oracles") is None:
            raise ConfigError(f"{SOLVER_FIELD}.validity is math_validity but {SOLVER_FIELD} has no "
                              "oracles section (the two reference oracles); start from "
                              "configs/propel_sil.py:math.")
        solvers.check_oracles(s.oracles, f"{SOLVER_FIELD}.oracles")
        if s.oracles.attempts < 1:
            raise ConfigError(f"{SOLVER_FIELD}.oracles.attempts is {s.oracles.attempts}; it must "
                              "be at least 1.")
    labels_mod.utility_labels([], lo=s.lo, hi=s.hi, band=s.band, where=SOLVER_FIELD)


class SolverReward:
    """K live solver trials per valid candidate, paid the realized U_S (see the module doc).

    `solver` (and, for math, the two `oracles`): anything with `answers(tasks, k, seed)` (a
    `solvers.Solver`). Math problems get their reference from the strict two-oracle policy
    first (label-corpus's: all answers agree under math-verify, else invalid). `counts()`
    returns and resets the trials and tasks since the last call."""

    def __init__(self, section, solver, *, oracles=None, seed: int = 0):
        self.s, self.solver, self.oracles, self.seed = section, solver, oracles, int(seed)
        self.math = VALIDITY.get(section.validity) == "math"
        if self.math and not oracles:
            raise ConfigError(f"{SOLVER_FIELD}: math problems need the two reference oracles.")
        self.calls, self.last_trials = 0, []
        self._counts = dict.fromkeys(("solver_trials", "solver_tasks", "oracle_trials"), 0)

    def _induction_tasks(self, records, valid):
        tasks = [None] * len(records)
        for i, rec in enumerate(records):
            if valid[i] > 0.5:
                task = induction_task.parse_generated_task(rec["messages"][-1].get("content") or "")
                protocol = induction_task.protocol_from((rec.get("task") or {}).get("protocol"))
                # None when f fails on its own inputs: label-corpus calls that invalid too
                tasks[i] = induction_task.solver_task(task, protocol, rec["id"])
        return tasks

    def _math_tasks(self, records, valid, seed):
        from rossjax.train.propel import solvers

        problems = [math_task.parse_generated_problem(r["messages"][-1].get("content") or "")
                    if v > 0.5 else None for r, v in zip(records, valid)]
        asked = [math_task.solver_task(p["problem"], r["id"]) if p else None
                 for r, p in zip(records, problems)]
        attempts = self.s.oracles.attempts
        labels = solvers.oracle_labels(self.oracles, asked, attempts, seed,
                                       self.s.get("batch_tasks", 64))
        self._counts["oracle_trials"] += attempts * len(self.oracles) * sum(a is not None for a in asked)
        return [math_task.solver_task(p["problem"], r["id"], lab.reference)
                if lab is not None and lab.status == "agreed" else None
                for r, p, lab in zip(records, problems, labels)]

    def __call__(self, records, valid) -> dict:
        from rossjax.train.propel import solvers

        s, n = self.s, len(records)
        valid = np.ones(n) if valid is None else np.asarray(valid)
        self.calls += 1
        seed = self.seed * 1_000_003 + self.calls
        tasks = (self._math_tasks(records, valid, seed) if self.math
                 else self._induction_tasks(records, valid))
        trials = solvers.trials(self.solver, tasks, s.k, seed, s.get("batch_tasks", 64))
        reward = np.full(n, float(s.invalid_reward))
        for i, tr in enumerate(trials):
            if tasks[i] is not None:
                lab = labels_mod.utility_labels([tr], lo=s.lo, hi=s.hi, band=s.band,
                                                min_valid=s.min_valid, where=SOLVER_FIELD)
                reward[i] = float(lab.y[0]) if len(lab.y) else np.nan  # too few decided trials
        self.last_trials = trials
        self._counts["solver_trials"] += sum(len(t) for t in trials)
        self._counts["solver_tasks"] += sum(t is not None for t in tasks)
        return {"solver": reward}

    def counts(self) -> dict:
        out = dict(self._counts)
        if not self.math:
            out.pop("oracle_trials")
        self._counts = dict.fromkeys(self._counts, 0)
        return out


class SweSolverReward:
    """SWE SIL: K solver episodes of the agent layer (agents.swe.solver_trials: the bash env over
    the buggy repository, graded by the clean suite) per candidate whose generator episode the
    env passed, paid U_S (band "open" for K = 3: 0 < solved < K); a failed episode gets
    `invalid_reward`, an undecided one (NaN verdict) or one with fewer than `min_valid` judged
    trials NaN (advantage 0). All candidates' episodes run `section.workers` (default 1) at a
    time (agents.swe.solver_trials_many)."""

    math = False

    def __init__(self, section, policy, *, style: str = "hermes", max_turns: int = 8,
                 step_timeout_s: float = 10.0, episode_timeout_s: float = 120.0):
        self.s, self.policy, self.style, self.max_turns = section, policy, style, int(max_turns)
        self.env_kw = {"step_timeout_s": step_timeout_s, "episode_timeout_s": episode_timeout_s}
        self.last_trials = []
        self._counts = dict.fromkeys(("solver_trials", "solver_tasks"), 0)

    def __call__(self, records, valid) -> dict:
        from rossjax.agents.swe import solver_trials_many
        from rossjax.agents.swe_env import clean_baseline

        s, n = self.s, len(records)
        valid = np.ones(n) if valid is None else np.asarray(valid, np.float64)
        reward = np.where(np.isnan(valid), np.nan, float(s.invalid_reward))
        self.last_trials = [None] * n
        tried = [i for i in range(n) if valid[i] > 0.5]
        for i in tried:
            if not records[i].get("patch"):
                raise ValueError(f"SWE SIL: record {records[i].get('id')!r} passed the env's "
                                 "verdict but carries no patch (the env must be "
                                 "agents.swe_env.SweBugEnv).")
        # every candidate's K episodes in one pool of reward.solver.workers threads
        jobs = [(clean_baseline(records[i]["task"]["repo"]), records[i]["patch"], records[i]["id"])
                for i in tried]
        got = solver_trials_many(jobs, self.policy, k=s.k, workers=s.get("workers", 1),
                                 style=self.style, max_turns=self.max_turns, env=self.env_kw)
        for i, (trials, _) in zip(tried, got):
            lab = labels_mod.utility_labels([trials], lo=s.lo, hi=s.hi, band=s.band,
                                            min_valid=s.min_valid, where=SOLVER_FIELD)
            reward[i] = float(lab.y[0]) if len(lab.y) else np.nan
            self.last_trials[i] = trials
            self._counts["solver_trials"] += len(trials)
            self._counts["solver_tasks"] += 1
        return {"solver": reward}

    def counts(self) -> dict:
        out, self._counts = dict(self._counts), dict.fromkeys(self._counts, 0)
        return out


def swe_solver_reward(cfg) -> SweSolverReward:
    from rossjax.agents.rollout import OpenAIPolicy
    from rossjax.train.propel import solvers
    from rossjax.verify.base import load_fn

    s = cfg.reward.solver
    if s.kind == "fn":
        policy = load_fn(s.fn, f"{SOLVER_FIELD}.fn")
    else:
        ep = s.endpoint
        policy = OpenAIPolicy(ep.base_url or os.environ.get("OPENAI_BASE_URL",
                                                            "http://127.0.0.1:8000/v1"),
                              ep.model, api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"),
                              temperature=float(s.temperature),
                              max_tokens=int(s.max_new_tokens),
                              **solvers.endpoint_filters(s))  # PROPEL's top_p / top_k
    a = cfg.agent
    return SweSolverReward(s, policy, style=a.style, max_turns=a.max_turns,
                           step_timeout_s=a.step_timeout_s, episode_timeout_s=a.episode_timeout_s)


def solver_reward(run):
    """The run's SolverReward, or None unless `reward.functions` lists "solver"."""
    cfg = run.cfg
    if "solver" not in cfg.reward.functions:
        return None
    from rossjax.train.propel import solvers

    s = cfg.reward.solver
    check_solver_config(cfg.reward)
    if VALIDITY[s.validity] == "swe":
        return swe_solver_reward(cfg)
    # the solver reads the policy's tokenizer and template (a model solver samples through it)
    solver = solvers.Solver(s, run.tok, s, cfg.train.seed, field=SOLVER_FIELD)
    oracles = None
    if VALIDITY[s.validity] == "math":
        oracles = [solvers.Solver(s.oracles[n], run.tok, s, cfg.train.seed,
                                  f"{SOLVER_FIELD}.oracles.{n}") for n in "ab"]
    return SolverReward(s, solver, oracles=oracles, seed=cfg.train.seed)


def memory_metrics() -> dict:
    """Peak resident memory of this process and of its largest child (sandboxed runs), MiB,
    and the accelerators' peak bytes in use where the backend reports it (not on CPU)."""
    import jax

    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "peak_rss_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
    peaks = []
    for d in jax.local_devices():
        try:
            stats = d.memory_stats()
        except Exception:  # noqa: BLE001 (a backend without the call)
            stats = None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(stats["peak_bytes_in_use"])
    if peaks:
        out["peak_device_mb"] = max(peaks) / 2**20
    return out
