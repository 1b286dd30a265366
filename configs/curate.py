"""Curate saved rollouts into masked training examples (ArrayRecord shards + report.json).

Run (defaults: the shipped sample rollouts, the real Qwen tokenizer; verify=auto uses the verdict
stored in a row and runs the row's verifier where none is stored; rows with no verdict at all are
withheld as `unverified` unless --config.unverified=keep):

    rossjax curate --config=configs/curate.py --config.output=/tmp/curated
    rossjax curate --config=configs/curate.py --config.input=rollouts.jsonl.gz \
        --config.output=/tmp/curated --config.verify=rerun --config.verify_workers=2

Rows and masks: one curated dir per training recipe, curated with the recipe's `rows` and
`mask_mode` (the table is printed at the end of `rossjax curate --help`; the defaults are the
`ross` recipe's); `rossjax train` checks report.json's mask_mode and rows against its recipe.

`rows=accepted` keeps verifier-positive rows a reviewer accepted or revised; a row with no
annotation was never reviewed, so it is withheld as `not_annotated` (never trained on silently by
the ROSS recipes), and a reviewer drop as `annotation_drop`. ross and ross_no_mask keep exactly
the same rows: eligible mode still resolves the annotation. `rows=verifier_positive` keeps every
verifier-positive row, reviewer drops and unannotated rows included, with its annotation removed
before compiling (so a broken selector withholds nothing): every eligible token is supervised,
which is the "no annotation -> all eligible tokens" positive-rollout SFT baseline of the mask
compiler. Unreviewed rollouts such as a GRPO run's history.jsonl are therefore curated with
`--config.rows=verifier_positive --config.mask_mode=eligible`. Under both filters a failed verdict
is `verifier_failed`, and rows with no verdict follow `unverified`.

Inputs: rollout records, and rows as other tools write them (TRL messages or prompt/completion,
verl datasets and rollout dumps, OpenAI messages with tools); map other columns with
--config.fields.input_key=question --config.fields.label_key=answer
--config.fields.reward_key=score --config.fields.reward_threshold=1.0 (docs/data.md).
--config.export_format=parquet also writes DIR/data.parquet (input_ids, attention_mask, labels,
assistant_masks) for TRL and verl.

Needs: CPU only (no jax import); verifier runs use math-verify, reasoning-gym and sandboxed
Python in worker processes. Takes ~6 s on the 30-row sample (verify=auto runs the verifiers of
the 21 rows that store no verdict; ~10 s with verify=rerun); on 2 CPU
cores compiling runs at hundreds of ~2k-token rollouts/s and sandboxed code verification at
~30 programs/s. Then: `rossjax inspect /tmp/curated --id <ID>` to eyeball a mask.
"""

import ml_collections
from ml_collections import config_dict

from rossjax.configs import common


def get_config():
    c = ml_collections.ConfigDict()
    # .jsonl[.gz] or .parquet; also a directory, a glob ("runs/*/history.jsonl") or a comma list
    c.input = common.data_file("rollouts", "sample.jsonl")
    c.output = ""  # the curated dir; --workdir=DIR names it too (one of the two is needed)
    c.tokenizer = "qwen"  # load_tokenizer spec: qwen, qwen3, mistral-v3, tekken, a HF folder ...
    c.template = "chatml"  # chatml | llama3 | mistral | tokenizer (the tokenizer's jinja template)
    c.template_kwargs = ""  # JSON object for the tokenizer's template: '{"enable_thinking": false}'
    # columns of rows in other layouts (empty: rows are read as they are; docs/data.md)
    c.fields = ml_collections.ConfigDict()
    c.fields.input_key = ""  # the prompt: a string (one user turn) or a message list
    c.fields.label_key = ""  # the completion: a string (one assistant turn) or a message list
    c.fields.reward_key = ""  # a numeric column read as the row's reward
    c.fields.reward_threshold = config_dict.placeholder(float)  # reward >= it: passed, else failed
    c.fields.id_key = ""  # the column holding the row id (empty: `id`, else derived from content)
    c.duplicates = "withhold"  # withhold | keep rows whose id an earlier row already had
    c.export_format = ""  # "" | parquet: also DIR/data.parquet for TRL / verl
    c.max_length = 32768  # longer rollouts are withheld as too_long; 0 = no limit
    c.recipe = ""  # ross | ross_no_mask | positive_sft | sft: sets rows, mask_mode (sft: verify, unverified too)
    c.mask_mode = "annotated"  # annotated | eligible ("ROSS w/o mask": every assistant token)
    c.rows = "accepted"  # accepted (reviewed: accept | revise) | verifier_positive (see above)
    # auto: the stored record.verifier.passed, else run the named verifier | stored: stored
    # verdicts only | rerun: run every named verifier again (ignoring stored verdicts)
    c.verify = "auto"
    c.verify_workers = 2  # CPU processes for the verifier runs
    # module:function, GRPO's reward.fn signature (prompt, completion, task) -> bool | None |
    # number | Verdict: replaces the named verifier for the rows verify gives a fresh verdict
    c.verify_fn = ""
    c.verify_threshold = 0.5  # a number verify_fn returns passes at >= this
    c.undecided = "withhold"  # withhold | keep rows whose verifier returned passed=None
    c.unverified = "withhold"  # withhold | keep rows left with no verdict at all (see pipeline.py)
    c.workers = 0  # grain worker processes for compiling (0 = in this process)
    c.chunk_rows = 4096  # rows verified and compiled per step (bounds memory)
    c.examples_per_shard = 8192
    c.progress = True
    # local: this host (grain) | beam: the same stages as an Apache Beam pipeline (pip install
    # "rossjax[beam]"; rossjax/curate/beam.py), for pools larger than one host; same outputs
    c.runner = "local"
    # runner=beam: Beam pipeline options, e.g. "--runner=DirectRunner --direct_num_workers=2
    # --direct_running_mode=multi_processing", or --runner=DataflowRunner ... (see README)
    c.beam_args = ("--runner=DirectRunner --direct_num_workers=2 "
                   "--direct_running_mode=multi_processing")
    c.beam_retries = 1  # runner=beam: reruns of a failed pipeline (the DirectRunner retries no bundle)
    c.sandbox = common.sandbox_config()
    return c
