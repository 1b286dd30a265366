"""`rossjax bench sample`: greedy generation, rossjax vs transformers `generate`, same weights.

The ~30M Qwen2-shaped preset (d 512, 8 layers, 8 heads, 2 KV heads, ffn 1536, vocab 8192),
random init, written with save_hf so transformers loads exactly the same weights. Batch of
8 prompts x 64 tokens, 128 new tokens, greedy, fp32, no stop token. Both sides get one warm-up
call (rossjax: compilation; torch: allocator/kernels), then the best of `--repeats` timed runs.
Prints new tokens/s for both, the ratio, and whether the two outputs agree token for token, then
the weight-streaming floor: the same decode step's matmuls alone (fp32 weights read once per
step, no attention), timed in the same run, with the ratio a run at that floor would reach.

`--stops K` gives both sides K stop tokens, so rows end at different lengths (what GRPO and a
server see): they are taken from a first greedy run without stops, the token at a spread of
positions in different rows, so the first stops fall early, late and nowhere. Tokens/s then
count the tokens each row really generated (up to and including its stop token).
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
    ap.add_argument("--stops", type=int, default=0,
                    help="stop tokens (rows then end at different lengths; 0 = none)")
    ap.add_argument("--min_agree", type=float, default=0.95,
                    help="greedy tokens of both sides must agree on at least this share (fp32 "
                         "near-ties may flip a token, and a row diverges after it)")
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

    stop_ids = ()
    if args.stops:
        free = generate(cfg, params, prompts.tolist(), args.new_tokens)
        stop_ids = _spread_stops(free.tokens, args.stops)

    def run_rossjax():
        return generate(cfg, params, prompts.tolist(), args.new_tokens, stop_ids=stop_ids)

    res = run_rossjax()  # compile
    n_new = int(res.lengths.sum())
    t_rj = min(_timed(run_rossjax) for _ in range(args.repeats))
    generate(cfg, params, prompts.tolist(), 1)
    t_prefill = min(_timed(lambda: generate(cfg, params, prompts.tolist(), 1))
                    for _ in range(args.repeats))
    floor_step = _weight_floor(cfg, params, args.batch, args.repeats)

    with tempfile.TemporaryDirectory() as d:
        save_hf(cfg, params, d)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = list(stop_ids) or None
    model.generation_config.pad_token_id = 0
    inp = torch.tensor(prompts)
    lengths = {} if stop_ids else {"min_new_tokens": args.new_tokens}

    def run_hf():
        with torch.no_grad():  # equal-length prompts: no padding, so no attention-mask quirks
            return model.generate(inp, attention_mask=torch.ones_like(inp),
                                  max_new_tokens=args.new_tokens, do_sample=False, **lengths)

    out = run_hf()  # warm-up
    t_hf = min(_timed(run_hf) for _ in range(args.repeats))
    hf_tokens = np.zeros_like(res.tokens)
    got = out[:, args.prompt_len:].numpy()
    hf_tokens[:, :got.shape[1]] = got
    # compare each row up to its own end (after a stop both sides pad with 0)
    keep = np.arange(args.new_tokens)[None] < res.lengths[:, None]
    agree = float(np.mean((hf_tokens == res.tokens)[keep]))

    print(f"bench sample: {args.preset}, {args.batch} prompts x {args.prompt_len} tokens, "
          f"{args.new_tokens} new tokens greedy, fp32, {jax.devices()[0].platform}"
          + (f"; {len(stop_ids)} stop tokens: rows generate {res.lengths.min()}-"
             f"{res.lengths.max()} tokens ({n_new} in all)" if stop_ids else ""))
    print(f"  rossjax      {n_new / t_rj:10.1f} new tok/s  ({t_rj:.3f} s)")
    print(f"  transformers {n_new / t_hf:10.1f} new tok/s  ({t_hf:.3f} s, torch threads "
          f"{torch.get_num_threads()})")
    from rossjax.bench import compare

    print("  " + compare.settings_line(
        rossjax={"dtype": "float32", "batch": args.batch, "XLA threads": compare.xla_threads()},
        transformers={"dtype": "float32", "batch": args.batch,
                      "threads": torch.get_num_threads()}))
    print(f"  ratio {t_hf / t_rj:.2f}x (target >= 3x); greedy tokens agree on {agree:.1%}")
    # Decode is bound by streaming the fp32 weights from memory once per step: the model's
    # matmuls alone, back to back, bound what any implementation of this step can reach here.
    t_floor = t_prefill + (args.new_tokens - 1) * floor_step
    print(f"  weight-streaming floor: the decode matmuls alone take {floor_step * 1e3:.2f} ms/step "
          f"({_weight_bytes(cfg) / floor_step / 1e9:.1f} GB/s); rossjax decode "
          f"{(t_rj - t_prefill) / (args.new_tokens - 1) * 1e3:.2f} ms/step; prefill "
          f"{t_prefill * 1e3:.0f} ms; a run at the floor (no attention at all) would be "
          f"{t_hf / t_floor:.2f}x")
    return compare.verdict("bench sample", [
        compare.at_least("greedy token agreement", agree, args.min_agree)])


def _spread_stops(tokens: np.ndarray, k: int) -> tuple:
    """Up to k stop ids: row r's token at position ~ r / rows of the way along, for rows spread
    over the batch (so the first stop of a row lands anywhere from early to never)."""
    rows, width = tokens.shape
    out = []
    for i in range(rows):
        r = (i * 7919) % rows
        t = int(tokens[r, min(width - 1, 1 + (i * width) // rows)])
        if t not in out:
            out.append(t)
        if len(out) == k:
            break
    return tuple(out)


def _weight_bytes(cfg) -> int:
    d, f, hd = cfg.d_model, cfg.ffn_dim, cfg.head_dim
    layer = d * (cfg.n_heads + 2 * cfg.n_kv_heads) * hd + cfg.n_heads * hd * d + 3 * d * f
    return 4 * (cfg.n_layers * layer + d * cfg.vocab_size)


def _weight_floor(cfg, params, batch: int, repeats: int, steps: int = 64) -> float:
    """Seconds per step of a loop that does only a decode step's weight matmuls (batch rows,
    fp32, the same pre-fused per-layer buffers generate uses) and nothing else."""
    import jax
    import jax.numpy as jnp

    from rossjax.models import decode_params, lm_head

    dp = decode_params(cfg, params)
    layers = [(p["attn"]["q+k+v"]["kernel"], p["attn"]["o"]["kernel"].reshape(-1, cfg.d_model),
               p["mlp"]["gate+up"]["kernel"], p["mlp"]["down"]["kernel"]) for p in dp["layers"]]
    head = lm_head(cfg, dp)
    nq = cfg.n_heads * cfg.head_dim

    @jax.jit
    def run(layers, head, x):
        def step(_, x):
            for qkv, o, gu, down in layers:
                x = x + (x @ qkv)[:, :nq] @ o
                g = x @ gu
                x = x + (g[:, :cfg.ffn_dim] * g[:, cfg.ffn_dim:]) @ down
            return x + (x @ head)[:, :cfg.d_model] * 1e-6
        return jax.lax.fori_loop(0, steps, step, x)

    x = jnp.ones((batch, cfg.d_model), jnp.float32) * 0.01
    run(layers, head, x).block_until_ready()
    return min(_timed(lambda: run(layers, head, x).block_until_ready())
               for _ in range(repeats)) / steps


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
