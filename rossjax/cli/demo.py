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

Each step is the real command, run through the dispatcher; the pieces that are not commands
live in rossjax/demo.py.
"""

from __future__ import annotations

import json
import os
import time

from rossjax.cli.flags import parse_config, repo_config


def _run(argv):
    from rossjax.cli import main as dispatch

    rc = dispatch(argv)
    if rc:
        raise SystemExit(f"rossjax demo: step `rossjax {' '.join(argv[:1])}` failed (exit {rc}).")


def main(argv) -> int:
    from absl import flags as absl_flags

    from rossjax import demo

    def extra(fv):
        absl_flags.DEFINE_integer("steps", 30, "Optimizer steps of the masked SFT stage.",
                                  flag_values=fv)

    _, flags, _ = parse_config(argv, extra_flags=extra)
    wd = os.path.abspath(flags.workdir or "runs/demo")
    os.makedirs(wd, exist_ok=True)
    t0 = time.time()
    curated, sft, hf_out = (os.path.join(wd, d) for d in ("curated", "sft", "export_hf"))

    print("== 1/5 curate the shipped rollouts (re-verify, compile masks)")
    _run(["curate", f"--config={repo_config('curate.py')}",
          f"--config.input={demo.data_path('rollouts', 'sample.jsonl')}",
          f"--config.output={curated}", "--config.verify=rerun"])
    with open(os.path.join(curated, "report.json")) as f:
        report = json.load(f)

    print("== 2/5 build a tiny random Qwen2 base model as a Hugging Face folder")
    vocab = demo.padded_vocab(report["config"]["tokenizer"])
    base = os.path.join(wd, "base_hf")
    demo.base_model(base, vocab)

    print(f"== 3/5 ROSS masked SFT for {flags.steps} steps")
    _run(["train", f"--config={repo_config('ross_sft.py')}:runlocal", f"--config.model.path={base}",
          f"--config.data.train={curated}", "--config.data.seq_len=512",
          "--config.train.global_batch=4", "--config.train.micro_batches=2",
          "--config.train.epochs=100", f"--config.train.num_steps={flags.steps}",
          "--config.train.loss_chunk=128", f"--workdir={sft}"])

    print("== 4/5 export to a Hugging Face folder and reload it with transformers")
    _run(["export", f"--checkpoint={sft}", "--format=hf", hf_out])
    diff = demo.export_parity(hf_out, vocab)

    print("== 5/5 views: a compiled mask, the loss curve, a route-diverse selection")
    pick = demo.most_masked_example(curated)
    html = os.path.join(wd, "mask.html")
    _run(["inspect", curated, "--id", pick["id"], "--out", html, "--no-color"])
    plot = demo.loss_plot(sft)
    sel = os.path.join(wd, "select")
    _run(["select", f"--config={repo_config('select_routes.py')}:runlocal",
          f"--config.input={demo.data_path('select', 'sample.jsonl')}",
          f"--config.output={sel}"])

    losses = demo.losses(sft)
    b = report["buckets"]
    print(f"""
rossjax demo done in {time.time() - t0:.0f} s; outputs under {wd}
  curated   {report['input_rows']} rollouts -> {b['kept']} kept, {b['withheld']} withheld, \
{b['invalid']} invalid; {report['tokens']['kept_supervised']} supervised tokens, \
TER {report['ter']:.3f}   ({curated}/report.json)
  trained   {len(losses)} steps of masked SFT, loss {losses[0]:.3f} -> {losses[-1]:.3f}   \
({sft}; {demo.tensorboard_hint(sft + '/tb')})
  exported  {hf_out}  (transformers reloads it; max |logit diff| {diff:.2e})
  look at   {html} (mask of {pick['id']}), {plot}, {sel}/selection.png""")
    return 0
