"""`rossjax bench model --device`: the SFT step of a ~0.5B Qwen2-shaped model on one accelerator.

tokens/s and MFU (model FLOPs per second over the chip's peak dense bf16 FLOP/s; recomputation
under remat is not counted) for rossjax with bf16 compute and fp32 params (the training default),
the SFT loss path (chunked LM head) and AdamW; then, when torch sees the same GPU, the same step
in PyTorch (transformers, bf16 autocast over fp32 params, SDPA attention) on the same weights and
batch. On a machine without an accelerator it says so and exits 0.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import numpy as np

from rossjax.bench.flops import flops_per_step

# Peak dense bf16 FLOP/s per chip, by a substring of jax's device_kind (lower case).
PEAK_BF16 = (("v6", 918e12), ("v5p", 459e12), ("v5", 197e12), ("v4", 275e12),
             ("h200", 989e12), ("h100", 989e12), ("gh200", 989e12), ("a100", 312e12),
             ("l40s", 362e12), ("l4", 121e12), ("a10", 125e12))


def peak_flops(device_kind: str) -> float | None:
    kind = device_kind.lower()
    return next((p for key, p in PEAK_BF16 if key in kind), None)


def qwen2_half_b(remat: str, attention_impl: str):
    """Qwen2.5-0.5B's shape (494M params, tied embeddings)."""
    from rossjax.models import ModelConfig

    return ModelConfig(model_type="qwen2", vocab_size=151_936, d_model=896, n_layers=24, n_heads=14,
                       n_kv_heads=2, head_dim=64, ffn_dim=4864, qkv_bias=True, tie_embeddings=True,
                       rope_theta=1_000_000.0, max_position_embeddings=32_768, dtype="bfloat16",
                       param_dtype="float32", remat_policy=remat, attention_impl=attention_impl)


def _rossjax(cfg, params, tokens, steps, warmup, chunk):
    import jax
    import jax.numpy as jnp
    import optax

    from rossjax.models import hidden_states
    from rossjax.train import losses

    opt = optax.adamw(1e-5, b1=0.9, b2=0.98, weight_decay=0.0)

    def loss_fn(p, toks):
        h = hidden_states(cfg, p, toks[:, :-1])
        w, vocab_major = losses.head_weights(cfg, p)
        total, count = losses.chunked_masked_nll(h, w, toks[:, 1:], jnp.ones(h.shape[:2]), chunk,
                                                 vocab_major)
        return total / count

    def step(p, s, toks):
        loss, g = jax.value_and_grad(loss_fn)(p, toks)
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s, loss

    step = jax.jit(step, donate_argnums=(0, 1))
    state, toks = opt.init(params), jnp.asarray(tokens)
    times, losses_ = [], []
    for i in range(warmup + steps):
        t = time.perf_counter()
        params, state, loss = step(params, state, toks)
        losses_.append(float(loss))                     # blocks until the step is done
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return times, losses_


def _torch(model, tokens, steps, warmup):
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.98), weight_decay=0.0)
    toks = torch.tensor(tokens, device="cuda")
    model.train()
    times, losses_ = [], []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(toks[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), toks[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses_.append(loss.item())
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return times, losses_


def run(args) -> int:
    import jax

    from rossjax.models import init_params, save_hf

    backend = jax.default_backend()
    if backend == "cpu":
        print("bench model --device: no accelerator here (jax backend: cpu); nothing measured. "
              "Run `rossjax bench model --device` on a GPU or TPU machine.")
        return 0
    dev = jax.devices()[0]
    cfg = qwen2_half_b(args.remat if args.remat != "none" else "full", args.attention)
    params = jax.device_put(init_params(cfg, jax.random.key(0)), dev)
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (args.batch, args.seq + 1))
    n_tok, flops = args.batch * args.seq, flops_per_step(cfg, args.batch, args.seq)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_flops(dev.device_kind)
    print(f"device: {dev.device_kind} ({backend}, jax {jax.__version__}); model: Qwen2-0.5B shape "
          f"{cfg.num_params() / 1e6:.0f}M params, bf16 compute / fp32 params, remat "
          f"{cfg.remat_policy}, attention {cfg.attention_impl}; batch {args.batch} x {args.seq}; "
          f"{flops / 1e12:.2f} TFLOP/step; peak bf16 "
          f"{'unknown (pass --peak_tflops)' if peak is None else f'{peak / 1e12:.0f} TFLOP/s'}")
    torch_model = None
    if not args.skip_torch and backend == "gpu":
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError:
            torch = None
        if torch is not None and torch.cuda.is_available():
            with tempfile.TemporaryDirectory() as d:
                save_hf(cfg.replace(param_dtype="float32"), jax.device_get(params), d)
                torch_model = AutoModelForCausalLM.from_pretrained(
                    d, dtype=torch.float32, attn_implementation="sdpa").cuda()
    times, losses_ = _rossjax(cfg, params, tokens, args.steps, args.warmup, 1024)
    med = statistics.median(times)
    mfu = "" if peak is None else f"  MFU {flops / med / peak:.1%}"
    print(f"rossjax step: {med * 1e3:8.1f} ms  {n_tok / med:9.0f} tokens/s{mfu}  "
          f"(loss {losses_[0]:.3f} -> {losses_[-1]:.3f})")
    if torch_model is not None:
        import torch
        th_times, th_losses = _torch(torch_model, tokens, args.steps, args.warmup)
        th = statistics.median(th_times)
        th_mfu = "" if peak is None else f"  MFU {flops / th / peak:.1%}"
        print(f"torch   step: {th * 1e3:8.1f} ms  {n_tok / th:9.0f} tokens/s{th_mfu}  "
              f"(torch {torch.__version__}, loss {th_losses[0]:.3f} -> {th_losses[-1]:.3f})")
        print(f"ratio rossjax / torch: {th / med:.2f}x")
    elif backend == "gpu":
        print("torch: no CUDA build of torch here; PyTorch side skipped.")
    return 0
