"""PROPEL on Math: a generator policy writes math problems and is rewarded by a probe on the
frozen reference's activations, behind a validity gate (rossjax/verify/math_task.py).

Run:
  rossjax grpo --config=configs/propel_math.py --config.model.path=HF_GENERATOR_DIR \
      --config.reward.probe.path=SWEEP_DIR/selected_probe --workdir=runs/propel_math
  rossjax grpo --config=configs/propel_math.py:runlocal --workdir=/tmp/propel-math

Task: the generator writes a problem in a ```problem block and its final answer in \\boxed{}
(`gen:math_task`); W = `math_validity` (a problem, an answer math-verify parses, no answer given
away in the problem). Reward: the probe's P(in the solver's learnable band) on the generator's
answer rendered as a user turn (`reward.probe.render=task`), `hard_gate` -0.2 for invalid ones.
The probe must come from a sweep (configs/probe_sweep.py with `domain=math`: downsampled
classes) over the same rendering.

Paper settings: 30 RL steps; advantages = "grpo" ((r - mean) / (std + eps)); KL beta = 0.1 to
the reference (AZR: 0.05, configs/propel_azr.py); LoRA rank 16 on all projections.

Needs: a generator checkpoint and a probe selected for it. `:runlocal` uses a random tiny model
and the bootstrap validity probe of configs/propel_azr.py (mechanics only), ~20 s on this CPU;
the full config is a TPU job.
"""

from rossjax.train.grpo import default_config


def get_config(arg: str | None = None):
    c = default_config()
    c.run_name = "propel-math"
    c.data.tasks = "gen:math_task"
    c.reward.functions = ("probe",)
    c.reward.weights = (1.0,)
    c.reward.probe.gate = "hard_gate"
    c.reward.probe.invalid_reward = -0.2
    c.reward.probe.validity = "math_validity"
    c.reward.probe.render = "task"
    c.grpo.advantages = "grpo"     # the paper's GRPO: (r - mean_group) / (std_group + eps)
    c.grpo.beta = 0.1              # KL to the reference (Math)
    c.grpo.steps = 30              # the paper's 30 RL steps
    c.grpo.contexts = 16
    c.grpo.group_size = 8
    c.grpo.max_new_tokens = 768
    c.lora.enabled = True
    c.lora.rank = 16
    c.lora.alpha = 32.0
    c.lora.targets = "all"
    c.optim.peak_lr = c.optim.end_lr = 1e-5
    for v in [a for a in (arg or "").split(",") if a]:
        if v == "runlocal":
            c.tokenizer = "ascii"
            c.model.preset = "tiny_qwen2"
            c.model.dtype = "float32"
            c.reward.probe.path = "bootstrap"
            c.grpo.steps = 2
            c.grpo.contexts = 2
            c.grpo.group_size = 4
            c.grpo.max_new_tokens = 32
            c.grpo.loss_chunk = 64
            c.reward.workers = 1
            c.lora.rank = 4
            c.lora.alpha = 8.0
            c.optim.peak_lr = c.optim.end_lr = 1e-3
            c.checkpoint.save_every = 5
            c.checkpoint.async_save = False
            c.sample_every = 5
            c.mesh.num_devices = 1
        else:
            raise ValueError(f"configs/propel_math.py: variant {v!r} is not runlocal.")
    return c
