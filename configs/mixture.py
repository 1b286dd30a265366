"""Token-budgeted mixture of curated sources (RetroGen's SFT mixture by default).

Run:
  rossjax mix --config=configs/mixture.py --config.output=runs/mix \
      --config.sources.science.path=CURATED_SCIENCE --config.sources.finance.path=CURATED_FIN \
      --config.sources.legal.path=CURATED_LEGAL --config.sources.general.path=CURATED_GENERAL
  The paper's mixture: science / finance / legal / general = 40 / 20 / 20 / 20 % of a
  50M-token budget, rows longer than 32,768 tokens dropped. Change a share with
  --config.sources.science.share=0.5. `configs/mixture.py:by_recipe` is the other layout
  (math / code / agentic / retrogen = 40 / 20 / 20 / 20 of 100M tokens).
  `configs/mixture.py:public_baseline` is the paper's Public-Baseline: a user's public tool-use
  SFT data (curated; --config.sources.public_tool_use.path=DIR) takes the 80% agentic slice the
  three RetroGen domains hold, general keeps its 20%, on the same 50M-token budget and length
  cap, so both mixtures train on the same token count (report.json: target vs achieved tokens
  per source).

Needs: curated output dirs written by `rossjax curate` (read with compiled.read_compiled).
Writes DIR/compiled-NNNNN.array_record (the drawn examples, curated format: train on DIR
directly), DIR/mixture.jsonl (source, path, row, id, n_tokens of every drawn row, in draw order)
and DIR/report.json (target vs achieved token shares, drops). A source that cannot cover its share
stops the run with an error naming it. Takes about as long as reading the sources once.
"""

import ml_collections

from rossjax.configs import common

PAPER_SHARES = {"science": 0.4, "finance": 0.2, "legal": 0.2, "general": 0.2}
# the agentic 80% (science + finance + legal) replaced by one public tool-use source
PUBLIC_BASELINE_SHARES = {"public_tool_use": 0.8, "general": 0.2}
BY_RECIPE_SHARES = {"math": 0.4, "code": 0.2, "agentic": 0.2, "retrogen": 0.2}


def _sources(shares: dict) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({k: {"path": "", "share": v} for k, v in shares.items()})


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variants = common.variants(arg, ("by_recipe", "public_baseline"), "mixture.py")
    c = ml_collections.ConfigDict()
    c.output = ""
    c.sources = _sources(PAPER_SHARES)
    c.budget_tokens = 50_000_000
    c.max_length = 32768     # rows longer than this are dropped (0: keep all)
    c.seed = 0
    c.tolerance_pp = 0.5
    c.examples_per_shard = 4096
    c.progress = True        # tqdm bars on stderr (reading the sources, writing the mixture)
    if "by_recipe" in variants:
        c.sources = _sources(BY_RECIPE_SHARES)
        c.budget_tokens = 100_000_000
    if "public_baseline" in variants:
        c.sources = _sources(PUBLIC_BASELINE_SHARES)
    return c
