"""The adversarial auxiliary probe's training set from a PROPEL run (rossjax/probes/auxiliary.py):
positives = the original probe's band positives; negatives = the run's false positives (probe
score >= threshold, realized solve count outside the band) + the dominant collapsed family.

    rossjax label-corpus --config=configs/label_corpus.py --config.pool=runs/propel/history.jsonl \
        --config.solver.path=SOLVER_DIR --config.output=runs/propel_labels
    rossjax aux-set --config=configs/aux_set.py --config.original_labels=runs/labels/labels.jsonl \
        --config.original_inputs=runs/labels/inputs.jsonl \
        --config.run_labels=runs/propel_labels/labels.jsonl \
        --config.run_inputs=runs/propel_labels/inputs.jsonl --config.output=runs/aux
    then rossjax extract (input runs/aux/aux_inputs.jsonl) and rossjax probe-sweep (labels
    runs/aux/aux_labels.jsonl); pass the selected probe as --config.reward.probe.auxiliary.

Needs: the original label corpus and the run's history labelled by `rossjax label-corpus`
(it keeps each row's probe score, step and family). Writes aux_labels.jsonl, aux_inputs.jsonl
and report.json. Time: seconds (JSONL only).
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.workdir = ""
    c.original_labels = ""    # labels.jsonl of the corpus the original probe was trained on
    c.original_inputs = ""    # its inputs.jsonl
    c.run_labels = ""         # label-corpus labels.jsonl of the run's history.jsonl
    c.run_inputs = ""         # its inputs.jsonl
    c.output = ""             # default: WORKDIR/aux_set
    c.threshold = 0.5         # probe score at which a task counts as predicted in band
    c.last_steps = 0          # collapsed family over the run's last N steps (0 = every step)
    c.lo, c.hi, c.band, c.min_valid = 1 / 8, 3 / 8, "closed", 2   # the U_S band, as the sweep's
    return c
