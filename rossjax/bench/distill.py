"""`rossjax bench distill --peer trl`: seconds per on-policy distillation step, `rossjax distill`
against TRL's GKDTrainer on the same work, in one run.

Same student and teacher (the preset at random init, seeds 0 and 1, with the ASCII tokenizer's
131-token vocabulary, written once as Hugging Face folders both sides load), same prompts
(`gen:arith` tasks rendered with chatml, tokenized once by rossjax and handed to TRL as ids),
`--contexts` prompts x `--group` completions a step (TRL gets each prompt `--group` times, as
rows of one batch), `--new_tokens` new tokens, temperature 1, one update a step, fp32, no
remat / gradient checkpointing, one micro-batch unless `--micro_batches`, AdamW at a constant
`--lr`. The objective is the same: GKD at lmbda = 1 (on-policy: every step samples from the
student), beta = 1 (its generalized JSD's reverse-KL end: sum_v pi_s (log pi_s - log pi_t)),
seq_kd off, token mean over the completion tokens; rossjax `distill.loss = reverse_kl_full`
(the exact KL over the vocabulary, teachers run inside the update). T = 1 because GKD's loss
does not divide by its sampling temperature. `--loss reverse_kl_sampled` times rossjax's
default estimator instead (another objective: the ratio then says so).

Sameness (asserted, exit 1 when it fails): before any update, both sides' loss and gradient
norm on the same parameters and the same fixed rows (`--check_rows` rows of a 12-token prompt
and `--new_tokens` completion tokens, one row shorter, right-padded), GKD's own compute_loss
against rossjax's update loss; tolerance `--rtol` relative (default 1e-4) + 1e-6 absolute.
Sampled tokens cannot be compared (each side's own RNG), so the timed steps' settings are
printed on one line instead.

TRL is a benchmark extra run in its own environment: `--trl_python PATH` (default
$ROSSJAX_TRL_PYTHON, else this python) names a python with `trl` (>= 1.0: trl.experimental.gkd)
and `datasets`, which runs rossjax/bench/distill_trl_child.py in a child process. A venv that
reuses this one's torch and transformers:
  python -m venv /tmp/trlvenv && .venv/bin/python -c "import site; print(site.getsitepackages()[0])" \
      > /tmp/trlvenv/lib/python3.11/site-packages/rossjax_venv.pth && /tmp/trlvenv/bin/pip install trl datasets
Prints each side's median seconds per step after the first (which compiles / warms up) and
the ratio TRL / rossjax (> 1: rossjax is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from rossjax.errors import UsageError

PROMPT_LEN = 12   # the sameness rows' prompt length


def trl_python(given: str = "") -> str | None:
    """The python that has TRL: `given`, $ROSSJAX_TRL_PYTHON, or this one; None when none does."""
    for py in (given, os.environ.get("ROSSJAX_TRL_PYTHON", ""), sys.executable):
        if py and (os.path.exists(py) or shutil.which(py)):
            # find_spec of top-level names imports nothing (importing trl takes seconds)
            probe = ("import importlib.util as u, sys; "
                     "sys.exit(not (u.find_spec('trl') and u.find_spec('datasets')))")
            ok = subprocess.run([py, "-P", "-c", probe], capture_output=True).returncode == 0
            if ok:
                return py
            if given:
                return py   # named explicitly: its failure is reported in full
    return None


def _models(args, d: str) -> tuple[str, str]:
    import jax

    from rossjax.models import get_preset, init_params, save_hf
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    cfg = get_preset(args.preset, vocab_size=131)
    out = []
    for name, seed in (("student", 0), ("teacher", 1)):
        path = os.path.join(d, name)
        save_hf(cfg, init_params(cfg, jax.random.PRNGKey(seed)), path)
        write_ascii_tokenizer(path)
        out.append(path)
    return out[0], out[1]


def _config(args, student: str, teacher: str):
    import importlib.util

    from rossjax.resources import config_path

    spec = importlib.util.spec_from_file_location("distill_onpolicy",
                                                  config_path("distill_onpolicy.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config()   # the shipped recipe, at the bench's sizes below
    c.tokenizer = student
    c.model.path, c.model.dtype, c.model.remat_policy = student, "float32", "none"
    c.data.tasks, c.data.seed = "gen:arith", 0
    c.reward.functions, c.reward.weights, c.reward.workers = ("contains",), (1.0,), 0
    c.distill.teachers, c.distill.tokenizers = {"t": teacher}, {"t": ""}
    c.distill.routes, c.distill.default, c.distill.loss = {}, "t", args.loss
    c.grpo.steps, c.grpo.contexts, c.grpo.group_size = args.steps + 1, args.contexts, args.group
    c.grpo.max_new_tokens, c.grpo.temperature = args.new_tokens, 1.0
    c.grpo.micro_batches = args.micro_batches
    c.optim.peak_lr = c.optim.end_lr = args.lr
    c.checkpoint.save_every, c.checkpoint.async_save = 10_000, False
    c.sample_every = 0
    c.mesh.num_devices = 1
    return c


def _prompt_ids(args, folder: str) -> list[list[int]]:
    """Every step's prompts as token ids, each repeated `group` times (rossjax's task order)."""
    from rossjax.templates import render_prompt
    from rossjax.tokenizers import load_tokenizer
    from rossjax.train.rl import rollout

    tok = load_tokenizer(folder)
    src = rollout.TaskSource("gen:arith", 0)
    ids = [tok.encode(render_prompt(rollout.prompt_messages(t), "chatml", tok))
           for t in src.next(args.contexts * (args.steps + 1))]
    return [p for p in ids for _ in range(args.group)]


def _same_rows(args) -> dict:
    r = np.random.default_rng(0)
    n, total = args.check_rows, PROMPT_LEN + args.new_tokens
    lengths = [total] * n
    lengths[-1] = PROMPT_LEN + max(1, args.new_tokens // 2)
    return {"tokens": r.integers(0, 131, (n, total)).tolist(), "lengths": lengths,
            "prompt_len": PROMPT_LEN}


def _rossjax_same(args, student: str, teacher: str, same: dict) -> tuple[float, float]:
    """(loss, gradient norm) of rossjax's update loss on the fixed rows, before any update."""
    import jax
    import optax

    from rossjax.models import load_hf
    from rossjax.train.rl import distill_step
    from rossjax.train.rl.aggregation import normalizers

    cfg, sp = load_hf(student)
    tcfg, tp = load_hf(teacher)
    tok = np.asarray(same["tokens"], np.int32)
    b, s = tok.shape
    mask = np.zeros((b, s), np.int32)   # position j predicts token j + 1
    for i, n in enumerate(same["lengths"]):
        mask[i, same["prompt_len"] - 1:n - 1] = 1
    batch = {"tokens": tok, "positions": np.tile(np.arange(s, dtype=np.int32), (b, 1)),
             "segment_ids": np.ones((b, s), np.int32),
             "targets": np.concatenate([tok[:, 1:], np.zeros((b, 1), np.int32)], 1),
             "mask": mask, "teacher_idx": np.zeros(b, np.int32)}
    # the full-vocabulary loss runs the teacher itself; its stored log-probs feed a metric only
    batch["teacher_logp"] = np.zeros((b, s), np.float32)
    fn = distill_step.make_loss_fn(cfg, [tcfg], loss="reverse_kl_full", agg="token_mean",
                                   temperature=1.0, chunk=64, lora_alpha=None)
    norm = normalizers(batch["mask"], "token_mean")
    value, grads = jax.jit(jax.value_and_grad(lambda p: fn(p, {}, (tp,), norm, batch)[0]))(sp)
    return float(value), float(optax.tree.norm(grads))


