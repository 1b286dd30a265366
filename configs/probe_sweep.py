"""Probe sweep (PROPEL): layer x pooling x head x balance x seed x fold on stored activations; keeps
cells under the ECE ceiling (validation, before temperature calibration), then prefers the highest
RVP within `ba_tolerance` of the best validation balanced accuracy, and saves it with orbax.

    rossjax probe-sweep --config=configs/probe_sweep.py \
        --config.stores='("runs/acts_mean","runs/acts_last")' --config.labels=runs/labels.jsonl \
        --config.output=runs/probe_sweep

Splits and scores as PROPEL, by `domain`: math and azr get one seeded 80/10/10 split over whole
groups (copies of one task on one side) and the RL reward reads raw probe scores; swe gets a grouped 5-fold x 3 seeds and calibrated scores
(`split` overrides; the split is recorded in selected_probe.json and report.json).

Needs: finished stores from `rossjax extract` (one per pooling, same ids) and a label JSONL with
{"id", "trials": [true|false|null, ...]} (or "label"), optionally "group" (group k-fold) and "valid"
(the validity check W). RVP is measured on its own sample of base-model completions: `rvp_stores`
(extract over a pool of base-model generations, e.g. its label-corpus inputs.jsonl), `rvp_valid`
(their W: that pool's labels.jsonl), `rvp_ensemble` (probes the RL reward worst-cases with).
Writes cells.csv, summary.csv, report.json,
heatmap_<head>.png, selected_probe/ + selected_probe.json, TensorBoard events (tb/) and metrics.jsonl.

Time: cells = layers x poolings x heads x balances x seeds x folds (1 random or group_random, 5 group_kfold). On this 2-core CPU a cell takes a few
seconds for a linear head on a few thousand rows and tens of seconds for the deep MLP (the default
grid on 3 layers x 2 stores, 10k rows: roughly 10-20 minutes with group_kfold, a fifth of that
with an 80/10/10 split). The sweep runs on one device; on
an accelerator the heads are too small to use it well and a cell is dominated by compilation
(estimated, not measured: ~1-2 s the first time per head, the grid in a few minutes).

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
    c.domain = "azr"                 # azr | math | swe: picks the split, balance and score defaults
    c.balance = ()                   # none | downsample | reweight; () = downsample for math/azr,
                                     # reweight for swe (the paper's choices)
    c.seeds = (0, 1, 2)              # every seed x fold is trained; summaries are their means
    # U_S band: K=8 -> closed [1/8, 3/8]; K=3 -> band="open" (0 < rate < 1)
    c.lo, c.hi, c.band, c.min_valid = 1 / 8, 3 / 8, "closed", 2
    c.split = ""                     # "" = the domain's: group_random (one seeded 80/10/10 split
                                     # over groups) for math/azr, group_kfold for swe; random =
                                     # row-level 80/10/10 (groups: the label file's "group";
                                     # a row without one is its own group)
    c.split_seed = 0
    c.folds, c.fold = 5, -1          # fold=-1: train and report every fold (mean over all)
    c.lr, c.weight_decay, c.batch_size, c.max_epochs, c.patience = 1e-3, 1e-4, 64, 50, 7
    c.ece_max = 0.1                  # ceiling on validation ECE measured BEFORE temperature scaling
    c.ba_tolerance = 0.01            # prefer higher RVP within this much validation balanced accuracy
    c.reward = "hard_gate"           # probe_only | hard_gate | soft_gate: the RL reward RVP measures
    c.invalid_reward = -0.2          # hard_gate's reward for invalid tasks
    c.rvp_stores = ()                # stores over base-model completions (same poolings as `stores`)
    c.rvp_valid = ""                 # JSONL {"id", "valid"} of those rows (W for the gate)
    c.rvp_ensemble = ()              # saved probes the RL reward worst-cases with (wco), if any
    c.rvp_n, c.rvp_seed = 512, 0     # RVP sample size (rows drawn once, shared by every cell)
    return c
