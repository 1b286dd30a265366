"""`make demo`: the most complete pipeline that exists, on the embedded default data in data/.

    rossjax demo [--workdir=runs/demo] [--steps=N]

1. curate   data/rollouts/sample.jsonl: re-run the verifiers (math-verify, sandboxed code), render
            with ChatML, compile the reviewers' keep/exclude annotations into token loss masks
            with the real Qwen tokenizer; every row ends kept, withheld(reason) or invalid(reason).
2. base     a tiny random Qwen2-shaped model over the full Qwen vocabulary, saved as a Hugging
            Face folder (the stand-in for "the final checkpoint of the RL run").
3. train    ROSS masked SFT on the curated rows (loss = masked NLL summed over the batch / number
            of supervised tokens), orbax checkpoints and TensorBoard metrics in the workdir.
4. export   the trained params as a Hugging Face folder; transformers reloads it and its logits
            are compared with rossjax's.
5. look     an HTML view of one compiled mask, the loss curve as PNG, and a route-diverse
            selection over the shipped math solutions with its PCA scatter.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(argv):
    from rossjax import cli

    rc = cli.main(argv)
    if rc:
        raise SystemExit(f"rossjax demo: step `rossjax {' '.join(argv[:1])}` failed (exit {rc}).")


def _config(name):
    return os.path.join(ROOT, "configs", name)


def _base_model(out: str, vocab_size: int):
    import jax

    from rossjax import models

    cfg = models.get_preset("tiny_qwen2", vocab_size=vocab_size)
    models.save_hf(cfg, models.init_params(cfg, jax.random.key(0)), out)
    return cfg


def _export_parity(hf_dir: str, vocab_size: int) -> float:
    """Max |logits| difference between rossjax and transformers on the exported folder."""
    import torch
    import transformers

    from rossjax import models

    cfg, params = models.load_hf(hf_dir)
    tokens = np.random.default_rng(0).integers(0, vocab_size, (2, 24)).astype(np.int32)
    ours = np.asarray(models.forward(cfg, params, tokens)[0])
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(tokens).long()).logits.numpy()
    return float(np.abs(ours - theirs).max())


def _loss_plot(workdir: str) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rossjax.train.metrics import read_metrics

    rows = read_metrics(workdir)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], marker="o", ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel("masked NLL / supervised token")
    ax.set_title("ROSS relearning (demo)")
    fig.tight_layout()
    out = os.path.join(workdir, "loss.png")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv) -> int:
    from absl import flags as absl_flags

    from rossjax.cli import parse_config

    def extra(fv):
        absl_flags.DEFINE_integer("steps", 30, "Optimizer steps of the masked SFT stage.",
                                  flag_values=fv)

    _, flags, _ = parse_config(argv, extra_flags=extra)
    wd = os.path.abspath(flags.workdir or "runs/demo")
    os.makedirs(wd, exist_ok=True)
    t0 = time.time()
    curated, sft, hf_out = (os.path.join(wd, d) for d in ("curated", "sft", "export_hf"))

    print("== 1/5 curate the shipped rollouts (re-verify, compile masks)")
    _run(["curate", f"--config={_config('curate.py')}",
          f"--config.input={os.path.join(ROOT, 'data', 'rollouts', 'sample.jsonl')}",
          f"--config.output={curated}", "--config.verify=rerun"])
    report = json.load(open(os.path.join(curated, "report.json")))

    print("== 2/5 build a tiny random Qwen2 base model as a Hugging Face folder")
    from rossjax.curate import load_tokenizer

    vocab = load_tokenizer(report["config"]["tokenizer"]).vocab_size
    vocab = -(-vocab // 128) * 128  # round up like real checkpoints do
    base = os.path.join(wd, "base_hf")
    _base_model(base, vocab)

    print(f"== 3/5 ROSS masked SFT for {flags.steps} steps")
    _run(["train", f"--config={_config('ross_sft.py')}:runlocal", f"--config.model.path={base}",
          f"--config.data.train={curated}", "--config.data.seq_len=512",
          "--config.train.global_batch=4", "--config.train.micro_batches=2",
          "--config.train.epochs=100", f"--config.train.num_steps={flags.steps}",
          "--config.train.loss_chunk=128", f"--workdir={sft}"])

    print("== 4/5 export to a Hugging Face folder and reload it with transformers")
    _run(["export", f"--checkpoint={sft}", "--format=hf", hf_out])
    diff = _export_parity(hf_out, vocab)

    print("== 5/5 views: a compiled mask, the loss curve, a route-diverse selection")
    from rossjax.curate.pipeline import read_compiled

    examples = list(read_compiled(curated))
    pick = max(examples, key=lambda e: int(np.sum(e["eligible_mask"]) - np.sum(e["loss_mask"])))
    html = os.path.join(wd, "mask.html")
    _run(["inspect", curated, "--id", pick["id"], "--out", html, "--no-color"])
    plot = _loss_plot(sft)
    sel = os.path.join(wd, "select")
    _run(["select", f"--config={_config('select_routes.py')}:runlocal",
          f"--config.input={os.path.join(ROOT, 'data', 'select', 'sample.jsonl')}",
          f"--config.output={sel}"])

    from rossjax.train.metrics import read_metrics

    losses = [r["loss"] for r in read_metrics(sft)]
    b = report["buckets"]
    print(f"""
rossjax demo done in {time.time() - t0:.0f} s; outputs under {wd}
  curated   {report['input_rows']} rollouts -> {b['kept']} kept, {b['withheld']} withheld, \
{b['invalid']} invalid; {report['tokens']['kept_supervised']} supervised tokens, \
TER {report['ter']:.3f}   ({curated}/report.json)
  trained   {len(losses)} steps of masked SFT, loss {losses[0]:.3f} -> {losses[-1]:.3f}   \
({sft}; tensorboard --logdir {sft}/tb)
  exported  {hf_out}  (transformers reloads it; max |logit diff| {diff:.2e})
  look at   {html} (mask of {pick['id']}), {plot}, {sel}/selection.png""")
    return 0
