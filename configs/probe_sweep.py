"""Probe sweep (PROPEL): layer x pooling x head x balance x seed on stored activations; selects the
best validation balanced accuracy under an ECE ceiling (RVP breaks ties) and saves it with orbax.

    rossjax probe-sweep --config=configs/probe_sweep.py \
        --config.stores='("runs/acts_mean","runs/acts_last")' --config.labels=runs/labels.jsonl \
        --config.output=runs/probe_sweep

Needs: finished stores from `rossjax extract` (one per pooling, same ids) and a label JSONL with
{"id", "trials": [true|false|null, ...]} (or "label"), optionally "group" (group k-fold) and "valid"
(the validity check W the hard_gate / soft_gate reward uses). Writes cells.csv, summary.csv,
heatmap_<head>.png, selected_probe/ + selected_probe.json, TensorBoard events (tb/) and metrics.jsonl.

Time: cells = layers x poolings x heads x balances x seeds. On this 2-core CPU a cell takes a few
seconds for a linear head on a few thousand rows and tens of seconds for the deep MLP (the default
grid on 3 layers x 2 stores, 10k rows: roughly 10-20 minutes). On a TPU v5e-8 the heads are too
small to use it well: a cell is dominated by compilation (~1-2 s the first time per head), the grid
finishes in a few minutes; the sweep runs on one device.

runlocal (~30 s on this CPU): --config.heads='("linear",)' --config.seeds='(0,)' --config.max_epochs=10
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.stores = ("",)                 # activation store dirs (one per pooling)
    c.labels = ""                    # label JSONL
    c.output = ""                    # default: WORKDIR/probe_sweep
    c.layers = ()                    # empty = every layer the stores hold
    c.heads = ("linear", "mlp")      # linear | mlp (d-512-128-2) | deep_mlp
    c.balance = ("reweight",)        # none | downsample | reweight
    c.seeds = (0, 1, 2)
    # U_S band: K=8 -> closed [1/8, 3/8]; K=3 -> band="open" (0 < rate < 1)
    c.lo, c.hi, c.band, c.min_valid = 1 / 8, 3 / 8, "closed", 2
    c.split = "random"               # random (80/10/10) | group_kfold (by the label file's "group")
    c.split_seed = 0
    c.folds, c.fold = 5, 0
    c.lr, c.weight_decay, c.batch_size, c.max_epochs, c.patience = 1e-3, 1e-4, 64, 50, 7
    c.ece_max = 0.1                  # selection ceiling on validation ECE (after temperature scaling)
    c.reward = "probe_only"          # probe_only | hard_gate | soft_gate (rossjax.probes.reward.gate)
    c.invalid_reward = -0.2          # hard_gate's reward for invalid tasks
    c.rvp_stores = ()                # stores of reference-policy outputs (same poolings), if any
    return c
