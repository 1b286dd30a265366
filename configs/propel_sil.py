"""PROPEL's solver-in-the-loop (SIL) baseline on AZR induction: the generator policy is paid the
*realized* utility of each task, measured by running the solver on it during RL, instead of a
probe's prediction of it. The Table 3 comparison (SIL vs PROPEL) is this config against
configs/propel_azr.py: same task, gate, GRPO, KL and LoRA, only the reward differs.

Run:
  rossjax grpo --config=configs/propel_sil.py --config.model.path=HF_GENERATOR_DIR \
      --config.reward.solver.path=SOLVER_DIR --workdir=runs/propel_sil
  rossjax grpo --config=configs/propel_sil.py:runlocal --workdir=/tmp/propel-sil

Reward (rossjax/train/propel_rewards.py `SolverReward`): each candidate that passes the validity
check W (`reward.solver.validity`, on the CPU workers) is posed to the solver under the AZR
protocol (5 shown pairs + the message, scored on the 5 hidden inputs) `reward.solver.k` = 8
times with rossjax/train/solvers.py (`Solver`, `trials`: the kinds `rossjax label-corpus` uses)
and paid U_S = 1[lo <= solved / decided <= hi] with lo, hi = 1/8, 3/8 (`band=open`: 0 < rate
< 1, the K = 3 variant), the label the probe would have been trained to predict; an invalid task
(or one whose f fails on its own inputs) gets `invalid_reward` = -0.2, a valid task with fewer
than `min_valid` decided trials NaN (advantage 0). Each step's metrics count `solver_trials`
and `solver_tasks` and report `peak_rss_mb`, `peak_rss_children_mb` (sandboxed runs) and, on an
accelerator, `peak_device_mb` (every GRPO run reports the memory, so a PROPEL run's figures sit
beside these); history.jsonl keeps each candidate's `rewards.solver` and `rewards.validity`.

Needs: a generator checkpoint and the solver the probe's labels came from (`reward.solver.kind`
model + `path`; the solver reads the policy's tokenizer and template). Cost: K solver samples and
K sandboxed checks per valid candidate per step, 16 x 8 x 8 = 1,024 trials a step at full size
if every task is valid (the cost PROPEL avoids). `:runlocal`: the random tiny model and the
programmatic `oracle` solver (always right, so a valid task's rate is 1, outside the band: U_S =
0); it exercises the mechanics only, ~20 s on this 2-core CPU.
"""

import ml_collections

from rossjax.configs import common, label_corpus, propel_azr


def solver_section():
    """reward.solver: label-corpus's solver kinds, K and the band U_S is measured in."""
    base = (label_corpus.solver_config("model") if hasattr(label_corpus, "solver_config")
            else ml_collections.ConfigDict(dict(kind="model", path="", preset="")))
    base.update(dict(
        k=8, lo=1 / 8, hi=3 / 8, band="closed", min_valid=2,  # U_S as probe-sweep labels it
        validity="validity", invalid_reward=-0.2,             # W and what an invalid task gets
        max_new_tokens=768, temperature=1.0, batch_tasks=64))  # a model solver's sampling
    return base


def get_config(arg: str | None = None):
    variants = common.variants(arg, ("runlocal",), "propel_sil.py")
    c = propel_azr.get_config(",".join(variants))
    c.run_name = "propel-sil"
    c.reward.functions = ("solver",)
    c.reward.weights = (1.0,)
    c.reward.solver = solver_section()
    if "runlocal" in variants:
        c.reward.probe.path = ""         # no probe: the solver pays the reward
        c.reward.solver.kind = "oracle"  # programmatic: no solver checkpoint needed
        c.grpo.steps = 2
    return c
