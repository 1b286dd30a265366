"""GRPO with verifiable (math-style) rewards: the curation verifiers score every candidate.

Run:
  rossjax grpo --config=configs/grpo_verifier.py --config.model.path=HF_QWEN_DIR --workdir=runs/grpo
  rossjax grpo --config=configs/grpo_verifier.py:runlocal --workdir=/tmp/grpo-local

Needs: a Hugging Face (or `rossjax export --format orbax`) policy and a task source:
`--config.data.tasks=tasks.jsonl` (rollout-record `task` objects: id, domain, prompt, reference;
`domain` picks the verifier: math, code, induction, gym:<dataset>) or the built-in `gen:arith`
(a + b, answer in \\boxed{}, math verifier). Rewards: 1 pass / 0 fail / NaN undecided (advantage
0), computed on `reward.workers` CPU processes while the accelerator computes log-probs;
`--config.grpo.async_sampling=True` also samples the next batch meanwhile (one step off-policy;
pair it with `--config.grpo.is_mode=token`, the truncated-IS correction).
Every candidate is appended to WORKDIR/history.jsonl (the input of ROSS relearning, see
rossjax/train/rl/history.py).

The upstream RL run of ROSS (its history is what ROSS relearns), with the paper's settings:
Dr. GRPO advantages r - mean(group) (no std), weight decay 0.1, the IcePop correction on
(`is_mode=token, is_how=mask`: tokens whose trainer/sampler probability ratio leaves the two-sided
band [is_low, is_high] = [0.5, 2.0] get no gradient), and `grpo.minibatches=4` updates per step
so that the later minibatches are off-policy and the clipped surrogate can bind. The batch is
the paper's: 128 prompts x 8 rollouts = 1,024 candidates a step, updated in `grpo.minibatches=4`
minibatches of 256 (the paper's update batch), with asynchronous rollouts on
(`grpo.async_sampling=True`: the next step's batch is sampled while this step's rewards and
updates run, one step off-policy, which IcePop's band corrects; it excludes
`grpo.dynamic_sampling`). rossjax's asynchronous rollouts are this one-step-ahead pipelining on
the same devices, not a separate rollout fleet (docs/deviations.md). The response length is
`grpo.max_new_tokens` = 512 tokens per candidate.

Time: `:runlocal` (tiny Qwen2 from scratch, ASCII tokenizer, 8 x 4 candidates of 32 tokens, 20
steps) ~40 s on this 2-core CPU, most of it compiling; it samples synchronously (a resumed run is
bit-exact). A random 0.1M model does not do arithmetic, so `:runlocal` trains on a task it can
learn in 20 steps, `gen:contains` (write the letter the prompt names; reward `contains`, lr
3e-3): its reward_mean rises from ~0.28 (first 5 steps) to ~0.6 (last 5), measured over 3 seeds
(0.31 -> 0.50, 0.30 -> 0.62, 0.25 -> 0.72), so metrics.png shows learning.
The full config (128 contexts x 8 samples x 512 tokens) on a ~1.5B model is a TPU job
(estimated, not measured: ~1.5-3 min per step on a v5e-8, bf16: 8x the tokens of 16 contexts).

`:continued` is the paper's Continued-RL control: resume the upstream run in its own workdir
(`--workdir=` the upstream's; the run's length is the one field a resume changes without being
asked, rossjax/train/resume.py) for 2 more epochs. An epoch of a task file of N rows is
ceil(N / grpo.contexts) steps; the built-in generators are endless, so an epoch is the upstream
run's length (`grpo.steps`), and `:continued` sets grpo.steps to 3 x that (500 -> 1,500; with
`:runlocal` 20 -> 60). For a task file pass the length instead:
`--config.grpo.steps=<upstream steps + 2 * ceil(N / contexts)>` (`continued_steps` below). The
learning rate is constant, so the extra steps run at the upstream's rate. Copy the upstream
workdir first (`cp -r`) to keep its last checkpoint and history as ROSS relearns them: the
continued run appends to history.jsonl and rotates checkpoints (`checkpoint.keep`).

Memory: an update holds activations for `grpo.minibatch / grpo.micro_batches` rows; at long
completions raise `--config.grpo.micro_batches` (exact gradient accumulation: the same update for
every aggregation) and set `--config.model.remat_policy=full`. On one device each group's prompt
runs once and, where completions stop early, they are packed after it (`grpo.pack_completions`,
on by default: the same update in fewer slots; `=False` turns it off).
"""

from rossjax.configs import common

CONTINUED_EPOCHS = 2  # the paper's Continued RL: 2 more epochs


def continued_steps(steps: int, contexts: int, task_rows: int | None = None) -> int:
    """The length of the continued run: `steps` plus CONTINUED_EPOCHS epochs, an epoch being
    ceil(task_rows / contexts) steps of a task file, or `steps` for an endless generator."""
    epoch = steps if task_rows is None else -(-int(task_rows) // int(contexts))
    return int(steps) + CONTINUED_EPOCHS * epoch


def get_config(arg: str | None = None):
    variants = common.variants(arg, ("runlocal", "continued"), "grpo_verifier.py")
    c = common.grpo_config()
    c.run_name = "grpo-verifier"
    c.data.tasks = "gen:arith"
    c.reward.functions = ("verifier",)
    c.reward.weights = (1.0,)
    c.grpo.steps = 500
    c.grpo.contexts = 128            # prompts a step
    c.grpo.group_size = 8            # rollouts per prompt
    c.grpo.async_sampling = True     # asynchronous rollouts: sample step t+1 during step t
    c.grpo.max_new_tokens = 512
    c.grpo.advantages = "mean"       # Dr. GRPO: r - mean(group)
    c.grpo.minibatches = 4           # 1,024 rows / 4 = update batch 256 (num_iterations passes)
    c.grpo.is_mode, c.grpo.is_how = "token", "mask"   # IcePop
    c.grpo.is_low, c.grpo.is_high = 0.5, 2.0          # its two-sided band
    c.optim.peak_lr = c.optim.end_lr = 1e-6
    c.optim.weight_decay = 0.1
    if "runlocal" in variants:
        common.runlocal_grpo(c, steps=20, max_new_tokens=32, save_every=10)
        c.grpo.async_sampling = False   # small and bit-exact on resume
        # a task a 0.1M model learns in 20 steps (arithmetic it does not): see the docstring
        c.data.tasks = "gen:contains"
        c.reward.functions, c.reward.weights = ("contains",), (1.0,)
        c.grpo.contexts = 8
        c.optim.peak_lr = c.optim.end_lr = 3e-3
    if "continued" in variants:  # the shipped tasks are generators: an epoch is the run's length
        c.grpo.steps = continued_steps(c.grpo.steps, c.grpo.contexts)
    return c
