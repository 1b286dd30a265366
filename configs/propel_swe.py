"""PROPEL's SWE generator: a multi-turn bash agent that writes bugs, trained with agentic GRPO.

Run:
  rossjax grpo --config=configs/propel_swe.py --config.model.path=HF_GENERATOR_DIR \
      --config.reward.probe.path=SELECTED_PROBE --workdir=runs/propel_swe
  rossjax grpo --config=configs/propel_swe.py:sil --config.model.path=HF_GENERATOR_DIR \
      --config.reward.solver.endpoint.model=SOLVER --workdir=runs/propel_swe_sil
  rossjax grpo --config=configs/propel_swe.py:runlocal --workdir=/tmp/propel-swe
  rossjax label-corpus --config=configs/propel_swe.py:label --config.pool=BUGS.jsonl \
      --config.solver.endpoint.model=SOLVER --config.reference=HF_GENERATOR_DIR \
      --workdir=runs/propel_swe_labels      # prints the extract and probe-sweep steps
  rossjax swe-repos --candidates=FOLDER --workdir=runs/swe_repos   # the 4-stage repo filter
  rossjax swe-pool --config=configs/propel_swe.py:pool --config.generator.path=HF_GENERATOR_DIR \
      --workdir=runs/swe_pool     # the base generator's bug pool; prints the label-corpus step
  rossjax swe-pool --config=configs/propel_swe.py:pool,runlocal --workdir=/tmp/swe-pool
  rossjax swe-eval --config=configs/propel_swe.py:eval --config.generator.path=HF_GENERATOR_DIR \
      --config.solver.endpoint.model=SOLVER --workdir=runs/swe_eval   # held-out evaluation
  rossjax swe-eval --config=configs/propel_swe.py:eval,runlocal --workdir=/tmp/swe-eval

Task: one per repository of the RL split (data/swe/rl_tasks.jsonl, written by
rossjax.agents.swe_env.rl_tasks from agents.swe.repo_splits over data/swe/: whole repositories
per probe / RL / eval split, so the probe never saw the RL repositories). An episode is the
`bash` env over a scratch copy of the clean repository (rossjax/agents/swe_env.py SweBugEnv):
the policy runs commands until it answers without a tool call; its final copy, diffed against
the clean tree, is the bug, judged by rossjax.verify.swe.verify_bug (the patch applies, tests
and config unchanged, the suite still runs, >= 1 previously passing test fails). The patch is
kept in each history row (`patch`).

Reward (reward.functions, one of):
  ("probe",)  an invalid episode (the verdict fails) -0.2; a valid one the probe's score,
              temperature-calibrated (`reward.probe.calibration=temperature`, as PROPEL for
              SWE), of the frozen reference's activations over the episode's agent turns
              (`render=record`: the exact stored ids; one span per generated turn), pooled per
              turn and aggregated over turns as the probe's manifest says (`turn_pooling`
              mean / last / max in one pass, attention through rossjax/probes/turns.py);
              an undecided verdict (the sandbox failed) NaN, advantage 0.
  ("solver",) `:sil`: the realized U_S of K = 3 solver episodes of the same agent layer over
              the buggy repository (agents.swe.solver_trials; graded by the clean suite), band
              open (0 < solved < 3), invalid -0.2 (train/propel/rewards.py SweSolverReward).
              The step's candidates' K episodes run `reward.solver.workers` (2) at a time, in
              threads (agents.swe.solver_trials_many): each has its own scratch copy, results
              come back in trial order; 1 runs them one after another.
Sizes, the paper's: 30 GRPO steps of 256 episodes (32 contexts x group 8), up to 35 turns in a
32,768-token trajectory budget; the solver samples at T 0.6, top_p 0.95, top_k 20.
Optimization: DAPO-style: group-normalized advantages (`advantages=grpo`), token-level
aggregation, clip-higher (eps_high 0.28), dynamic sampling (uniform groups dropped and refilled),
and the soft overlong penalty on the trajectory's length (context included) against its budget
agent.max_tokens with `grpo.overlong_buffer` tokens of slack (docs/deviations.md).

`:runlocal` (tiny random Qwen2, ASCII tokenizer, 1 task x 4 episodes of up to 3 turns, 2 steps,
the bootstrap validity probe as a stand-in): mechanics only. The random model writes no tool
call, so every episode ends at turn 1 with an unchanged tree: invalid (`no_change`), reward
-0.2, every group uniform (dynamic sampling refills once, then fills). tests/test_propel_swe.py
plants a valid bug-writing episode with a scripted parser to exercise the valid path.
"""

