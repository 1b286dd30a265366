"""`rossjax bench grpo`: full GRPO steps (G = 8, 16 contexts, 128 new tokens) on the ~30M config.

The qwen2_30m preset (random init, fp32), `gen:arith` tasks, beta = 0.04 so the reference
forward runs, one update per step. The first step compiles and the last one has no next batch
to sample ahead; neither is counted: `--steps` timed steps run between them. Printed per step: sampling, old-policy log-probs, reference forward, update,
waiting for CPU rewards, and the accelerator-idle share (time blocked on rewards / step time).

Rewards (`--reward`):
  code  (default) the cost of a real code-RL reward: every candidate is judged by the sandboxed
        `code` verifier (a fresh locked-down interpreter per stdin/stdout case). A random model
        writes no code, so each candidate is stood in for by one of a fixed pool of programs
        (right, wrong, and compute-heavy ones), chosen by its id: the verdicts do not depend on
        the policy, the CPU work per candidate is that of verifying a real program.
  math  the math verifier on the sampled text (near-instant on random text: the idle share is
        then ~0 whatever the scheduling, which says nothing).
The peer is the same loop with rewards computed inline (`reward.workers = 0`, synchronous: what a
trainer that scores in its own process does); ours runs them on `--workers` processes while the
accelerator computes log-probs and (`--async 1`) samples the next batch. Target: idle < 10% with
workers. On a machine whose "accelerator" is the same few CPU cores the workers run on, the
reward processes compete with the device work, so the figures there are an upper bound.
A quick look on a small CPU: `rossjax bench grpo --contexts 4 --group 8 --new_tokens 64 --steps 1`
(a few minutes); the defaults are the issue's sizes (an accelerator job).

`--peer trl`: instead, TRL's GRPOTrainer and `rossjax grpo` on the same work side by side
(rossjax/bench/grpo_trl.py; defaults there: the issue's 8 prompts x 8 x 64 tokens).
`--peer tunix`: tunix's GRPOLearner instead, from its own environment (rossjax/bench/grpo_tunix.py).
`--part update`: the policy update alone, rossjax vs torch (rossjax/bench/grpo_update.py).

The ASCII tokenizer renders prompts (the preset's 8,192-token vocabulary is larger; ids past the
tokenizer's 131 decode to nothing, which is fine for timing).
"""

from __future__ import annotations

import argparse
import tempfile
import zlib

import numpy as np

from rossjax.errors import UsageError

# (program, [(stdin, expected stdout)]): the pool the code reward judges; the sieve and the
# sort are the compute-heavy members, the last two fail (wrong answer, runtime error).
_PROGRAMS = [
    ("a, b = map(int, input().split())\nprint(a + b)", [("3 4", "7"), ("10 -2", "8"), ("0 0", "0")]),
    ("n = int(input())\nsieve = bytearray([1]) * (n + 1)\nsieve[0:2] = b'\\x00\\x00'\n"
     "for i in range(2, int(n ** 0.5) + 1):\n    if sieve[i]:\n"
     "        sieve[i * i::i] = bytearray(len(range(i * i, n + 1, i)))\nprint(sum(sieve))",
     [("100000", "9592"), ("200000", "17984"), ("1000", "168")]),
    ("import random\nrandom.seed(int(input()))\nxs = [random.random() for _ in range(200000)]\n"
     "print(len(sorted(xs)))", [("1", "200000"), ("2", "200000"), ("3", "200000")]),
    ("s = input()\nprint(s[::-1])", [("abc", "cba"), ("xy", "yx"), ("a", "a")]),
    ("a, b = map(int, input().split())\nprint(a - b)", [("3 4", "7"), ("1 1", "2"), ("0 0", "0")]),
    ("xs = list(map(int, input().split()))\nprint(xs[10])", [("1 2 3", "3"), ("4", "4"), ("5", "5")]),
]


def sandboxed_code_batch(kinds, records):
    """A reward-worker scorer (see `grpo.run(cpu_scorer=...)`): the sandboxed code verifier on
    the pool program standing in for each candidate."""
    from rossjax.verify.code_verifier import verify

    out = []
    for rec in records:
        program, cases = _PROGRAMS[zlib.crc32(rec["id"].encode()) % len(_PROGRAMS)]
        v = verify({"task": {"cases": [{"input": i, "output": o} for i, o in cases]},
                    "messages": [{"role": "assistant", "content": f"```python\n{program}\n```"}]})
        verdict = {"name": "code", "passed": v.passed, "evidence": v.evidence[:300]}
        out.append({k: (float(bool(v.passed)), verdict) for k in kinds})
    return out


