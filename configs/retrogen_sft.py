"""RetroGen SFT: train on serialized reconstructed trajectories with the paper's recipe.

Run:
  rossjax reconstruct --config=configs/reconstruct.py --workdir=RC --config.endpoint.model=M
  rossjax retrogen --config=configs/retrogen.py --config.input=RC/trajectories.jsonl \
      --config.output=RG
  rossjax curate --config=configs/curate.py --config.input=RG/retrogen.jsonl \
      --config.recipe=positive_sft --config.tokenizer=MODEL --config.output=CURATED
  rossjax train --config=configs/retrogen_sft.py --config.model.path=MODEL \
      --config.data.train=CURATED --workdir=runs/retrogen_sft
  `:runlocal` trains the tiny random model of every `:runlocal` (seconds on a CPU).

Needs: a curated dir of RetroGen rollouts (`rossjax retrogen` writes them with
`loss_scope: "sequence"`, so curate supervises every token of the serialized sample: the
paper's loss over the sequence, Eq. 7), curated as recipe `positive_sft` (verifier-positive
rows, eligible mask: retrogen's verdict is the gate and thresholds).

The paper's recipe, as set here (configs/ross_sft.py is ROSS's, which RetroGen rows used to
train with): AdamW, learning rate 1e-5, weight decay 0.01, 1 epoch, ~512K tokens a step
(`train.batch_mode = "token_budget"`: 16 packed rows of 32,768 tokens = 524,288 tokens), left
truncation (`data.too_long = "truncate"`: a row over seq_len keeps its last 32,768 tokens, where
the trajectory's draft is). Where the paper is silent (docs/deviations.md): the schedule (5%
warmup, cosine to 1e-6), b2 = 0.999, clipping at 1.0.

Time: estimated, not measured: 50M tokens (the paper's mixture) is ~95 steps of 524K tokens; on
a ~1.5B model a step is ~4.7e15 FLOPs, ~8 s at an assumed 40% MFU on a v5e-8, so ~15 minutes.
"""

import ml_collections

from rossjax.configs import common, ross_sft


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variants = common.variants(arg, ("runlocal",), "retrogen_sft.py")
    c = ross_sft.get_config("runlocal" if "runlocal" in variants else None)
    c.recipe = "positive_sft"  # retrogen rows: verifier-positive, eligible (sequence) mask
    c.data.seq_len = 32768
    c.data.too_long = "truncate"  # left truncation: keep the last seq_len tokens
    c.train.batch_mode = "token_budget"
    c.train.global_batch = 16  # packed rows a step: 16 x 32,768 = 524,288 tokens
    c.train.micro_batches = 16
    c.train.epochs = 1
    c.optim.name = "adamw"
    c.optim.peak_lr = 1e-5
    c.optim.end_lr = 1e-6
    c.optim.weight_decay = 0.01
    c.optim.b2 = 0.999
    if "runlocal" in variants:
        c.data.seq_len = 256
        c.train.global_batch = 8  # one packed row per device of the 8-device CPU mesh
        c.train.micro_batches = 1
        c.optim.peak_lr = 1e-3  # a random tiny model: see the loss move in a few steps
        c.optim.end_lr = 1e-4
    return c