from rossjax.configs import common, grpo_agentic, propel_sil


def get_config(arg: str | None = None):
    variants = common.variants(arg, ("runlocal", "sil", "label", "repos", "pool", "eval"),
                               "propel_swe.py")
    if "eval" in variants:
        return eval_config("runlocal" in variants)
    if "pool" in variants:
        return pool_config("runlocal" in variants)
    if "label" in variants:
        return label_config("runlocal" in variants)
    if "repos" in variants:
        return repos_config()
    c = grpo_agentic.get_config("runlocal" if "runlocal" in variants else None)
    c.run_name = "propel-swe-sil" if "sil" in variants else "propel-swe"
    c.data.tasks = common.data_file("swe", "rl_tasks.jsonl")
    c.agent.env = "rossjax.agents.swe_env:SweBugEnv"
    c.agent.env_kwargs = '{"suite_timeout_s": 30.0}'
    # App. 18's turn format: a THOUGHT, then exactly one ```bash block (none: the answer)
    c.agent.style = "rossjax.agents.swe_tools:bash_block"
    # PROPEL's SWE RL: 30 steps of 256 episodes, up to 35 turns in a 32k-token context
    c.agent.max_turns = 35
    c.agent.max_tokens = 32768
    c.agent.step_timeout_s = 30.0
    c.agent.episode_timeout_s = 600.0
    c.reward.functions, c.reward.weights = ("probe",), (1.0,)
    p = c.reward.probe
    p.path, p.validity, p.gate, p.invalid_reward = "", "env", "hard_gate", -0.2
    p.render, p.calibration = "record", "temperature"
    g = c.grpo
    g.steps = 30
    g.contexts, g.group_size, g.max_new_tokens = 32, 8, 1024  # 32 x 8 = the paper's 256 episodes
    g.advantages, g.agg, g.eps_low, g.eps_high = "grpo", "token_mean", 0.2, 0.28
    g.dynamic_sampling, g.async_sampling, g.max_refill_rounds = True, False, 3
    g.overlong_buffer, g.overlong_penalty = 4096, 1.0
    if "sil" in variants:
        c.reward.functions = ("solver",)
        s = c.reward.solver = propel_sil.solver_section()
        s.kind, s.k, s.band, s.min_valid = "endpoint", 3, "open", 2
        s.validity, s.invalid_reward = "env", -0.2
        s.workers = 2  # solver episodes at once (1: one after another), all candidates' together
    if "runlocal" in variants:
        c.grpo.steps, c.grpo.contexts, c.grpo.group_size = 2, 1, 4
        g.max_new_tokens, g.max_refill_rounds, g.overlong_buffer = 24, 1, 256
        c.agent.max_turns, c.agent.max_tokens = 3, 4096  # the App. 18 prompt: ~3k ASCII tokens
        c.agent.step_timeout_s, c.agent.episode_timeout_s = 20.0, 120.0
        p.path = "bootstrap"  # no SWE probe for the random model: a stand-in (module doc)
        if "sil" in variants:
            s.kind, s.fn = "fn", "rossjax.configs.propel_swe:idle_solver"
    return c


