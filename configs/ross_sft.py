"""ROSS masked SFT: relearn from curated historical rollouts (Eq. 4, masked teacher forcing).

Run:
  rossjax train --config=configs/ross_sft.py --config.model.path=HF_OR_ORBAX_DIR \
      --config.data.train=CURATED_DIR --workdir=runs/ross
  (or `python -m rossjax.cli train ...`). Variants after a colon, comma-separated:
  `configs/ross_sft.py:agentic` (65,536-token rows, 8 epochs), `:ross_no_mask`, `:positive_sft`,
  `:token_budget`, `:runlocal` (tiny random model over ASCII bytes, rows up to 1,280 tokens), on
  the shipped sample:
    rossjax curate --config=configs/curate.py --config.tokenizer=ascii --config.output=/tmp/cur
    rossjax train --config=configs/ross_sft.py:runlocal --config.data.train=/tmp/cur \
        --workdir=/tmp/run

Needs: a curated dir written by `rossjax curate` (ArrayRecord shards of compiled examples),
curated with the flags of `recipe` (the same rollouts and optimizer, differing only in rows and
mask; the table is printed at the end of `rossjax train --help`). The trainer compares
report.json's `mask_mode` and `rows` with the recipe: a mismatch stops the run, a report that
does not record `rows` gets a note on stderr.

Batch: the paper's batch of 128 counts rollouts. `train.batch_mode="sequences"` (the default)
makes each optimizer step exactly `global_batch` rollouts, packed into as many rows of
`data.seq_len` tokens as they need (at most global_batch; all-padding micro-batches are skipped),
and Eq. 4 divides by the step's supervised tokens. `:token_budget` (batch_mode="token_budget")
instead fills `global_batch` packed rows of seq_len tokens per step, however many rollouts fit.

Time: `:runlocal` trains a tiny random model in seconds on a CPU (compilation dominates). The
paper recipe (128 rollouts a step, 32,768-token rows, 3 epochs) on a ~1.5B model is a TPU job;
an estimate, not a measurement: 10k rollouts of ~8k tokens make 79 steps an epoch, a step is
6 x 1.5e9 x ~1M tokens ~ 9.4e15 FLOPs, which at an assumed 40% MFU on a v5e-8 (bf16, full remat)
is ~15 s, so ~1 hour for 3 epochs (`rossjax bench model --device` measures a real chip).
"""

import ml_collections

from rossjax.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variants = common.variants(arg, (*common.RECIPES, "agentic", "token_budget", "runlocal"),
                               "ross_sft.py")
    c = ml_collections.ConfigDict()
    c.recipe = "ross"
    c.workdir = ""  # --workdir wins
    c.resume_changes = ""  # FIELD,...: config fields a resumed run may change (train/resume.py)

    c.model = ml_collections.ConfigDict()
    c.model.path = ""     # HF folder (config.json), orbax params export (model_config.json), or ""
    c.model.preset = ""   # from-scratch init from rossjax.models.PRESETS when path is ""
    c.model.dtype = "bfloat16"        # compute dtype; logits and the loss are float32
    c.model.param_dtype = "float32"   # master weights
    c.model.remat_policy = "full"     # none | full | dots | dots_no_batch
    c.model.attention_impl = "auto"   # auto | dense | blockwise | xla | cudnn | splash
    c.model.vocab_size = -1           # > 0 overrides the preset's vocabulary (from-scratch only)

    c.data = ml_collections.ConfigDict()
    c.data.train = ""     # curated dir(s), comma-separated
    c.data.eval = ""      # held-out curated dir(s); "" disables eval
    c.data.seq_len = 32768
    c.data.shuffle = True
    c.data.strategy = "first_fit"
    # rows longer than seq_len: error (stop before step 1, naming how many) | drop | truncate
    # (keep the last seq_len tokens: the end of a rollout holds its answer)
    c.data.too_long = "error"
    c.data.worker_count = 0

    c.train = ml_collections.ConfigDict()
    c.train.batch_mode = "sequences"  # sequences: global_batch rollouts a step | token_budget
    c.train.global_batch = 128        # rollouts (sequences) or packed rows (token_budget) per
                                      # optimizer step, all hosts together; rows per step <= this
    c.train.micro_batches = 16        # gradient accumulation steps inside one optimizer step
    c.train.epochs = 3
    c.train.num_steps = -1            # > 0 caps the run; otherwise epochs x rows / global_batch
    c.train.seed = 0
    c.train.loss_chunk = 1024         # positions per logits block in the chunked loss
    c.train.max_bad_steps = 5         # stop after this many non-finite steps in a row
    c.train.log_every = 10
    c.train.eval_every = 200          # steps; <= 0: only at the end
    c.train.debug_kill_at_step = -1   # > 0: SIGKILL self after this step's save (resume tests)

    c.optim = common.optim_config()

    c.log = ml_collections.ConfigDict()
    c.log.wandb = ""                  # PROJECT: also log metrics to Weights & Biases

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.save_every = 200
    c.checkpoint.keep = 3
    c.checkpoint.async_save = True

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.tensor = 1
    c.sharding_rules = ()             # () = rossjax.sharding.DEFAULT_RULES

    c.distributed = common.distributed_config()  # enabled, coordinator, num_processes, process_id, ...

    # LoRA: train low-rank adapters on the frozen base (models/lora.py); checkpoints hold the
    # adapters, `rossjax export` merges them (hf, orbax) or writes them for peft (--format peft).
    c.lora = common.lora_config()

    for v in variants:
        if v in common.RECIPES:
            c.recipe = v
        elif v == "token_budget":
            c.train.batch_mode = "token_budget"
        elif v == "agentic":
            c.data.seq_len = 65536
            c.train.epochs = 8
        elif v == "runlocal":
            common.tiny_model(c.model)
            # the shipped sample (data/rollouts/sample.jsonl) curated with the tiny model's
            # tokenizer (--config.tokenizer=ascii) is at most 1,038 tokens a row
            c.data.seq_len = 1280
            c.train.global_batch = 8
            c.train.micro_batches = 8  # one packed row each: all-padding ones are skipped
            c.train.epochs = 1
            c.train.loss_chunk = 64
            c.train.log_every = 1
            c.train.eval_every = 10
            c.optim.peak_lr = 1e-3
            c.optim.end_lr = 1e-4
            c.checkpoint.save_every = 10
            c.checkpoint.async_save = False
            c.mesh.fsdp = 1
            c.mesh.data = -1
    return c
