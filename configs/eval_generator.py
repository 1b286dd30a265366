"""Evaluate a PROPEL task generator (utility, validity, Self-BLEU-3, Distinct-3, top-topic rate)
or a policy (pass@k, coverage).

Run:
  rossjax eval-generator --config=configs/eval_generator.py --config.generator.path=GEN_DIR \
      --config.solver.kind=model --config.solver.path=SOLVER_DIR --workdir=runs/eval
  rossjax eval-generator --config=configs/eval_generator.py --config.mode=policy \
      --config.solver.path=POLICY_DIR --config.tasks=tasks.jsonl --workdir=runs/eval
  rossjax eval-generator --config=configs/eval_generator.py:runlocal --workdir=/tmp/evalgen
  rossjax eval-generator --config=configs/eval_generator.py:mixed_outcome \
      --config.solver.path=POLICY_DIR --config.tasks=tasks.jsonl --workdir=runs/mixed
    (the pre-RL mixed-outcome diagnostic: 64 prompts x 8 samples at T = 1; `outcomes` gives the
    shares of mixed, all-pass and all-fail prompts)

  rossjax eval-generator --config=configs/eval_generator.py --config.domain=math \
      --config.generator.path=GEN_DIR --config.solver.kind=endpoint \
      --config.solver.endpoint.model=SOLVER --config.oracles.a.kind=endpoint \
      --config.oracles.a.endpoint.model=ORACLE_A --config.oracles.b.kind=endpoint \
      --config.oracles.b.endpoint.model=ORACLE_B --workdir=runs/eval_math

SWE (bug writers on held-out repositories: realized utility, top-edited-file rate, Self-BLEU-3,
Distinct-3) is its own command: rossjax swe-eval --config=configs/propel_swe.py:eval
(rossjax/train/propel/swe_eval.py, which reuses this module's Self-BLEU and Distinct).

Needs: a generator checkpoint (HF folder) and a solver (rossjax/train/propel/solvers.py: `model`, a
checkpoint on the rollout engine; `endpoint`, an OpenAI-compatible server; `fn`,
module:function; or the programmatic `oracle` / `identity` / `lookup`); Math also needs the
two oracles (`oracles.a` / `oracles.b`, the same kinds; all 2 x 2 answers must agree). Policy
mode needs a task file or `gen:arith`. Induction tasks follow the AZR protocol (10 inputs and a
message; the solver sees 5 pairs and is scored on the 5 hidden inputs). Generator contexts as
the paper gives them (`math.context` / `induction.context` = paper): two example problems drawn
per task from `math.examples` (""= data/propel/math_examples.jsonl); AZR's seed function, two
reference tasks from `induction.examples` (""= data/propel/azr_examples.jsonl) and the banned
imports; `instruction` is the one fixed instruction.
Writes WORKDIR/eval_generator.json. Time: `:runlocal` (random tiny model, 16 tasks, oracle
solver, K = 8) ~30 s on this CPU; 512 tasks x K = 8 with a 1.5B solver is a TPU job
(estimated, not measured: minutes).
"""

import ml_collections

from rossjax.configs import common
from rossjax.configs.label_corpus import solver_config


def get_config(arg: str | None = None):
    variants = common.variants(arg, ("runlocal", "mixed_outcome"), "eval_generator.py")
    c = ml_collections.ConfigDict()
    c.workdir = ""
    c.mode = "generator"          # generator | policy
    c.tokenizer = "qwen"          # or "ascii" for tiny models from scratch
    c.domain = "induction"        # induction | math
    c.generator = ml_collections.ConfigDict(dict(path="", preset=""))
    # solver.kind: model | endpoint | fn | oracle | identity | lookup (shown pairs only: must
    # score 0); endpoint: solver.endpoint.base_url / model / ...
    c.solver = solver_config()
    # math: the two reference oracles, `attempts` answers each; all must agree
    c.oracles = ml_collections.ConfigDict(dict(a=solver_config(), b=solver_config(), attempts=2,
                                               allow_same=False))  # True: one model as both
    # AZR protocol: n_inputs per task, n_visible shown with outputs (+ the message), the rest
    # hidden and scored; split: first | seeded (shuffle keyed by the task id); the generator's
    # context: paper (seed function, n_examples reference tasks, banned imports) | instruction
    c.induction = ml_collections.ConfigDict(dict(n_inputs=10, n_visible=5, split="first",
                                                 context="paper", examples="", n_examples=2))
    # math generator context: n_examples example problems drawn per task from `examples`
    c.math = ml_collections.ConfigDict(dict(context="paper", examples="", n_examples=2))
    c.tasks = "gen:arith"         # policy mode: task file or generator
    c.num_tasks = 512
    c.k = 8                       # solver trials per task
    c.ks = (1, 4, 8)              # pass@k reported in policy mode
    c.lo, c.hi = 1 / 8, 3 / 8     # the learnable band for the utility rate
    c.max_new_tokens = 768
    c.temperature = 1.0
    c.workers = 2
    c.seed = 0
    if "mixed_outcome" in variants:   # the paper's pre-RL diagnostic
        c.mode, c.num_tasks, c.k, c.temperature = "policy", 64, 8, 1.0
        c.ks = (1, 8)
    if "runlocal" in variants:
        c.tokenizer = "ascii"
        c.generator.preset = common.TINY_PRESET
        c.solver.kind = "oracle"
        c.solver.preset = common.TINY_PRESET
        c.num_tasks = 16
        c.max_new_tokens = 48
        c.workers = 1
    c.sandbox = common.sandbox_config()
    return c
