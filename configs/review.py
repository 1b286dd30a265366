"""Annotate rollouts with a reviewer LLM: the stage that writes the `annotation` field.

Run (needs a served chat model behind an OpenAI-compatible endpoint: vLLM, SGLang, TGI,
llama.cpp server or OpenAI), e.g. with `vllm serve Qwen/Qwen3-32B --port 8000`:

    rossjax review --config=configs/review.py --workdir=/tmp/reviewed \
        --config.endpoint.model=Qwen/Qwen3-32B
    rossjax curate --config=configs/curate.py \
        --config.input=/tmp/reviewed/reviewed-00000.jsonl.gz --config.output=/tmp/curated

Rows: verifier-positive rollouts (verifier.passed, else reward > 0) are reviewed, the others
withheld `not_verifier_positive` (config.rows=all reviews every row); rows that already carry an
annotation are passed through unless config.overwrite. Mode: auto = exclude (exclude/protect
line quotes, omissions) for agentic or multi-turn rollouts, keep (start/end anchors) otherwise.
Every answer is checked by compiling it with curate's mask compiler (same tokenizer/template as
the curate run, so set them alike); a failing one gets `max_repairs` repair rounds with the exact
error. Answers are cached in WORKDIR/cache (config.cache_dir), so rerunning after a crash asks
nothing twice. Outputs: WORKDIR/reviewed-NNNNN.jsonl.gz, withheld.jsonl, invalid.jsonl,
report.json.

Time: one request per row (plus repairs) at `endpoint.concurrency` in flight; a 32B model on
one GPU answers a ~1k-token rollout in ~5-20 s, so ~1-2 rows/s at concurrency 8-16 (the 30-row
sample: under a minute). CPU side is negligible (no jax import).
"""

import os

import ml_collections

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config():
    c = ml_collections.ConfigDict()
    # .jsonl[.gz] or .parquet; also a directory, a glob ("runs/*/history.jsonl") or a comma list
    c.input = os.path.join(_REPO, "data", "rollouts", "sample.jsonl")
    c.workdir = ""  # or --workdir=DIR
    c.endpoint = ml_collections.ConfigDict()
    c.endpoint.base_url = "http://127.0.0.1:8000/v1"  # POST {base_url}/chat/completions
    c.endpoint.model = ""  # the served model name (required)
    c.endpoint.api_key = ""  # sent as a Bearer token when set; redacted in report.json
    c.endpoint.timeout_s = 120.0
    c.endpoint.max_retries = 4  # on 429/5xx/connection errors, exponential backoff
    c.endpoint.backoff_s = 1.0  # first retry delay (doubles each retry, jittered, max 60 s)
    c.endpoint.concurrency = 8  # requests in flight
    c.endpoint.temperature = 0.0
    c.endpoint.max_tokens = 2048
    c.mode = "auto"  # auto | keep | exclude
    c.rows = "verifier_positive"  # verifier_positive | all
    c.overwrite = False  # re-review rows that already carry an annotation
    c.max_repairs = 1  # repair rounds for an annotation that does not compile
    # What validation compiles with: set these as in the curate run that reads the output.
    c.tokenizer = "qwen"
    c.template = "chatml"
    c.max_length = 32768  # rows longer than this are withheld too_long before asking; 0 = none
    c.cache_dir = ""  # default WORKDIR/cache
    c.chunk_rows = 1024  # rows asked per step (bounds memory)
    c.rows_per_shard = 0  # 0 = one output file (curate reads one file per run)
    c.compress = True  # .jsonl.gz shards
    c.progress = True
    return c
