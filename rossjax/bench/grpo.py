"""`rossjax bench grpo`: full GRPO steps (G = 8, 16 contexts, 128 new tokens) on the ~30M config.

The qwen2_30m preset (random init, fp32 on CPU), `gen:arith` tasks scored by the math verifier
(math-verify on the sampled text), beta = 0.04 so the reference forward runs, one update per
step. The first step compiles and is not timed; then `--steps` timed steps. Printed per step:
sampling, reference forward (plus the old-policy log-prob pass), update, waiting for CPU rewards,
and the accelerator-idle share (time blocked on rewards / step time). The peer is the same loop
with rewards computed inline (`reward.workers = 0`, what a trainer that scores in its own process
does); the ratio of idle shares is printed. Target: idle < 10% with workers.

The ASCII tokenizer renders prompts (the preset's 8,192-token vocabulary is larger; ids past the
tokenizer's 131 decode to nothing, which is fine for timing).
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np


def _run(args, workers: int):
    from rossjax.train import grpo
    from rossjax.train.metrics import read_metrics

    c = grpo.default_config()
    c.tokenizer = "ascii"
    c.model.preset, c.model.dtype, c.model.remat_policy = args.preset, "float32", "full"
    c.data.tasks = "gen:arith"
    c.grpo.steps, c.grpo.contexts, c.grpo.group_size = args.steps + 1, args.contexts, args.group
    c.grpo.max_new_tokens, c.grpo.beta, c.grpo.loss_chunk = args.new_tokens, 0.04, 32
    c.reward.functions, c.reward.workers = ("verifier",), workers
    c.checkpoint.save_every, c.checkpoint.async_save = 10_000, False
    c.sample_every = 0
    c.mesh.num_devices = 1
    with tempfile.TemporaryDirectory() as d:
        grpo.run(c, d)
        return read_metrics(d)[1:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rossjax bench grpo")
    ap.add_argument("--preset", default="qwen2_30m")
    ap.add_argument("--contexts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    keys = ("time_sample_s", "time_logp_s", "time_ref_s", "time_reward_wait_s", "time_update_s",
            "time_step_s", "accelerator_idle_frac")
    out = {}
    for name, w in (("workers", args.workers), ("inline", 0)):
        rows = _run(args, w)
        out[name] = {k: float(np.mean([r[k] for r in rows])) for k in keys}
        m = out[name]
        print(f"grpo step [{name} rewards, {w} workers]: {m['time_step_s']:.2f} s = sample "
              f"{m['time_sample_s']:.2f} + old log-probs {m['time_logp_s']:.2f} + reference "
              f"{m['time_ref_s']:.2f} + reward wait {m['time_reward_wait_s']:.2f} + update "
              f"{m['time_update_s']:.2f} (+ host work); accelerator idle "
              f"{100 * m['accelerator_idle_frac']:.1f}%")
    a, b = out["workers"], out["inline"]
    print(f"idle share: {100 * a['accelerator_idle_frac']:.1f}% with workers vs "
          f"{100 * b['accelerator_idle_frac']:.1f}% inline; step time ratio inline/workers "
          f"{b['time_step_s'] / max(a['time_step_s'], 1e-9):.2f}x")
    return 0
