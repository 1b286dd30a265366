"""PROPEL on Math: a generator policy writes math problems and is rewarded by a probe on the
frozen reference's activations, behind a validity gate (rossjax/verify/math_task.py).

Run:
  rossjax grpo --config=configs/propel_math.py --config.model.path=HF_GENERATOR_DIR \
      --config.reward.probe.path=SWEEP_DIR/selected_probe --workdir=runs/propel_math
  rossjax grpo --config=configs/propel_math.py:runlocal --workdir=/tmp/propel-math

Task (`gen:math_task`, rossjax/verify/math_task.py): the generator is shown two example problems
drawn per prompt from a pool (`data.math`: context=paper, n_examples=2, examples="" = the shipped
data/propel/math_examples.jsonl, or a JSONL of {"id", "problem"} rows of your own) and writes a
new problem only, in a ```problem block, with no answer; W = `math_validity` (a non-empty
problem that does not give its answer away in a \\boxed{}). The reference answers behind the
probe's labels come from two oracles that must agree 2 x 2 (`rossjax label-corpus
--config.domain=math`, rossjax/verify/math_oracle.py), never from the generator. The oracles are
two different models, as in the paper; one model as both is refused unless
`--config.oracles.allow_same=True`:
  rossjax label-corpus --config=configs/label_corpus.py --config.domain=math --config.pool=POOL \
      --config.solver.path=SOLVER_DIR --config.oracles.a.path=ORACLE_A_DIR \
      --config.oracles.b.path=ORACLE_B_DIR --workdir=runs/propel_math_labels Reward: the
probe's P(in the solver's learnable band) on the generator's answer rendered as a user turn
(`reward.probe.render=task`), `hard_gate` -0.2 for invalid ones. The probe must come from a
sweep (configs/probe_sweep.py with `domain=math`: downsampled classes) over the same rendering.

Paper settings: 30 RL steps; advantages = "grpo" ((r - mean) / (std + eps)); KL beta = 0.1 to
the reference (AZR: 0.05, configs/propel_azr.py); LoRA rank 16 on all projections.

Needs: a generator checkpoint and a probe selected for it. `:runlocal` uses a random tiny model
and the bootstrap validity probe of configs/propel_azr.py (mechanics only), 35-42 s on a loaded 2-core AMD EPYC (2026-12-04);
the full config is a TPU job.
"""

import ml_collections

from rossjax.configs import common, propel_azr


def get_config(arg: str | None = None):
    # The AZR config is the shared PROPEL recipe; Math changes only its task, gate and KL.
    variants = common.variants(arg, ("runlocal",), "propel_math.py")
    c = propel_azr.get_config(",".join(variants))
    c.run_name = "propel-math"
    c.data.tasks = "gen:math_task"
    c.reward.probe.validity = "math_validity"
    # the generator's context: n_examples example problems drawn per prompt from `examples`
    c.data.math = ml_collections.ConfigDict(dict(context="paper", examples="", n_examples=2))
    c.grpo.beta = 0.1              # KL to the reference (Math; AZR: 0.05)
    if "runlocal" in variants:
        c.grpo.steps = 2
        c.grpo.contexts = 2
        c.grpo.max_new_tokens = 32
    return c
