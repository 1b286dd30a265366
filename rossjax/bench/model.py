"""`rossjax bench model`: one full training step (forward, backward, AdamW), rossjax vs PyTorch.

Both sides train the same ~30M Qwen2-shaped preset (d 512, 8 layers, 8 heads, 2 KV heads,
ffn 1536, vocab 8192; transformers gets rossjax's initial weights through save_hf) on the same
batch (default 8 x 512 tokens) with next-token cross-entropy over full fp32 logits and plain
AdamW (lr 1e-4, no clipping). Each side gets `--warmup` untimed steps (rossjax: compilation),
then `--steps` timed steps; the figure is tokens per second over the timed steps.

It also times a plain jitted fp32 matmul (`--matmul` square) between the timed steps (so both
see the same load on a shared machine) and reports
rossjax's achieved FLOP/s as a fraction of it, counting 6 x (matmul params) x tokens plus
attention scores and values (12 x b x s^2 x heads x head_dim x layers; the full square is
computed, so causality is not halved).
Takes ~1-3 minutes on a laptop-class CPU at the default size. `--device` (bench/model_device.py)
measures a ~0.5B model on an accelerator instead (e.g. `--device --batch 8 --seq 2048`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from rossjax.bench.flops import flops_per_step


def _matmul_timer(n: int):
    """A function that times one jitted n x n fp32 matmul and returns its FLOP/s."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, b).block_until_ready()

    def rate():
        t = time.perf_counter()
        mm(a, b).block_until_ready()
        return 2.0 * n ** 3 / (time.perf_counter() - t)
    return rate


def _rossjax_step(cfg, params, tokens, steps, warmup, matmul_rate):
    import jax
    import jax.numpy as jnp
    import optax

    from rossjax.models import compute_logits, hidden_states

    opt = optax.adamw(1e-4, b1=0.9, b2=0.98, weight_decay=0.0)

    def loss_fn(p, toks):
        h = hidden_states(cfg, p, toks[:, :-1])
        logits = compute_logits(cfg, p, h)
        # one-hot pick instead of take_along_axis: its gradient is a scatter, slow on CPU
        picked = jnp.sum(logits * jax.nn.one_hot(toks[:, 1:], logits.shape[-1], dtype=logits.dtype), -1)
        return (jax.nn.logsumexp(logits, axis=-1) - picked).mean()

    @jax.jit
    def step(p, s, toks):
        loss, g = jax.value_and_grad(loss_fn)(p, toks)
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s, loss

    step = jax.jit(step.__wrapped__, donate_argnums=(0, 1))
    state = opt.init(params)
    toks = jnp.asarray(tokens)
    losses, times, mm = [], [], []
    for i in range(warmup + steps):
        t = time.perf_counter()
        params, state, loss = step(params, state, toks)
        loss.block_until_ready()
        if i >= warmup:
            times.append(time.perf_counter() - t)
            # The machine may be shared: sample the matmul rate between steps, under the same
            # load, rather than once before them.
            mm.extend(matmul_rate() for _ in range(3))
        losses.append(float(loss))
    return times, losses, mm


def _torch_step(model, tokens, steps, warmup):
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), weight_decay=0.0)
    toks = torch.tensor(tokens)
    model.train()
    losses, times = [], []
    for i in range(warmup + steps):
        t = time.perf_counter()
        logits = model(toks[:, :-1]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), toks[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t)
        losses.append(loss.item())
    return times, losses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rossjax bench model", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2_30m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512, help="tokens per row (the model sees seq - 1)")
    ap.add_argument("--layers", type=int, default=0, help="override n_layers (0 = preset)")
    ap.add_argument("--d_model", type=int, default=0, help="override d_model (0 = preset)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--matmul", type=int, default=2048, help="square size of the matmul reference")
    ap.add_argument("--remat", default="none", help="rossjax remat policy")
    ap.add_argument("--no_scan", action="store_true", help="unrolled layer loop instead of lax.scan")
    ap.add_argument("--skip_torch", action="store_true")
    ap.add_argument("--atol", type=float, default=1e-3,
                    help="first-step losses of both sides must agree to this")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--device", action="store_true",
                    help="accelerator mode (model_device.py): ~0.5B Qwen2 shape, bf16, tokens/s and "
                         "MFU vs the chip's peak; on CPU it says there is no accelerator")
    ap.add_argument("--attention", default="auto", help="--device: attention_impl")
    ap.add_argument("--peak_tflops", type=float, default=0.0,
                    help="--device: peak bf16 TFLOP/s when the device kind is not in the table")
    args = ap.parse_args(argv)
    if args.device:
        from rossjax.bench import model_device

        return model_device.run(args)

    import jax

    from rossjax.models import get_preset, init_params, save_hf

    over = {"remat_policy": args.remat, "scan_layers": not args.no_scan}
    if args.layers:
        over["n_layers"] = args.layers
    if args.d_model:
        over["d_model"] = args.d_model
    cfg = get_preset(args.preset, **over)
    params = init_params(cfg, jax.random.key(0))
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (args.batch, args.seq + 1))
    n_tok = args.batch * args.seq
    flops = flops_per_step(cfg, args.batch, args.seq)
    print(f"model: {args.preset} {cfg.num_params() / 1e6:.1f}M params, {cfg.n_layers} layers, "
          f"d {cfg.d_model}; batch {args.batch} x {args.seq} tokens; {jax.devices()[0].platform} "
          f"x{jax.device_count()}; {flops / 1e9:.1f} GFLOP/step")

    torch_model = None
    if not args.skip_torch:
        import torch
        from transformers import AutoModelForCausalLM

        if args.threads:
            torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory() as d:
            save_hf(cfg, params, d)
            torch_model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)

    rj_times, rj_losses, mm_rates = _rossjax_step(cfg, params, tokens, args.steps, args.warmup,
                                                  _matmul_timer(args.matmul))
    mm_rate = statistics.median(mm_rates)
    rj = n_tok / statistics.median(rj_times)
    rj_flops = flops / statistics.median(rj_times)
    print(f"matmul {args.matmul}^2 fp32 (jit):  {mm_rate / 1e9:8.1f} GFLOP/s (median of 3 samples after "
          f"each timed step)")
    print(f"rossjax train step: {statistics.median(rj_times) * 1e3:8.1f} ms  {rj:9.0f} tokens/s  "
          f"{rj_flops / 1e9:6.1f} GFLOP/s = {rj_flops / mm_rate:.0%} of matmul  "
          f"(loss {rj_losses[0]:.3f} -> {rj_losses[-1]:.3f})")
    if torch_model is not None:
        import torch
        th_times, th_losses = _torch_step(torch_model, tokens, args.steps, args.warmup)
        th = n_tok / statistics.median(th_times)
        print(f"torch   train step: {statistics.median(th_times) * 1e3:8.1f} ms  {th:9.0f} tokens/s  "
              f"(torch {torch.__version__}, {torch.get_num_threads()} threads, "
              f"loss {th_losses[0]:.3f} -> {th_losses[-1]:.3f})")
        from rossjax.bench import compare

        print(compare.settings_line(
            rossjax={"remat": args.remat, "micro-batches": 1, "dtype": "float32",
                     "XLA threads": compare.xla_threads()},
            torch={"gradient checkpointing": "off", "micro-batches": 1, "dtype": "float32",
                   "threads": torch.get_num_threads()}))
        print(f"ratio rossjax / torch: {rj / th:.2f}x")
        # same weights, same batch: the first step's loss must agree
        return compare.verdict("bench model", [
            compare.close("first-step loss", rj_losses[0], th_losses[0], rtol=0.0,
                          atol=args.atol)])
    return 0