def _run(args, workers: int, use_async: bool):
    from rossjax.monitor import read_metrics
    from rossjax.train.rl import grpo

    c = grpo.default_config()
    c.tokenizer = "ascii"
    c.model.preset, c.model.dtype, c.model.remat_policy = args.preset, "float32", "full"
    c.data.tasks = "gen:arith"
    c.grpo.steps, c.grpo.contexts, c.grpo.group_size = args.steps + 2, args.contexts, args.group
    c.grpo.max_new_tokens, c.grpo.beta, c.grpo.loss_chunk = args.new_tokens, 0.04, 32
    c.grpo.micro_batches, c.grpo.async_sampling = args.micro_batches, use_async
    c.grpo.pack_completions = bool(args.pack)
    c.reward.functions, c.reward.workers = ("verifier",), workers
    c.checkpoint.save_every, c.checkpoint.async_save = 10_000, False
    c.sample_every = 0
    c.mesh.num_devices = 1
    with tempfile.TemporaryDirectory() as d:
        grpo.run(c, d, cpu_scorer=sandboxed_code_batch if args.reward == "code" else None)
        return read_metrics(d)[1:-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rossjax bench grpo")
    ap.add_argument("--preset", default="qwen2_30m")
    ap.add_argument("--contexts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2, help="timed steps (after one compile step)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--async", dest="use_async", type=int, default=1,
                    help="1: sample the next batch while this step's rewards are scored")
    ap.add_argument("--micro_batches", type=int, default=4, help="gradient accumulation per update")
    ap.add_argument("--reward", choices=("code", "math"), default="code")
    ap.add_argument("--pack", type=int, default=1, choices=(0, 1),
                    help="grpo.pack_completions: each group's completions packed after its prompt "
                         "(rossjax/train/rl/packed_prompt.py)")
    ap.add_argument("--peer", choices=("trl", "tunix"), default=None,
                    help="trl: TRL's GRPOTrainer on the same model, prompts, sizes and reward; "
                         "tunix: tunix's GRPOLearner (rossjax/bench/grpo_tunix.py)")
    ap.add_argument("--tunix_python", default="",
                    help="(--peer tunix) python of an environment with google-tunix")
    ap.add_argument("--lr", type=float, default=1e-5, help="(--peer) learning rate of both")
    ap.add_argument("--part", choices=("step", "update"), default="step",
                    help="update: the policy update alone, rossjax vs torch on the same batch "
                         "(rossjax/bench/grpo_update.py)")
    ap.add_argument("--repeats", type=int, default=5, help="(--part update) timed pairs")
    ap.add_argument("--atol", type=float, default=1e-5,
                    help="(--part update) first losses of both sides must agree to this")
    ap.add_argument("--rtol", type=float, default=1e-4,
                    help="(--part update) first gradient norms must agree to this (relative)")
    args = ap.parse_args(argv)
    given = set(a.split("=")[0] for a in (argv or []))
    if args.part == "update":
        from rossjax.bench import grpo_update

        # the TRL comparison's sizes unless given: 8 prompts x 8 candidates x 64 new tokens
        for flag, v in (("--contexts", 8), ("--new_tokens", 64)):
            if flag not in given:
                setattr(args, flag[2:], v)
        return grpo_update.run(args)
    if args.peer:
        from rossjax.bench import grpo_trl, grpo_tunix

        # the sizes unless given: 8 prompts x 8 candidates x 64 new tokens, 24M-class model
        for flag, v in (("--contexts", 8), ("--new_tokens", 64), ("--steps", 4)):
            if flag not in given:
                setattr(args, flag[2:], v)
        return (grpo_trl if args.peer == "trl" else grpo_tunix).run(args)
    if args.steps < 1 or args.workers < 1:
        raise UsageError("rossjax bench grpo: --steps and --workers must be at least 1.")
    keys = ("time_sample_s", "time_logp_s", "time_ref_s", "time_reward_wait_s", "time_update_s",
            "time_step_s", "accelerator_idle_frac")
    out = {}
    for name, w, a in (("workers", args.workers, bool(args.use_async)), ("inline", 0, False)):
        rows = _run(args, w, a)
        out[name] = m = {k: float(np.mean([r[k] for r in rows])) for k in keys}
        print(f"grpo step [{args.reward} rewards {name}: {w} workers, async sampling {a}]: "
              f"{m['time_step_s']:.2f} s = sample {m['time_sample_s']:.2f} + old log-probs "
              f"{m['time_logp_s']:.2f} + reference {m['time_ref_s']:.2f} + reward wait "
              f"{m['time_reward_wait_s']:.2f} + update {m['time_update_s']:.2f} (+ host work); "
              f"accelerator idle {100 * m['accelerator_idle_frac']:.1f}%", flush=True)
    a, b = out["workers"], out["inline"]
    print(f"idle share: {100 * a['accelerator_idle_frac']:.1f}% with workers vs "
          f"{100 * b['accelerator_idle_frac']:.1f}% inline (target < 10% with workers); step time "
          f"ratio inline/workers {b['time_step_s'] / max(a['time_step_s'], 1e-9):.2f}x")
    return 0
