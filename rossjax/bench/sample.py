"""`rossjax bench sample`: greedy generation, rossjax vs transformers `generate`, same weights.

The ~30M Qwen2-shaped preset (d 512, 8 layers, 8 heads, 2 KV heads, ffn 1536, vocab 8192),
random init, written with save_hf so transformers loads exactly the same weights. Batch of
8 prompts x 64 tokens, 128 new tokens, greedy, fp32, no stop token. Both sides get one warm-up
call (rossjax: compilation; torch: allocator/kernels), then the best of `--repeats` timed runs.
Prints new tokens/s for both, the ratio, and whether the two outputs agree token for token.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rossjax bench sample")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt_len", type=int, default=64)
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--preset", default="qwen2_30m")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    args = ap.parse_args(argv)

    import jax
    import torch
    from transformers import AutoModelForCausalLM

    from rossjax.models import get_preset, init_params, save_hf
    from rossjax.sample import generate

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = get_preset(args.preset)
    params = init_params(cfg, jax.random.PRNGKey(0))
    prompts = np.random.RandomState(0).randint(1, cfg.vocab_size, (args.batch, args.prompt_len))
    n_new = args.batch * args.new_tokens

    def run_rossjax():
        return generate(cfg, params, prompts.tolist(), args.new_tokens)

    res = run_rossjax()  # compile
    t_rj = min(_timed(run_rossjax) for _ in range(args.repeats))

    with tempfile.TemporaryDirectory() as d:
        save_hf(cfg, params, d)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    inp = torch.tensor(prompts)

    def run_hf():
        with torch.no_grad():  # equal-length prompts: no padding, so no attention-mask quirks
            return model.generate(inp, attention_mask=torch.ones_like(inp),
                                  max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                  do_sample=False)

    out = run_hf()  # warm-up
    t_hf = min(_timed(run_hf) for _ in range(args.repeats))
    hf_tokens = out[:, args.prompt_len:].numpy()
    agree = float(np.mean(hf_tokens == res.tokens))

    print(f"bench sample: {args.preset}, {args.batch} prompts x {args.prompt_len} tokens, "
          f"{args.new_tokens} new tokens greedy, fp32, {jax.devices()[0].platform}")
    print(f"  rossjax      {n_new / t_rj:10.1f} new tok/s  ({t_rj:.3f} s)")
    print(f"  transformers {n_new / t_hf:10.1f} new tok/s  ({t_hf:.3f} s, torch threads "
          f"{torch.get_num_threads()})")
    print(f"  ratio {t_hf / t_rj:.2f}x (target >= 3x); greedy tokens agree on {agree:.1%}")
    return 0


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
