"""`rossjax bench sft`: SFT step throughput/MFU and the long-row memory check.

1. Throughput: full training steps (forward, backward, AdamW) of the ~30M Qwen2-shaped preset
   on packed 2,048-token rows; prints tokens/s, supervised tokens/s and MFU relative to a jitted
   fp32 matmul measured in the same process (the CPU's achievable FLOP/s, not a datasheet peak).
   The peer: the same model in Hugging Face transformers (PyTorch), the same packed rows (its
   attention mask is block-diagonal from the restarting position_ids, as rossjax's segment ids
   make it), the same micro-batches accumulated before one AdamW step, gradient checkpointing
   on exactly when rossjax's remat is; the ratio of the two step times is printed.
2. Memory: one step at batch 1 x 8,192 tokens with Qwen's vocabulary (151,936) and the chunked
   loss; prints the peak resident memory while the steps run (after compilation, whose freed
   heap is handed back first) and the process peak including compilation (target < 3 GB;
   unchunked float32 logits alone would take 8192 x 151936 x 4 B = 5 GB).
Each part runs in a fresh child process on one CPU device so the peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def packed_rows(rng, rows: int, seq: int, vocab: int):
    """Rows packed with documents of 200-1,200 tokens; the second half of each is supervised."""
    out = {k: np.zeros((rows, seq), np.int32) for k in ("input_ids", "loss_mask", "segment_ids", "positions")}
    for r in range(rows):
        off, seg = 0, 1
        while off < seq:
            n = min(int(rng.integers(200, 1200)), seq - off)
            out["input_ids"][r, off:off + n] = rng.integers(0, vocab, n)
            out["loss_mask"][r, off + n // 2:off + n] = 1
            out["segment_ids"][r, off:off + n] = seg
            out["positions"][r, off:off + n] = np.arange(n)
            off, seg = off + n, seg + 1
    return out


def _loss_only(args) -> dict:
    """Peak RSS of the chunked loss + its backward alone at 1 x 8192 x 151,936 (no model)."""
    import resource

    import jax
    import jax.numpy as jnp

    from rossjax.train import losses

    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(1, 8192, 512)).astype(np.float32))
    w = jnp.asarray((rng.normal(size=(512, 151_936)) * 0.02).astype(np.float32))
    t = jnp.asarray(rng.integers(0, 151_936, (1, 8192)).astype(np.int32))
    m = jnp.ones((1, 8192), jnp.float32)
    f = jax.jit(jax.value_and_grad(
        lambda h, w: losses.chunked_masked_nll(h, w, t, m, args.chunk)[0], argnums=(0, 1)))
    t0 = time.perf_counter()
    jax.block_until_ready(f(h, w))
    return {"part": "loss", "step_s": time.perf_counter() - t0,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}


def _torch_peer(args) -> dict:
    """The transformers step on the throughput part's rows: forward, backward, AdamW."""
    import tempfile

    import jax
    import torch

    from rossjax import models
    from rossjax.train import optim

    cfg = models.get_preset("qwen2_30m")
    with tempfile.TemporaryDirectory() as d:
        models.save_hf(cfg, models.init_params(cfg, jax.random.key(0)), d)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                     attn_implementation="sdpa")
    if args.remat != "none":
        model.gradient_checkpointing_enable()
    model.train()
    ocfg = optim.default_config()
    opt = torch.optim.AdamW(model.parameters(), lr=ocfg.peak_lr, eps=ocfg.eps,
                            betas=(ocfg.b1, ocfg.b2), weight_decay=ocfg.weight_decay)
    rows = packed_rows(np.random.default_rng(0), args.rows, args.seq, cfg.vocab_size)
    ids = torch.tensor(rows["input_ids"], dtype=torch.long)
    pos = torch.tensor(rows["positions"], dtype=torch.long)
    # rossjax supervises token t+1 where loss_mask[t+1] (same shift as its loss): -100 elsewhere,
    # and never across a document boundary.
    labels = ids.clone()
    keep = torch.tensor(rows["loss_mask"] > 0)
    labels[~keep] = -100
    per = args.rows // args.micro

    def step():
        # rossjax's loss: the masked NLL summed over the global batch / its supervised tokens;
        # each micro-batch's share is summed back here (its last share alone is 1/micro of it).
        n_sup, total = int(keep[:, 1:].sum()), 0.0
        for i in range(args.micro):
            sl = slice(i * per, (i + 1) * per)
            logits = model(input_ids=ids[sl], position_ids=pos[sl]).logits
            lab = labels[sl, 1:]
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(), lab.reshape(-1),
                ignore_index=-100, reduction="sum") / n_sup
            loss.backward()
            total += float(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    # also the warm-up (allocator, autograd graph caches); counted, so the counters' overhead
    # never reaches a timed step
    if args.skip_work:
        first_loss, work = step(), None
    else:
        from rossjax.bench import compare

        first_loss, work = compare.torch_work(step)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dt = (time.perf_counter() - t0) / args.steps
    return {"part": "peer", "step_s": dt, "tokens_per_s": args.rows * args.seq / dt,
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "checkpointing": args.remat != "none", "first_loss": first_loss, "work": work,
            "tokens": args.rows * args.seq}


def _child(part: str, args) -> dict:
    import jax

    if part == "loss":
        return _loss_only(args)
    if part == "peer":
        return _torch_peer(args)

    from rossjax import models, sharding
    from rossjax.models import shardings as model_shardings
    from rossjax.train import metrics, optim, state as state_lib
    from rossjax.train.sft import step as sft

    if part == "throughput":
        cfg = models.get_preset("qwen2_30m", remat_policy=args.remat)
        rows, seq, micro, chunk = args.rows, args.seq, args.micro, 1024
    else:
        cfg = models.get_preset("qwen2_30m", vocab_size=151_936, remat_policy="full")
        rows, seq, micro, chunk = 1, 8192, 1, args.chunk
    mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
    ocfg = optim.default_config()
    opt, sched = optim.make_optimizer(ocfg, 1000)
    p_shard = model_shardings.param_shardings(cfg, mesh)
    params = model_shardings.init_params_sharded(cfg, jax.random.PRNGKey(0), mesh)
    sh = state_lib.state_shardings(p_shard, opt, jax.eval_shape(lambda: params), mesh)
    state = state_lib.init_state(params, opt, sh)
    bs = sharding.batch_sharding(mesh, 2, shape=(rows, seq))
    step = sft.make_train_step(cfg, opt, sched, mesh=mesh, shardings=sh, batch_sharding=bs,
                               micro_batches=micro, chunk_size=chunk)
    batch = jax.device_put(packed_rows(np.random.default_rng(0), rows, seq, cfg.vocab_size), bs)
    t0 = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    ma = compiled.memory_analysis()
    predicted = None if ma is None else (ma.temp_size_in_bytes + ma.argument_size_in_bytes
                                         + ma.output_size_in_bytes - ma.alias_size_in_bytes) / 1e9
    if predicted is not None and predicted > args.max_gb:
        # Running it would only get the machine's OOM killer involved: report XLA's own figure.
        return {"part": part, "params_m": cfg.num_params() / 1e6, "ran": False,
                "predicted_gb": predicted, "temp_gb": ma.temp_size_in_bytes / 1e9}
    if part == "memory":
        # The compiler's freed heap would otherwise stay resident (glibc keeps it) and count
        # towards the step; then measure the step's own high-water mark from here on.
        _release_heap()
        _reset_peak()
    # Run the executable compiled above: calling `step` again would compile (and hold) a second copy.
    state, m = compiled(state, batch)
    first_loss = float(m["loss"])
    compile_s = time.perf_counter() - t0
    n = args.steps if part == "throughput" else 1
    t0 = time.perf_counter()
    for _ in range(n):
        state, m = compiled(state, batch)
    jax.block_until_ready(m)
    dt = (time.perf_counter() - t0) / n
    tokens, sup = float(m["tokens"]), float(m["supervised_tokens"])
    out = {"part": part, "params_m": cfg.num_params() / 1e6, "rows": rows, "seq": seq, "ran": True,
           "predicted_gb": predicted,
           "step_s": dt, "compile_s": compile_s, "loss": float(m["loss"]),
           "first_loss": first_loss}
    if part == "throughput":
        if not args.skip_work:
            out["work"] = _xla_work(cfg, opt, sched, mesh, sh, bs, state, batch, seq)
        peak = metrics.measure_matmul_flops(2048)
        fpt = metrics.train_flops_per_token(cfg, seq)
        out.update(tokens_per_s=tokens / dt, supervised_tokens_per_s=sup / dt,
                   matmul_gflops=peak / 1e9, model_gflops=tokens * fpt / dt / 1e9,
                   mfu=tokens * fpt / dt / peak)
    import resource

    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    if part == "memory":
        out["process_peak_rss_gb"] = out["peak_rss_gb"]    # compilation included
        out["peak_rss_gb"] = _vm_hwm_gb() or out["peak_rss_gb"]
    return out


def _xla_work(cfg, opt, sched, mesh, sh, bs, state, batch, seq) -> dict:
    """FLOPs and bytes of the same step compiled loop-free (layers unrolled, one micro-batch,
    one loss chunk, dense attention: the same arithmetic; see bench/compare.py), never run."""
    from rossjax.bench import compare
    from rossjax.train.sft import step as sft

    flat = sft.make_train_step(cfg.replace(scan_layers=False, attention_impl="dense"), opt, sched,
                               mesh=mesh, shardings=sh, batch_sharding=bs, micro_batches=1,
                               chunk_size=seq)
    return compare.xla_work(flat.lower(state, batch).compile())


def _release_heap():
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak():
    """Linux: writing 5 to clear_refs resets VmHWM, the peak resident set size."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _vm_hwm_gb():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        return None
    return None


def _run_child(part: str, argv) -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "rossjax.bench.sft", f"--_part={part}", *argv],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench sft {part} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _parser():
    p = argparse.ArgumentParser(prog="rossjax bench sft")
    p.add_argument("--rows", type=int, default=4, help="packed rows per step")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--remat", default="full")
    p.add_argument("--chunk", type=int, default=256, help="loss chunk for the memory check")
    p.add_argument("--skip_memory", action="store_true")
    p.add_argument("--skip_peer", action="store_true", help="do not run the transformers step")
    p.add_argument("--max_gb", type=float, default=8.0,
                   help="do not run the memory step if XLA predicts more than this")
    p.add_argument("--skip_work", action="store_true",
                   help="do not count FLOPs and bytes (XLA's cost analysis, torch's counters)")
    p.add_argument("--rtol", type=float, default=1e-4,
                   help="first-step losses of both sides must agree to this (relative)")
    p.add_argument("--_part", default="", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args._part:
        print(json.dumps(_child(args._part, args)))
        return 0
    t = _run_child("throughput", argv)
    if not t["ran"]:
        print(f"bench sft: XLA predicts {t['predicted_gb']:.1f} GB for the throughput step > --max_gb "
              f"{args.max_gb}; lower --rows or raise --micro")
        return 1
    print(f"bench sft: qwen2_30m ({t['params_m']:.1f}M params), {t['rows']} x {t['seq']} packed rows, "
          f"{t['step_s']:.2f} s/step (compile {t['compile_s']:.0f} s)")
    print(f"  tokens/s             {t['tokens_per_s']:10.0f}")
    print(f"  supervised tokens/s  {t['supervised_tokens_per_s']:10.0f}")
    print(f"  model FLOP/s         {t['model_gflops']:10.1f} GFLOP/s")
    print(f"  jitted matmul        {t['matmul_gflops']:10.1f} GFLOP/s (same run)")
    print(f"  MFU vs matmul        {t['mfu']:10.1%}")
    failures = []
    if not args.skip_peer:
        from rossjax.bench import compare

        pr = _run_child("peer", argv)
        ck = "on" if pr["checkpointing"] else "off"
        print(f"bench sft peer: transformers (torch {pr['torch']}, {pr['threads']} threads, "
              f"gradient checkpointing {ck}) on the same packed rows: {pr['step_s']:.2f} s/step, "
              f"{pr['tokens_per_s']:.0f} tokens/s")
        print("  " + compare.settings_line(
            rossjax={"remat": args.remat, "micro-batches": args.micro, "dtype": "float32",
                     "XLA threads": compare.xla_threads()},
            torch={"gradient checkpointing": ck, "micro-batches": args.micro,
                   "dtype": "float32", "threads": pr["threads"]}))
        print(f"  first-step loss: rossjax {t['first_loss']:.6f}, torch {pr['first_loss']:.6f} "
              f"(same parameters, same rows; masked NLL over the global batch / supervised "
              f"tokens; tolerance {args.rtol:g} relative)")
        failures.append(compare.close("first-step loss", t["first_loss"], pr["first_loss"],
                                      rtol=args.rtol))
        if t.get("work") and pr.get("work"):
            print(compare.work_line("forward + backward + AdamW", t["work"], pr["work"], "torch",
                                    per=pr["tokens"], unit="token"))
        print(f"  ratio rossjax / torch: {pr['step_s'] / t['step_s']:.2f}x")
    if not args.skip_memory:
        lo = _run_child("loss", argv)
        print(f"bench sft memory: chunked loss + backward alone, 1 x 8192 x vocab 151,936 (chunk "
              f"{args.chunk}): peak RSS {lo['peak_rss_gb']:.2f} GB")
        m = _run_child("memory", argv)
        head = (f"bench sft memory: full step at 1 x 8192 tokens, vocab 151,936 ({m['params_m']:.0f}M "
                f"params, loss chunk {args.chunk}):")
        if not m["ran"]:
            print(f"{head} XLA predicts {m['predicted_gb']:.1f} GB ({m['temp_gb']:.1f} GB temporaries) "
                  f"> --max_gb {args.max_gb}; not run (target < 3 GB: OVER)")
        else:
            verdict = "OK" if m["peak_rss_gb"] < 3.0 else "OVER"
            print(f"{head} peak RSS during the steps {m['peak_rss_gb']:.2f} GB (process peak incl. "
                  f"compilation {m['process_peak_rss_gb']:.2f} GB), XLA predicted "
                  f"{m['predicted_gb']:.2f} GB (target < 3 GB: {verdict}); {m['step_s']:.1f} s/step")
    if args.skip_peer:
        return 0
    from rossjax.bench import compare

    return compare.verdict("bench sft", failures)


if __name__ == "__main__":
    sys.exit(main())
