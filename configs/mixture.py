"""Token-budgeted mixture of curated sources.

Run:
  rossjax mix --config=configs/mixture.py --config.output=runs/mix \
      --config.sources.math.path=CURATED_MATH --config.sources.code.path=CURATED_CODE \
      --config.sources.agentic.path=CURATED_AGENT --config.sources.retrogen.path=CURATED_RG
  (shares 40/20/20/20 by default; change with --config.sources.math.share=0.5 etc.).

Needs: curated output dirs written by `rossjax curate` (read with compiled.read_compiled).
Writes DIR/compiled-NNNNN.array_record (the drawn examples, curated format: train on DIR
directly), DIR/mixture.jsonl (source, path, row, id, n_tokens of every drawn row, in draw order)
and DIR/report.json (target vs achieved token shares, drops). A source that cannot cover its share
stops the run with an error naming it. Takes about as long as reading the sources once.
"""

import ml_collections


def _source(share: float) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"path": "", "share": share})


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.output = ""
    c.sources = ml_collections.ConfigDict({
        "math": _source(0.4), "code": _source(0.2), "agentic": _source(0.2), "retrogen": _source(0.2)})
    c.budget_tokens = 100_000_000
    c.max_length = 32768     # rows longer than this are dropped (0: keep all)
    c.seed = 0
    c.tolerance_pp = 0.5
    c.examples_per_shard = 4096
    c.progress = True        # tqdm bars on stderr (reading the sources, writing the mixture)
    return c
