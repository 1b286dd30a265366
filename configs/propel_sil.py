"""PROPEL's solver-in-the-loop (SIL) baseline on AZR induction: the generator policy is paid the
*realized* utility of each task, measured by running the solver on it during RL, instead of a
probe's prediction of it. The Table 3 comparison (SIL vs PROPEL) is this config against
configs/propel_azr.py (`:math` against configs/propel_math.py): same task, gate, GRPO, KL and
LoRA, only the reward differs.

Run:
  rossjax grpo --config=configs/propel_sil.py --config.model.path=HF_GENERATOR_DIR \
      --config.reward.solver.path=SOLVER_DIR --workdir=runs/propel_sil
  python -m rossjax.train.propel.warmup /tmp/propel-warm   # the warm-up generator (~1-3 min)
  rossjax grpo --config=configs/propel_sil.py:runlocal --config.model.path=/tmp/propel-warm/hf \
      --workdir=/tmp/propel-sil
  rossjax grpo --config=configs/propel_sil.py:math --config.model.path=HF_GENERATOR_DIR \
      --config.reward.solver.path=SOLVER_DIR --config.reward.solver.oracles.a.path=ORACLE_A \
      --config.reward.solver.oracles.b.path=ORACLE_B --workdir=runs/propel_sil_math

Reward (rossjax/train/propel/rewards.py `SolverReward`): each candidate that passes the validity
check W (`reward.solver.validity`, on the CPU workers) is posed to the solver under the AZR
protocol (5 shown pairs + the message, scored on the 5 hidden inputs) `reward.solver.k` = 8
times with rossjax/train/propel/solvers.py (`Solver`, `trials`: the kinds `rossjax label-corpus` uses)
(`:math`: each valid problem first gets its reference from label-corpus's strict two-oracle
policy, `reward.solver.oracles`, 2 oracles x 2 attempts all agreeing under math-verify, else it is
invalid) and paid U_S = 1[lo <= solved / decided <= hi] with lo, hi = 1/8, 3/8 (`band=closed`:
both ends inside, as probe-sweep labels it; `band=open`, 0 < rate < 1, is the K = 3 variant), the
label the probe would have been trained to predict; an invalid task (or one whose f fails on its
own inputs) gets `invalid_reward` = -0.2, a valid task with fewer
than `min_valid` decided trials NaN (advantage 0). Each step's metrics count `solver_trials`
and `solver_tasks` (`:math`: and `oracle_trials`) and report `peak_rss_mb`, `peak_rss_children_mb` (sandboxed runs) and, on an
accelerator, `peak_device_mb` (every GRPO run reports the memory, so a PROPEL run's figures sit
beside these); history.jsonl keeps each candidate's `rewards.solver` and `rewards.validity`.

Needs: a generator checkpoint and the solver the probe's labels came from (`reward.solver.kind`
model + `path`; the solver reads the policy's tokenizer and template). Cost: K solver samples and
K sandboxed checks per valid candidate per step, 16 x 8 x 8 = 1,024 trials a step at full size
if every task is valid (the cost PROPEL avoids). `:runlocal`: the tiny model and the
programmatic `oracle` solver (always right, so a valid task's rate is 1, outside the band: U_S =
0); `:runlocal,math` adds two `fn` oracles that box the problem's last number (they agree; a
stand-in so the mechanics run without models, not a solver). Start it, as the vault demo does,
from the warm-up generator (rossjax/train/propel/warmup.py, `--math` for `:runlocal,math`: the
tiny model cloned on a few valid tasks), passed as `--config.model.path`: measured on this loaded
2-core CPU (2026-12-03), 13 of 16 candidates valid in each of the 2 steps, `solver_trials` 104
and 104, reward -0.04 (valid tasks earn U_S = 0 from the always-right solver), 84 s (re-run
2026-12-05 on 2 shared Intel Xeon cores at load ~10: solver_trials 104 and 96, 189 s).
`:runlocal,math` prompts with the fixed instruction (not the paper's two examples, ~10x longer
rows): its `--math` warm-up took 22 min at load ~17 and the run from it 119 s (same host,
2026-12-05): 8 of 8 candidates valid in each of 2 steps, oracle_trials 32 and solver_trials 64
a step, reward 0. Without a warm-up the random tiny model
writes no valid task: every step pays -0.2 and `solver_trials` is 0 (mechanics of the invalid
path only, 18 s on a loaded 2-core AMD EPYC, 2026-12-04).
"""

import ml_collections

from rossjax.configs import common, label_corpus, propel_azr, propel_math


def solver_section(math: bool = False):
    """reward.solver: label-corpus's solver kinds (model, endpoint, fn, programmatic), K and the
    band U_S is measured in; for math also the two reference oracles, as label-corpus has them."""
    s = label_corpus.solver_config("model")
    s.update(dict(
        k=8, lo=1 / 8, hi=3 / 8, band="closed", min_valid=2,  # U_S as probe-sweep labels it
        validity="math_validity" if math else "validity",      # W: which candidates are tried
        invalid_reward=-0.2,
        max_new_tokens=768, batch_tasks=64))  # a model solver's budget; sampling: solver_config
    if math:
        s.oracles = ml_collections.ConfigDict(dict(
            a=label_corpus.solver_config(), b=label_corpus.solver_config(), attempts=2,
            allow_same=False))  # True: one model as both oracles (PROPEL uses two)
    return s


def get_config(arg: str | None = None):
    variants = common.variants(arg, ("runlocal", "math"), "propel_sil.py")
    math = "math" in variants
    base = propel_math if math else propel_azr
    c = base.get_config(",".join(v for v in variants if v != "math"))
    c.run_name = "propel-sil-math" if math else "propel-sil"
    c.reward.functions = ("solver",)
    c.reward.weights = (1.0,)
    c.reward.solver = solver_section(math)
    if "runlocal" in variants:
        c.reward.probe.path = ""         # no probe: the solver pays the reward
        c.reward.solver.kind = "oracle"  # programmatic: no checkpoint (math: boxes the reference)
        if math:
            for name in ("a", "b"):
                c.reward.solver.oracles[name].kind = "fn"
                c.reward.solver.oracles[name].fn = "rossjax.configs.propel_sil:echo_answer"
            c.reward.solver.oracles.allow_same = True  # one stand-in function as both
            # the fixed instruction, not the paper's two examples: ~10x shorter rows, so the
            # --math warm-up and the run fit a few CPU minutes
            c.data.math.context = "instruction"
        c.grpo.steps = 2
        # room for a warm-up generator's task (rossjax/train/propel/warmup.py: ~96 tokens)
        c.grpo.max_new_tokens = 128
    return c


def echo_answer(task, k, seed):
    """`:runlocal,math`'s programmatic oracles: the problem's own last number, boxed (both
    oracles agree, so the mechanics run without a model; not a solver of anything)."""
    import re

    nums = re.findall(r"-?\d+", task.get("problem", ""))
    return [f"\\boxed{{{nums[-1] if nums else 0}}}"] * k
