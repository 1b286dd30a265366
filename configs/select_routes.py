"""Route-diverse selection of verified solutions.

Run:
  rossjax select --config=configs/select_routes.py --config.input=rollouts.jsonl \
      --config.output=runs/select --config.budget=1000
  `configs/select_routes.py:runlocal` selects 12 of the shipped sample (data/select/sample.jsonl).

Needs: rollout records (.jsonl, .jsonl.gz or .parquet), or a curated output dir plus
--config.tokenizer. The pool is the verifier-passed rows (`only_passed=True`; the others are
counted as skipped `not_passed`); a curated dir holds verifier-positive rows already. The route of a record is its own `steps` list when present, else its
assistant turns (reasoning, content, tool calls). Writes to `output`: selected.jsonl[.gz] /
selected.parquet / compiled-*.array_record (the chosen rows, verbatim, same format as the input),
report.json (per method: mean pairwise distance, distinct label sequences, clusters covered,
rows per problem) and selection.png (2-D PCA of pool vs chosen; look at it before trusting a
selection). Time: ~1 s per 3,000 records to fingerprint on one core, plus a few seconds.

Baselines the paper compares against, each under the same budget, quota and seed (the diverse
procedure in its own space; cosine distance): `--config.method=lexical` (word n-gram TF-IDF of
the route text, `config.lexical`), `embedding` (pooled activations of the frozen model:
`rossjax extract` over the same rows, then `--config.embedding_store=DIR`
[`--config.embedding_layer=L`, default the last stored layer]) and `gradient` (LM-head gradient
sketches: `rossjax extract --config.kind=grad_sketch`, then `--config.gradient_store=DIR`). Rows
are matched to the store by id; a pool row without a stored vector is an error.
"""

import ml_collections
from ml_collections import config_dict

from rossjax.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variants = common.variants(arg, ("runlocal",), "select_routes.py")
    c = ml_collections.ConfigDict()
    c.input = ""
    c.output = ""
    c.domain = "math"            # step vocabulary: math | code | puzzle (rossjax/curate/step_vocab.py)
    c.dim = 64
    c.seed = 0
    c.budget = 1000
    c.method = "diverse"         # diverse | similar | random | topology | lexical | embedding |
                                 # gradient: the subset written
    c.compare = "diverse,similar,random,topology"   # methods measured in the report
    c.clusters = config_dict.placeholder(int)       # None: round(3 * sqrt(budget)), at least 1,
                                                    # at most pool and budget (default_clusters)
    # lexical: word 1..ngram_max grams, TF-IDF, seeded sparse random projection to dim (if more terms)
    c.lexical = ml_collections.ConfigDict(dict(ngram_max=3, dim=256, max_features=1 << 20))
    c.embedding_store = ""       # method embedding: a `rossjax extract` store over the same ids
    c.embedding_layer = config_dict.placeholder(int)  # None: the store's last layer
    c.gradient_store = ""        # method gradient: `rossjax extract --config.kind=grad_sketch`
    c.group_by = "task.id"       # dotted field holding the problem id ("" for none)
    c.per_group = config_dict.placeholder(int)      # None: no per-problem quota
    c.only_passed = True         # the pool is verifier-passed rows (False: every row)
    c.tokenizer = ""             # for a curated-dir input: decodes the token ids (e.g. "qwen")
    c.plot = True
    c.workers = 0                # processes for fingerprinting (0: this process; 2 on 2 cores)
    c.progress = True            # tqdm bars on stderr
    c.runner = "local"           # local | beam: fingerprints on Apache Beam (rossjax[beam])
    c.beam_args = ("--runner=DirectRunner --direct_num_workers=2 "
                   "--direct_running_mode=multi_processing")   # runner=beam: Beam's options
    c.beam_retries = 1           # runner=beam: reruns of a failed pipeline
    if "runlocal" in variants:
        c.input = common.data_file("select", "sample.jsonl")
        c.output = "runs/select_local"
        c.budget = 12
        c.per_group = 2
    return c