def label_config(runlocal: bool = False):
    """`:label`: `rossjax label-corpus` over a pool of generated bugs (rossjax/agents/swe_label.py):
    K = 3 solver episodes per valid bug, kept with >= 2 judged trials, utility 1 iff the solve
    rate is in (0, 1). The solver is an agent policy: an endpoint (`solver.endpoint.model`, the
    paper's T 0.6 / top_p 0.95 / top_k 20 sent in the request) or `solver.kind=fn`.
    `:label,runlocal`: the reverting stand-in (NOT a solver: it is handed each bug's patch and
    reverts it on a seeded coin, so the band and the drop rule run without a model), the ASCII
    tokenizer, the tiny random reference for the printed extract step and, unless
    --config.pool says otherwise, data/swe/sample_bugs.jsonl (10 hand-written bugs over the 5
    shipped repositories, 2 of them invalid: no test catches them)."""
    import ml_collections

    from rossjax.configs import label_corpus

    c = label_corpus.get_config()
    c.domain, c.k, c.min_valid = "swe", 3, 2
    c.lo, c.hi = 1 / 3, 2 / 3  # report.json only; the SWE utility is the open band (0, 1)
    c.solver = label_corpus.solver_config("endpoint")
    c.reference = ""         # the generator's frozen reference model (extract reads it)
    c.layers = (8, 16, 24)   # printed into the extract step
    c.turn_pooling = "mean"  # over turns, in the extract step
    c.swe = ml_collections.ConfigDict(dict(
        suite_timeout_s=30.0, max_turns=35, step_timeout_s=30.0, episode_timeout_s=600.0,
        workers=2, style="hermes"))  # style: how a text-only reply's tool calls are read
    if runlocal:
        c.pool = common.data_file("swe", "sample_bugs.jsonl")  # 10 hand-written bugs, 2 invalid
        c.tokenizer = "ascii"
        c.reference = "preset:" + common.TINY_PRESET
        c.layers = (1, 2)
        c.solver.kind, c.solver.fn = "fn", "rossjax.agents.swe_label:REVERTING_STANDIN"
        c.swe.max_turns, c.swe.workers = 3, 1
        c.swe.step_timeout_s, c.swe.episode_timeout_s = 20.0, 120.0
    return c


def generator_section(rl=None):
    """The base generator of a bug pool or an evaluation (rossjax/train/propel/swe_pool.py): kind
    model (an HF folder `path` or a `preset`, on the rollout engine), endpoint or fn; its sampling
    is the SWE RL run's (`rl`, this file's full config)."""
    import ml_collections

    from rossjax.configs import label_corpus

    g = (rl or get_config()).grpo
    ep = label_corpus.solver_config("endpoint").endpoint
    ep.temperature, ep.top_p, ep.top_k = g.temperature, g.top_p, g.top_k
    ep.max_tokens = g.max_new_tokens
    return ml_collections.ConfigDict(dict(
        kind="model", path="", preset="", fn="",
        style="hermes",  # endpoint / fn: how a text reply's calls are read (HTTP driver)
        workers=2,       # endpoint / fn: episodes at once (threads; a policy must be thread-safe)
        temperature=g.temperature, top_p=g.top_p, top_k=g.top_k, endpoint=ep))


def episode_section(rl=None):
    """A generator episode's budgets, the SWE RL run's (`rl`): turns, context and turn tokens,
    step and episode limits, the suite's timeout, the App. 18 turn format."""
    import ml_collections

    rl = rl or get_config()
    return ml_collections.ConfigDict(dict(
        style=rl.agent.style, max_turns=rl.agent.max_turns, max_tokens=rl.agent.max_tokens,
        max_new_tokens=rl.grpo.max_new_tokens, step_timeout_s=rl.agent.step_timeout_s,
        episode_timeout_s=rl.agent.episode_timeout_s, suite_timeout_s=30.0))


def runlocal_generator(c) -> None:
    """`:runlocal`'s generator: the mutation stand-in (NOT a model), short episodes, ASCII ids."""
    c.generator.kind, c.generator.fn = "fn", "rossjax.agents.swe_pool:MUTATION_STANDIN"
    c.generator.preset = common.TINY_PRESET  # for --config.generator.kind=model
    c.generator.workers = 1
    a = c.agent if "agent" in c else c.swe.agent
    a.max_turns, a.max_tokens, a.max_new_tokens = 3, 4096, 24
    a.step_timeout_s, a.episode_timeout_s = 20.0, 120.0
    c.tokenizer = "ascii"


