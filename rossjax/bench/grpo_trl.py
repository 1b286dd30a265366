"""`rossjax bench grpo --peer trl`: TRL's GRPOTrainer and `rossjax grpo` on the same work, in one run.

Same model (the preset at random init with the ASCII tokenizer's 131-token vocabulary, written
once as a Hugging Face folder both load), same tokenizer (that folder's tokenizer.json), same
prompts (`gen:arith` tasks rendered with chatml, as the rossjax loop renders them), group size,
new-token limit, temperature 1, beta 0, one update per step (one generation batch, one
iteration), AdamW at the same learning rate, no gradient checkpointing, fp32, and the same reward:
the share of digits in the completion's text (cheap, so the step is the trainer's own time).
Prints each side's seconds per step (median of the steps after the first, which compiles /
warms up) and the ratio. TRL is a benchmark extra (`pip install rossjax[bench]`), never imported
by the library.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from rossjax.errors import UsageError


def digit_share(text: str) -> float:
    return sum(c.isdigit() for c in text) / max(1, len(text))


def digit_scorer(kinds, records):
    """The rossjax side of the reward (a reward-worker scorer, see grpo.run(cpu_scorer=...))."""
    out = []
    for rec in records:
        r = digit_share(rec["messages"][-1]["content"])
        out.append({k: (r, {"name": "digits", "passed": r > 0, "evidence": ""}) for k in kinds})
    return out


def _model_folder(args, d: str) -> str:
    import jax

    from rossjax.models import get_preset, init_params, save_hf
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    cfg = get_preset(args.preset, vocab_size=131)
    save_hf(cfg, init_params(cfg, jax.random.PRNGKey(0)), d)
    write_ascii_tokenizer(d)
    return d


def _rossjax_steps(args, folder: str, workdir: str) -> list[float]:
    from rossjax.monitor import read_metrics
    from rossjax.train.rl import grpo

    c = grpo.default_config()
    c.tokenizer = folder
    c.model.path, c.model.dtype, c.model.remat_policy = folder, "float32", "none"
    c.data.tasks = "gen:arith"
    c.grpo.steps, c.grpo.contexts, c.grpo.group_size = args.steps + 1, args.contexts, args.group
    c.grpo.max_new_tokens, c.grpo.beta, c.grpo.temperature = args.new_tokens, 0.0, 1.0
    c.grpo.micro_batches, c.grpo.num_iterations, c.grpo.async_sampling = 1, 1, False
    c.grpo.pack_completions = bool(args.pack)
    c.optim.peak_lr = c.optim.end_lr = args.lr
    c.reward.functions, c.reward.workers = ("contains",), 0
    c.checkpoint.save_every, c.checkpoint.async_save = 10_000, False
    c.sample_every = 0
    c.mesh.num_devices = 1
    grpo.run(c, workdir, cpu_scorer=digit_scorer)
    return read_metrics(workdir)


def _prompts(args, folder: str) -> list[dict]:
    from rossjax.tokenizers import load_tokenizer
    from rossjax.train.rl import rollout

    tok = load_tokenizer(folder)
    src = rollout.TaskSource("gen:arith", 0)   # grpo.default_config's data.seed
    return [{"prompt": rollout.render_prompt(rollout.prompt_messages(t), "chatml", tok)}
            for t in src.next(args.contexts * (args.steps + 1))]


def _need_trl() -> None:
    # checked before rossjax's steps run, so a missing peer costs no minutes of rossjax's side
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError as e:
        raise UsageError(f"rossjax bench grpo --peer trl needs TRL ({e}); pip install "
                         f"'rossjax[bench]'.") from None


def _trl_steps(args, folder: str, workdir: str) -> list[float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

    rows = args.contexts * args.group
    conf = GRPOConfig(
        output_dir=workdir, per_device_train_batch_size=rows, num_generations=args.group,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        max_completion_length=args.new_tokens, temperature=1.0, top_k=0, top_p=1.0, beta=0.0,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_steps=args.steps + 1, use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, save_strategy="no", report_to="none", logging_steps=10_000,
        shuffle_dataset=False, disable_dropout=True, seed=0, dataloader_num_workers=0)

    def reward(completions, **_):
        return [digit_share(c) for c in completions]

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=conf, processing_class=tok,
                          train_dataset=Dataset.from_list(_prompts(args, folder)),
                          callbacks=[Clock()])
    trainer.train()
    return times


def run(args) -> int:
    if args.steps < 2:
        raise UsageError("rossjax bench grpo --peer trl: --steps must be at least 2 (the first "
                         "step warms up and is not counted).")
    _need_trl()
    with tempfile.TemporaryDirectory() as d:
        folder = _model_folder(args, os.path.join(d, "model"))
        metrics = _rossjax_steps(args, folder, os.path.join(d, "rossjax"))
        peer = _trl_steps(args, folder, os.path.join(d, "trl"))
    ours = [m["time_step_s"] for m in metrics]
    a, b = statistics.median(ours[1:]), statistics.median(peer[1:])
    part = lambda k: statistics.median(m[k] for m in metrics[1:])
    print(f"bench grpo --peer trl: {args.preset} (vocab 131), {args.contexts} prompts x "
          f"{args.group} candidates x {args.new_tokens} new tokens, T=1, beta=0, one update a step")
    print(f"  rossjax grpo     {a:7.2f} s/step (median of {len(ours) - 1}; all: "
          f"{', '.join(f'{x:.2f}' for x in ours)}; of which sampling "
          f"{part('time_sample_s'):.2f} s, update {part('time_update_s'):.2f} s)")
    print(f"  TRL GRPOTrainer  {b:7.2f} s/step (median of {len(peer) - 1}; all: "
          f"{', '.join(f'{x:.2f}' for x in peer)})")
    from rossjax.bench import compare

    # Both sample at T = 1 from their own RNGs, so no loss or token can be compared: the
    # sameness is the configuration, printed here (and set in _rossjax_steps / _trl_steps).
    print("  " + compare.settings_line(
        rossjax={"remat": "none", "micro-batches": 1, "dtype": "float32",
                 "completion packing": "on" if args.pack else "off",
                 "XLA threads": compare.xla_threads()},
        TRL={"gradient checkpointing": "off", "gradient accumulation": 1, "dtype": "float32",
             "threads": _torch_threads()}))
    print(f"  ratio {b / a:.2f}x (TRL s/step / rossjax s/step; target >= 2x, issue 43)")
    return 0


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()