def _trl_side(args, py: str, student: str, teacher: str, same: dict, d: str) -> dict:
    spec = os.path.join(d, "trl_spec.json")
    with open(spec, "w") as f:
        json.dump({"student": student, "teacher": teacher, "prompts": _prompt_ids(args, student),
                   "steps": args.steps + 1, "new_tokens": args.new_tokens, "lr": args.lr,
                   "same": same, "workdir": os.path.join(d, "trl")}, f)
    child = os.path.join(os.path.dirname(__file__), "distill_trl_child.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["TRL_EXPERIMENTAL_SILENCE"] = "1"
    # -P: the child's folder (rossjax/bench, with a select.py) must not shadow the stdlib
    p = subprocess.run([py, "-P", child, spec], capture_output=True, text=True, env=env)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode or not lines:
        tail = (p.stderr.strip().splitlines() or [""])[-1]
        raise UsageError(f"rossjax bench distill --peer trl: TRL's side failed under {py} (exit "
                         f"{p.returncode}): {tail[:400]} -- give --trl_python the python of an "
                         f"environment with trl and datasets installed.")
    return json.loads(lines[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rossjax bench distill")
    ap.add_argument("--peer", choices=("trl",), default="trl",
                    help="trl: TRL's GKDTrainer (lmbda 1, beta 1) on the same models and prompts")
    ap.add_argument("--preset", default="qwen2_30m", help="student and teacher architecture")
    ap.add_argument("--contexts", type=int, default=8, help="prompts a step")
    ap.add_argument("--group", type=int, default=4, help="completions per prompt")
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--micro_batches", type=int, default=1, help="(rossjax) gradient accumulation")
    ap.add_argument("--loss", default="reverse_kl_full",
                    choices=("reverse_kl_full", "reverse_kl_sampled"),
                    help="rossjax's distill.loss in the timed steps (GKD beta=1 is _full)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--check_rows", type=int, default=4, help="rows of the sameness check")
    ap.add_argument("--rtol", type=float, default=1e-4,
                    help="sameness: first losses and gradient norms agree to this (relative)")
    ap.add_argument("--trl_python", default="",
                    help="python of an environment with trl (default $ROSSJAX_TRL_PYTHON, else "
                         "this python)")
    args = ap.parse_args(argv)
    if args.steps < 2:
        raise UsageError("rossjax bench distill: --steps must be at least 2 (the first step "
                         "compiles / warms up and is not counted).")
    py = trl_python(args.trl_python)
    if py is None:
        raise UsageError("rossjax bench distill --peer trl needs TRL (trl.experimental.gkd) and "
                         "datasets; give --trl_python (or $ROSSJAX_TRL_PYTHON) the python of an "
                         "environment with them (rossjax bench distill --help says how).")
    from rossjax.bench import compare
    from rossjax.monitor import read_metrics
    from rossjax.train.rl import distill_trainer

    with tempfile.TemporaryDirectory() as d:
        student, teacher = _models(args, d)
        same = _same_rows(args)
        ours_same = _rossjax_same(args, student, teacher, same)
        wd = os.path.join(d, "rossjax")
        distill_trainer.run(_config(args, student, teacher), wd)
        metrics = read_metrics(wd)
        peer = _trl_side(args, py, student, teacher, same, d)
    ours = [m["time_step_s"] for m in metrics]
    a, b = statistics.median(ours[1:]), statistics.median(peer["times"][1:])
    part = lambda k: statistics.median(m.get(k, 0.0) for m in metrics[1:])
    print(f"bench distill --peer trl: {args.preset} student and teacher (vocab 131), "
          f"{args.contexts} prompts x {args.group} completions x {args.new_tokens} new tokens, "
          f"T=1, one update a step; rossjax loss {args.loss}, TRL GKD lmbda=1 beta=1 seq_kd=off")
    print(f"  rossjax distill   {a:7.2f} s/step (median of {len(ours) - 1}; sampling "
          f"{part('time_sample_s'):.2f} s, teacher {part('time_teacher_s'):.2f} s, update "
          f"{part('time_update_s'):.2f} s; all: {', '.join(f'{x:.2f}' for x in ours)})")
    print(f"  TRL GKDTrainer    {b:7.2f} s/step (median of {len(peer['times']) - 1}; all: "
          f"{', '.join(f'{x:.2f}' for x in peer['times'])}; {peer['versions']})")
    # each side samples with its own RNG: the work is the same in distribution, shown here
    lens = lambda xs: ", ".join(f"{x:.1f}" for x in xs)
    print(f"  mean completion tokens a step: rossjax "
          f"{lens(m['completion_len_mean'] for m in metrics)} | TRL {lens(peer['lengths'])} "
          f"(both stop at eos)")
    print("  " + compare.settings_line(
        peer_shares_heap=False,
        rossjax={"remat": "none", "micro-batches": args.micro_batches, "dtype": "float32",
                 "XLA threads": compare.xla_threads(), "loss": args.loss},
        TRL={"gradient checkpointing": "off", "gradient accumulation": 1, "dtype": "float32",
             "threads": peer["threads"], "loss": "generalized JSD beta=1"}))
    print(f"  first-step loss on the same parameters and rows: rossjax {ours_same[0]:.6f}, TRL "
          f"{peer['loss0']:.6f}; gradient norm rossjax {ours_same[1]:.6f}, TRL "
          f"{peer['grad_norm0']:.6f} (tolerance {args.rtol:g} relative + 1e-06)")
    print(f"  ratio {b / a:.2f}x (TRL s/step / rossjax s/step; target > 1)")
    return compare.verdict("rossjax bench distill", [
        compare.close("first-step loss", ours_same[0], peer["loss0"], rtol=args.rtol, atol=1e-6),
        compare.close("first-step gradient norm", ours_same[1], peer["grad_norm0"],
                      rtol=args.rtol, atol=1e-6)])