def pool_config(runlocal: bool = False):
    """`:pool`, `rossjax swe-pool`: the base generator's episodes over each repository of a split
    (`episodes_per_repo` each; the paper's turn, context, turn-token and sampling settings as the
    RL run's), each final diff verified (verify_bug); pool.jsonl holds the verified bugs with
    their token ids and per-turn spans, report.json the invalid ones with reasons.
    `:pool,runlocal`: the mutation stand-in generator (NOT a model: seeded single-token
    mutations written in App. 18's format), 3 episodes per probe-split repository, ASCII ids;
    `--config.generator.kind=model` runs the tiny random preset on the engine instead (it writes
    no command: every episode `no_change`)."""
    import ml_collections

    c = ml_collections.ConfigDict()
    c.workdir = ""
    c.output = ""                  # default: WORKDIR/swe_pool
    c.split = "probe"              # the shipped repositories of this split (agents.swe) ...
    c.repos = ()                   # ... unless named here (folders or shipped names)
    c.episodes_per_repo = 16       # generator episodes per repository
    c.seed = 0
    c.tokenizer = ""               # the pool's ids ("": generator.path's, else qwen)
    c.template = "chatml"
    c.generator = generator_section()
    c.agent = episode_section()
    c.reference = ""               # the probe's frozen reference ("": the generator model)
    c.next_solver = ""             # the solver endpoint's model, printed into the next step
    c.runlocal = runlocal          # the next step is label-corpus's :label,runlocal
    c.sandbox = common.sandbox_config()
    if runlocal:
        runlocal_generator(c)
        c.episodes_per_repo = 3
        c.reference = "preset:" + common.TINY_PRESET
    return c


def eval_config(runlocal: bool = False):
    """`:eval`, `rossjax swe-eval`: the held-out evaluation (rossjax/train/propel/swe_eval.py):
    `bugs_per_repo` bugs of the generator on each eval-split repository (the pool's episodes),
    K = 3 solver episodes per verified bug (as `:label`: kept with >= 2 judged trials, in band
    iff 0 < solve rate < 1); realized utility, validity, top-edited-file rate, Self-BLEU-3,
    Distinct-3, top-topic rate. `:eval,runlocal`: the mutation stand-in generator and the
    reverting stand-in solver (neither is a model: mechanics only), 4 bugs of textkit."""
    c = pool_config(runlocal)
    del c.episodes_per_repo, c.reference, c.next_solver, c.runlocal
    c.split = "eval"
    c.bugs_per_repo = 16           # generated bugs per held-out repository
    lab = label_config(runlocal)
    c.k, c.min_valid, c.solver, c.swe = lab.k, lab.min_valid, lab.solver, lab.swe
    if runlocal:
        c.bugs_per_repo = 4
    return c


def repos_config():
    """`:repos`, `rossjax swe-repos --candidates=FOLDER`'s settings: the four-stage repository
    filter (rossjax/agents/swe_repos.py) and the splits of what it keeps."""
    import ml_collections

    c = ml_collections.ConfigDict()
    c.workdir = ""
    c.output = ""                     # default: WORKDIR/swe_repos (./swe_repos without one)
    c.repos = ml_collections.ConfigDict(dict(
        exclude=(),                   # 1. names dropped outright (e.g. your held-out eval repos)
        max_files=200, max_kb=2048,   # 1. size caps (files, KB of text)
        suite_timeout_s=30.0,         # 2. the clean suite must pass whole within this
        min_tests_per_entity=1.0,     # 3. tests / (functions + classes + methods)
        max_repos=0,                  # 3. keep the best N by tests per entity (0: all)
        yield_trials=4, min_yield=0.25, seed=0))  # 4. the mutation stand-in's bug yield
    c.fractions = (0.6, 0.2, 0.2)     # probe / RL / eval repo split of the kept (agents.swe)
    c.split_seed = 0
    c.sandbox = common.sandbox_config()  # preflight and yield run the candidates' suites
    return c


def idle_solver(messages, tools):
    """`:runlocal,sil`'s solver policy: answers at once (no fix), so a trial fails; a stand-in
    so the SIL mechanics run without a model, not a solver."""
    return {"content": "done", "tool_calls": []}
