"""RetroGen: gate, score and serialize reconstructed tool-use trajectories into SFT rollouts.

Run:
  rossjax retrogen --config=configs/retrogen.py --config.input=trajectories.jsonl --config.output=DIR
  `configs/retrogen.py:runlocal` scores the shipped sample (data/retrogen/sample.jsonl).
  `:artifact_only` is the ablation that keeps task + draft only.

Needs: trajectories as JSONL (layout in rossjax/curate/retrogen.py). Writes DIR/retrogen.jsonl
(rollout records for `rossjax curate`), DIR/discarded.jsonl (id, reason, detail) and
DIR/report.json (per domain: mean, median, P25, P75, threshold). Takes seconds per 10k rows.
"""

import os

import ml_collections
from ml_collections import config_dict

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variants = [a for a in (arg or "").split(",") if a]
    c = ml_collections.ConfigDict()
    c.input = ""
    c.output = ""
    c.weights = ml_collections.ConfigDict(
        {"rubric": 0.25, "quality": 0.25, "grounding": 0.25, "consistency": 0.25})
    c.threshold = 0.6                                # fixed threshold (all domains)
    c.quantile = config_dict.placeholder(float)      # e.g. 0.5: per-domain quantile calibration
    c.domain_thresholds = ml_collections.ConfigDict()  # {"finance": 0.7}: fixed per-domain overrides
    c.seed = 0
    c.react_prob = 0.5                               # share of trajectories serialized as ReAct
    c.artifact_only = False
    c.evidence_in_prompt = False
    c.system = ""
    if "runlocal" in variants:
        c.input = os.path.join(_REPO, "data/retrogen/sample.jsonl")
        c.output = "runs/retrogen_local"
        c.quantile = 0.5
    if "artifact_only" in variants:
        c.artifact_only = True
    return c
