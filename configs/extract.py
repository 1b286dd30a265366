"""Activation extraction for probes: a frozen reference model reads each row, pooled hidden states
of the chosen layers go to a tensorstore zarr store (resumable; manifest 'complete' set last).

    rossjax extract --config=configs/extract.py --config.model=/path/to/hf_model \
        --config.input=runs/curated --config.output=runs/acts --config.layers='(8,16,24)'

Needs: a Hugging Face model folder (or "preset:NAME" for a random-init smoke model) and an input:
a curated directory (`rossjax curate` output; turn spans come from it) or a JSONL of
{"id", "input_ids" | "text", ["turn_spans"]}. Writes the store plus TensorBoard events (tb/) and
metrics.jsonl (rows/s, tokens/s, padding share) into the output directory.

Mesh: by default the batch runs data-parallel over every device (`mesh.data=-1`); set
`--config.mesh.tensor=N` to split a model too large for one chip. Single process only.

Time: one forward pass per row. On this 2-core CPU a 0.5B model reads roughly 1-3k tokens/s
(10k rows of 1k tokens: 1-3 hours); on a TPU v5e-8 (data=8, bf16) an estimate, not measured,
is 100-200k tokens/s: a minute for the same 10M tokens plus ~1 minute of compilation (one per
length bucket).

Gradient sketches for `rossjax select --config.method=gradient`: `--config.kind=grad_sketch`
writes k1 x k2 (16 x 16) random-projection sketches of each row's LM-head gradient (its
next-token NLL; assistant turns with `--config.use_turns=True`) in the same store layout
(rossjax/probes/grad_sketch.py; one device, one forward per row).

runlocal (~20 s on this CPU): --config.model=preset:tiny_qwen2 --config.layers='(1,2)'
  --config.input=<a small JSONL with input_ids> --config.output=/tmp/acts
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.model = "preset:tiny_qwen2"   # HF folder or preset:NAME (random init with `seed`)
    c.seed = 0
    c.dtype = "float32"
    c.input = ""                    # curated dir or JSONL
    c.tokenizer = ""                # only for JSONL rows that hold "text"
    c.output = ""                   # store directory (default: WORKDIR/activations)
    c.layers = (1, 2)               # 0 = embeddings, i = block i, n_layers = after final norm
    c.pooling = "mean"              # over tokens (of each turn): mean | last | max
    c.use_turns = False             # pool per assistant turn (turn_spans), then over turns
    c.turn_pooling = "mean"         # over turns: mean | last | max | attention
    c.batch_tokens = 8192           # padded tokens per forward batch (all devices together)
    # activations | grad_sketch: per-row sketches of the LM-head gradient of the row's next-token
    # NLL (its assistant turns with use_turns), k1 x k2 values, for `rossjax select
    # --config.method=gradient` (rossjax/probes/grad_sketch.py; one device)
    c.kind = "activations"
    c.sketch = ml_collections.ConfigDict(dict(k1=16, k2=16, seed=0))
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1                # rows over data (x fsdp); -1 = the remaining devices
    c.mesh.fsdp = 1
    c.mesh.tensor = 1               # heads / MLP over tensor
    c.sharding_rules = ()           # () = rossjax.sharding.DEFAULT_RULES
    return c
