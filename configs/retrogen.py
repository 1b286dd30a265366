"""RetroGen: gate, score and serialize reconstructed tool-use trajectories into SFT rollouts.

Run:
  rossjax retrogen --config=configs/retrogen.py --config.input=trajectories.jsonl --config.output=DIR
  `configs/retrogen.py:runlocal` scores the shipped sample (data/retrogen/sample.jsonl).
  `:artifact_only` is the ablation that keeps task + draft only.

Needs: trajectories as JSONL (layout in rossjax/curate/retrogen.py). Writes DIR/retrogen.jsonl
(rollout records for `rossjax curate`), DIR/discarded.jsonl (id, reason, detail) and
DIR/report.json (per domain: mean, median, P25, P75, threshold). Takes seconds per 10k rows.

Paper defaults: thresholds 0.52 / 0.48 / 0.63 for science / finance / legal (other domains:
`threshold`, or `quantile` when set); evidence serialized after the task; each tool call's note
after it (`note_position`); the loss over the whole serialized sample (`loss="sequence"`, Eq. 7;
"assistant" for assistant-only). Then curate the rollouts as positive rows:
  rossjax curate --config.input=DIR/retrogen.jsonl --config.rows=verifier_positive \
      --config.mask_mode=eligible --config.tokenizer=MODEL --config.output=CURATED
"""

import ml_collections
from ml_collections import config_dict

from rossjax.configs import common
from rossjax.curate.retrogen import PAPER_THRESHOLDS


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variants = common.variants(arg, ("runlocal", "artifact_only"), "retrogen.py")
    c = ml_collections.ConfigDict()
    c.input = ""
    c.output = ""
    c.weights = ml_collections.ConfigDict(
        {"rubric": 0.25, "quality": 0.25, "grounding": 0.25, "consistency": 0.25})
    c.threshold = 0.6                                # fixed threshold (domains not listed below)
    c.quantile = config_dict.placeholder(float)      # e.g. 0.5: per-domain quantile calibration
    # fixed per-domain thresholds (win over both): the paper's calibrated values
    c.domain_thresholds = ml_collections.ConfigDict(dict(PAPER_THRESHOLDS))
    # threshold (the method) | next_n_replace (the paper's selection ablation) | signal:NAME
    c.selection = "threshold"
    c.seed = 0
    c.react_prob = 0.5                               # share of trajectories serialized as ReAct
    c.artifact_only = False
    c.evidence_in_prompt = True                      # the evidence list follows the task
    c.note_position = "after_call"                   # after_call | before_call (JSON form)
    c.loss = "sequence"                              # sequence (Eq. 7) | assistant
    c.system = ""
    if "runlocal" in variants:
        c.input = common.data_file("retrogen", "sample.jsonl")
        c.output = "runs/retrogen_local"
        c.quantile = 0.5
    if "artifact_only" in variants:
        c.artifact_only = True
    return c
