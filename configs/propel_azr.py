"""PROPEL on Absolute-Zero-style function induction: a generator policy writes induction tasks
and is rewarded by a probe on the frozen reference's activations, behind a validity gate.

Run:
  rossjax grpo --config=configs/propel_azr.py --config.model.path=HF_GENERATOR_DIR \
      --config.reward.probe.path=SWEEP_DIR/selected_probe --workdir=runs/propel
  rossjax grpo --config=configs/propel_azr.py:runlocal --workdir=/tmp/propel-local

Task (AZR protocol, rossjax/verify/induction_task.py; `data.induction`): the generator is shown
AZR's seed function, two reference tasks drawn per prompt from a pool and the banned imports
(`data.induction.context=paper`; `examples=PATH` for a pool of your own), and writes f
in a ```python block, exactly 10 inputs in an ```inputs block and a hint in a ```message block; a
solver is later shown 5 input/output pairs + the hint and scored on the 5 hidden inputs (that is
how the probe's labels were made: `rossjax label-corpus`).

Reward (rossjax/probes/reward.py): the candidate task (in canonical form) is rendered as a user turn, run through the frozen reference
(with LoRA: the same base weights, adapters off), pooled as the probe's manifest says and scored
with the probe (P(in the solver's learnable band)); `hard_gate` gives -0.2 to tasks that fail the
validity check W (`check_task`: 10 inputs, a message, `task_valid`; run on CPU workers). Options:
`reward.probe.ensemble=P2,P3` (worst case over probes), `reward.probe.auxiliary=AUX` (adversarial
auxiliary probe: min(original, auxiliary) on valid tasks; its set: `rossjax aux-set`),
`reward.probe.gate=soft_gate`, `reward.probe.calibration=auto` (raw probe scores for AZR and Math,
temperature-calibrated for SWE, as the paper; `raw` / `temperature` force one).

Cold transfer: `--config.reward.probe.reference.path=REF_DIR` reads the probe from another frozen
model (any family or width, its own tokenizer: `reference.tokenizer`, default REF_DIR's) while
the policy is `model.path`; the task text is re-tokenized for it. The probe's manifest names the
model it was swept on (path, architecture and weights sha256) and another one is refused.
Solver-in-the-loop baseline (PROPEL's Table 3): configs/propel_sil.py.

Paper settings: 30 RL steps; advantages = "grpo", the group-normalised GRPO advantage
(r - mean) / (std + eps) of the paper's GRPO; KL beta = 0.05 to the reference (Math:
configs/propel_math.py, beta 0.1); LoRA rank 16 on all projections.

Needs: a generator checkpoint and the probe `rossjax probe-sweep` selected for it (the probe must
have been trained on the same rendering: user-turn task text, `reward.probe.render=task`).
`:runlocal` has no such probe for its random tiny model: it trains a linear *validity* probe on
templated induction tasks at start-up (`reward.probe.path=bootstrap`; real task_valid labels, not
utility labels), so it exercises the mechanics only, prompted with the one fixed instruction
(`data.induction.context=instruction`: short prompts). Time: `:runlocal` 23 s on a loaded 2-core AMD EPYC (2026-12-04;
load ~5.6); the full config is a TPU job (estimated, not measured: ~15-30 s per step for a 1.5B
generator on a v5e-8).

Memory: an update holds activations for `grpo.minibatch / grpo.micro_batches` rows; at long
completions raise `--config.grpo.micro_batches` (exact gradient accumulation: the same update for
every aggregation) and set `--config.model.remat_policy=full`.
"""

import ml_collections

from rossjax.configs import common


def get_config(arg: str | None = None):
    variants = common.variants(arg, ("runlocal",), "propel_azr.py")
    c = common.grpo_config()
    c.run_name = "propel-azr"
    c.data.tasks = "gen:induction"
    c.reward.functions = ("probe",)
    c.reward.weights = (1.0,)
    c.reward.probe.gate = "hard_gate"
    c.reward.probe.invalid_reward = -0.2
    c.reward.probe.validity = "validity"
    c.reward.probe.render = "task"
    # PROPEL: RL rewards from raw probe scores for Math and AZR, calibrated ones for SWE
    # (auto reads the probe manifest's domain; raw | temperature force one)
    c.reward.probe.calibration = "auto"
    # Cold transfer: the frozen model the probe reads, if not the policy's base (path or preset;
    # its own tokenizer, default the folder's, and chat template, default config.template)
    c.reward.probe.reference = ml_collections.ConfigDict(dict(
        path="", preset="", tokenizer="", template="", dtype="float32", seed=0))
    c.data.induction.n_inputs, c.data.induction.n_visible = 10, 5   # the AZR protocol
    # the generator's context (rossjax/verify/generator_context.py): AZR's seed function,
    # n_examples reference tasks drawn per prompt from `examples` ("" = the shipped
    # data/propel/azr_examples.jsonl) and the banned imports; "instruction": one fixed prompt
    c.data.induction.context, c.data.induction.examples, c.data.induction.n_examples = "paper", "", 2
    c.grpo.advantages = "grpo"     # the paper's GRPO: (r - mean_group) / (std_group + eps)
    c.grpo.beta = 0.05             # KL to the reference (AZR)
    c.grpo.steps = 30              # the paper's 30 RL steps
    c.grpo.contexts = 16
    c.grpo.group_size = 8
    c.grpo.max_new_tokens = 768
    c.lora.enabled = True
    c.lora.rank = 16
    c.lora.alpha = 32.0
    c.lora.targets = "all"
    c.optim.peak_lr = c.optim.end_lr = 1e-5
    if "runlocal" in variants:
        common.runlocal_grpo(c, steps=10, max_new_tokens=48, save_every=5)
        c.reward.probe.path = "bootstrap"  # a linear validity probe trained at start-up
        # a random tiny model reads ASCII tokens: the paper's context (~2k characters) would make
        # every row 5x longer for mechanics it does not need (propel_math:runlocal keeps its own)
        c.data.induction.context = "instruction"
        c.lora.rank = 4
        c.lora.alpha = 8.0
    return c
