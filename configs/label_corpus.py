"""Label a pool of generated induction tasks for probe training (PROPEL's U_S): K solver trials
per task under the AZR protocol (5 shown pairs + the message, scored on the 5 hidden inputs).

    rossjax label-corpus --config=configs/label_corpus.py --config.pool=runs/pool.jsonl \
        --config.solver.path=SOLVER_DIR --workdir=runs/labels
    rossjax extract --config=configs/extract.py --config.input=runs/labels/label_corpus/inputs.jsonl ...
    rossjax probe-sweep --config=configs/probe_sweep.py \
        --config.labels=runs/labels/label_corpus/labels.jsonl ...

Needs: a pool JSONL of task objects {"id", "program", "inputs", "message"} or generator records
(a GRPO history.jsonl works: its ids, probe scores and steps are kept) and a solver (a
checkpoint, or `oracle` / `identity` / `lookup` for checks). Writes labels.jsonl, inputs.jsonl
(for `rossjax extract`, same ids, rendered as GRPO's probe reads a task), tasks.jsonl and
report.json into WORKDIR/label_corpus (or --config.output).

Time: one sandboxed reference run per task plus K solver samples and K sandboxed checks; with a
1.5B solver, 2k tasks x K = 8 is a TPU job (estimated, not measured: tens of minutes, mostly
sampling); the programmatic
solvers label ~10 tasks/s on this CPU.
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.workdir = ""
    c.pool = ""                     # JSONL(.gz) of tasks or generator records
    c.output = ""                   # default: WORKDIR/label_corpus
    c.tokenizer = "qwen"            # the reference model's tokenizer (inputs.jsonl), or "ascii"
    c.template = "chatml"           # as config.template of the GRPO run that uses the probe
    c.solver = ml_collections.ConfigDict(dict(kind="model", path="", preset=""))
    c.k = 8                         # trials per task (K = 8: band [1/8, 3/8]; K = 3: band "open")
    c.lo, c.hi = 1 / 8, 3 / 8       # only for report.json's band rate; the sweep applies its own
    c.induction = ml_collections.ConfigDict(dict(n_inputs=10, n_visible=5, split="first"))
    c.batch_tasks = 64              # tasks sampled per solver batch
    c.max_new_tokens = 768
    c.temperature = 1.0
    c.seed = 0
    return c
