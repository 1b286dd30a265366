"""`rossjax bench grpo --part update`: the GRPO policy update alone, rossjax vs torch, same batch.

One run builds the model once (the preset at random init with the ASCII tokenizer's 131-token
vocabulary, written as a Hugging Face folder both sides load), samples one real GRPO batch with
`rossjax grpo`'s own sampler (`--contexts` prompts x `--group` candidates x `--new_tokens`,
T = 1; advantages from a seeded random reward), then times, alternating, the compiled rossjax
update (`grpo_step.StepFns.update` as `rossjax grpo` builds it: on-policy, beta 0, token-mean
ppo-clip, entropy metric, global-norm clip 1, AdamW; host->device copy of the rows included) and
the torch step on the very same rows: transformers forward (sdpa, padding masked), log-softmax
gather, the same clipped surrogate with the old log-probs detached (TRL's on-policy path), the
entropy TRL logs, backward, clip_grad_norm_ 1, torch AdamW. Both start from the same weights,
so their first loss and gradient norm are printed side by side: they must agree.

Prints the median seconds of each over `--repeats` alternating pairs (after a warm-up of each)
and the ratio torch / rossjax: on a machine others load too, medians of interleaved pairs are
the figure to quote, not one timing. CPU seconds (all threads) are printed too: on a shared
machine they move far less with the load than wall time does.

Where the update's time goes (profiled 2026-12-02, 2-core CPU, 64 x 144 batch): nothing is
recomputed (remat off; the chunked loss's [b, chunk, 131] logits are recomputed in the backward
but cost < 0.1%), the state is donated, the one host sync is the metrics' device_get, and the
batch length (grpo_step.batch_length(prompt + max_new) = 144 for every gen:arith step) does not change
between steps, so there is one compile. The row-wise step is matmul-bound: XLA's cost analysis
counts 1.41 TFLOP (6 x 24.2M params x 9,216 positions + attention, the textbook count), and
XLA:CPU's f32 dot runs ~80 GFLOP per CPU-second against torch/MKL's ~110 (oneDNN/XNNPACK flags
change nothing), which left it at 0.75x torch. Each group's G rows repeat the same ~80-token
prompt, so the update now runs it once (grpo_step.shared_prompt_logprobs: the prompt prefilled
into a KV cache its 8 completions continue; same log-probs and gradient): XLA counts 0.72
TFLOP for the log-probs' forward + backward, and the step takes 4.58 s / 8.8 CPU s against
torch's 6.84 s / 13.6 CPU s (1.49x wall, 1.55x CPU; load 6-14, 2026-12-02). Under heavy load wall time tracks CPU time (one core left): quote CPU seconds then.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np


def _config(args, folder: str):
    from rossjax.train.rl import grpo

    c = grpo.default_config()
    c.tokenizer = folder
    c.model.path, c.model.dtype, c.model.remat_policy = folder, "float32", "none"
    c.data.tasks = "gen:arith"
    c.grpo.steps, c.grpo.contexts, c.grpo.group_size = 2, args.contexts, args.group
    c.grpo.max_new_tokens, c.grpo.beta, c.grpo.temperature = args.new_tokens, 0.0, 1.0
    c.grpo.micro_batches, c.grpo.num_iterations = 1, 1
    c.grpo.pack_completions = bool(args.pack)
    c.optim.peak_lr = c.optim.end_lr = args.lr
    c.reward.functions, c.reward.workers = ("contains",), 0
    c.mesh.num_devices = 1
    return c


def _rows(run, args) -> dict:
    """One batch as `rossjax grpo` builds it (real sampled completions, stop tokens included)."""
    from rossjax.train.rl import grpo_step, rollout

    tasks = rollout.TaskSource("gen:arith", 0).next(args.contexts)
    state = run.new_state()
    sampled = run.sample(run.policy(state), tasks, 0)
    b = sampled["batch"]
    zeros = np.zeros(b["mask"].shape, np.float32)
    reward = np.random.default_rng(0).random(len(b["mask"]))
    from rossjax.train.rl import grpo_losses

    adv = np.asarray(grpo_losses.group_advantages(reward, args.group, "mean"), np.float32)
    rows = {**{k: b[k] for k in grpo_step.BATCH_KEYS}, "old_logp": zeros, "ref_logp": zeros,
            "is_weights": zeros, "sampler_logp": b["sampler_logp"], "adv": adv}
    return state, rows


class _Torch:
    """The torch update on the same rows (see module doc)."""

    def __init__(self, folder: str, rows: dict, lr: float, ocfg):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                          attn_implementation="sdpa")
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(ocfg.b1, ocfg.b2),
                                     eps=ocfg.eps, weight_decay=ocfg.weight_decay)
        self.clip = float(ocfg.clip_norm)
        t = lambda k, dt=torch.long: torch.tensor(np.asarray(rows[k]), dtype=dt)
        self.ids, self.pos, self.tgt = t("tokens"), t("positions"), t("targets")
        self.attn = t("segment_ids") > 0
        self.mask = t("mask", torch.float32)
        self.adv = torch.tensor(rows["adv"], dtype=torch.float32)[:, None]

    def step(self):
        torch = self.torch
        logits = self.model(input_ids=self.ids, attention_mask=self.attn.long(),
                            position_ids=self.pos).logits.float()
        lsm = torch.log_softmax(logits, dim=-1)
        logp = lsm.gather(-1, self.tgt[..., None])[..., 0]
        with torch.no_grad():
            entropy = -(lsm.exp() * lsm).sum(-1)
            ent = float((entropy * self.mask).sum() / self.mask.sum().clamp(min=1))
        ratio = torch.exp(logp - logp.detach())
        pg = -torch.minimum(ratio * self.adv, torch.clamp(ratio, 0.8, 1.2) * self.adv)
        loss = (pg * self.mask).sum() / self.mask.sum().clamp(min=1)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach()), float(gnorm), ent


def run(args) -> int:
    import jax

    from rossjax.bench.grpo_trl import _model_folder
    from rossjax.train.rl import grpo_setup

    if args.repeats < 1:
        from rossjax.errors import UsageError

        raise UsageError("rossjax bench grpo --part update: --repeats must be at least 1.")
    with tempfile.TemporaryDirectory() as d:
        folder = _model_folder(args, os.path.join(d, "model"))
        c = _config(args, folder)
        r = grpo_setup.Run(c, os.path.join(d, "run"), step_cache=grpo_setup.StepCache())
        state, rows = _rows(r, args)
        peer = _Torch(folder, rows, args.lr, c.optim)
        fns = r.fns

        def ours():
            nonlocal state
            state, m = fns.update(state, r.base, fns.put_rows(rows))
            return jax.device_get(m)

        from rossjax.bench import compare

        put = fns.put_rows(rows)
        shared, fed = fns.update_inputs(put)
        t0 = time.perf_counter()
        m0 = ours()   # compiles
        compile_s = time.perf_counter() - t0
        # the program `ours` runs, compiled once more for XLA's count (never run)
        work = compare.xla_work(fns._update[shared].lower(state, r.base, fed).compile())
        p0, peer_work = compare.torch_work(peer.step)   # also the warm-up, untimed
        ta, tb, ca, cb = [], [], [], []
        for _ in range(args.repeats):
            for fn, wall, cpu in ((ours, ta, ca), (peer.step, tb, cb)):
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
        r.workers.close()
    a, b = statistics.median(ta), statistics.median(tb)
    med = statistics.median
    mask = rows["mask"]
    print(f"bench grpo --part update: {args.preset} (vocab 131), {len(mask)} rows x "
          f"{mask.shape[1]} positions ({int(mask.sum())} completion tokens), on-policy, beta 0, "
          f"AdamW + clip 1")
    print(f"  first update   rossjax loss {float(m0['loss']):.6f} grad-norm "
          f"{float(m0['grad_norm']):.6f} entropy {float(m0['entropy']):.4f} | torch loss "
          f"{p0[0]:.6f} grad-norm {p0[1]:.6f} entropy {p0[2]:.4f}")
    print("  " + compare.settings_line(
        rossjax={"remat": c.model.remat_policy, "micro-batches": c.grpo.micro_batches,
                 "dtype": c.model.dtype, "shared-prompt pass":
                 {"packed": "on, completions packed", True: "on"}.get(shared, "off"),
                 "XLA threads": compare.xla_threads()},
        torch={"gradient checkpointing": "off", "micro-batches": 1, "dtype": "float32",
               "threads": peer.torch.get_num_threads()}))
    print(compare.work_line("fwd + bwd + AdamW", work, peer_work, "torch", unit="update"))
    print(f"  rossjax update {a:7.3f} s, {med(ca):7.3f} CPU s (median of {len(ta)}; compile + "
          f"first {compile_s:.1f} s; all: {', '.join(f'{x:.2f}' for x in ta)})")
    print(f"  torch update   {b:7.3f} s, {med(cb):7.3f} CPU s (median of {len(tb)}; all: "
          f"{', '.join(f'{x:.2f}' for x in tb)})")
    # Per pair, then the median: a pair's two halves ran under about the same load.
    pairs = med([y / x for x, y in zip(ta, tb)])
    print(f"  ratio {pairs:.2f}x wall, {med(cb) / med(ca):.2f}x CPU time (torch / rossjax, "
          f"median over pairs; target >= 1)")
    # same weights, same rows: the first update's loss and gradient norm must agree
    return compare.verdict("bench grpo --part update", [
        compare.close("first update's loss", float(m0["loss"]), p0[0], rtol=0.0, atol=args.atol),
        compare.close("first update's gradient norm", float(m0["grad_norm"]), p0[1],
                      rtol=args.rtol)])
