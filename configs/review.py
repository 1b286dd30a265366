"""Annotate rollouts with a reviewer LLM: the stage that writes the `annotation` field.

Run (needs a served chat model behind an OpenAI-compatible endpoint: vLLM, SGLang, TGI,
llama.cpp server or OpenAI), e.g. with `vllm serve Qwen/Qwen3-32B --port 8000`:

    export OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=...   # or endpoint.base_url
    rossjax review --config=configs/review.py --workdir=/tmp/reviewed \
        --config.endpoint.model=Qwen/Qwen3-32B
    rossjax curate --config=configs/curate.py \
        --config.input=/tmp/reviewed/reviewed-00000.jsonl.gz --config.output=/tmp/curated
    # what the masks leave out: a seeded per-domain sample of excluded spans, seven categories
    rossjax review --config=configs/review.py --workdir=/tmp/classified --config.classify=True \
        --config.input=/tmp/reviewed/reviewed-00000.jsonl.gz --config.endpoint.model=Qwen/Qwen3-32B

The staged procedure (docs/review.md): single-turn rows get a proposal (whole / ordered keep
spans / reject), deterministic checks, an audit of the exact selected text and up to
`max_repair_rounds` repairs (a row no repair cleans is withheld `annotation_drop`); agentic rows
get semantic discovery over groups of `step_group` assistant steps on four axes, then one
boundary-localization request per finding (an unresolved finding withholds the row as
`review_unresolved`). Any answer that fails a check (bad JSON, cut off, wrong types, anchors,
consistency) is asked again with the failing check quoted, `max_step_retries` times.

Rows: the rows `rossjax curate` trains on (curate.schema.verifier_positive under `undecided` /
`unverified`, set as in the curate run) are reviewed, the others withheld with curate's codes
(config.rows=all reviews every row); rows that already carry an annotation are passed through
unless config.overwrite. Answers are cached with their requests in WORKDIR/cache
(config.cache_dir), so rerunning after a crash asks nothing twice. Outputs:
WORKDIR/reviewed-NNNNN.jsonl.gz, withheld.jsonl, invalid.jsonl, transcripts.jsonl (every request
and answer per row; `rossjax inspect` shows it next to the mask), report.json (requests, tokens,
failed checks and drops per stage).

Time: a single-turn row costs 2 requests (proposal + audit) plus retries and repairs, an agentic
row one per step group plus one per finding; estimated, not measured: a 32B model on one GPU
answers a ~1k-token rollout in ~5-20 s, so ~0.5-1 row/s at concurrency 8-16. CPU side is
negligible (no jax import).
"""

import ml_collections

from rossjax.configs import common


def get_config():
    c = ml_collections.ConfigDict()
    # .jsonl[.gz] or .parquet; also a directory, a glob ("runs/*/history.jsonl") or a comma list
    c.input = common.data_file("rollouts", "sample.jsonl")
    c.workdir = ""  # or --workdir=DIR
    c.endpoint = ml_collections.ConfigDict()
    c.endpoint.base_url = ""  # "" = $OPENAI_BASE_URL, else http://127.0.0.1:8000/v1
    c.endpoint.model = ""  # the served model name (required)
    c.endpoint.api_key = ""  # "" = $OPENAI_API_KEY; sent as a Bearer token; redacted in reports
    c.endpoint.timeout_s = 120.0  # the whole request (connect to last byte), not one read
    c.endpoint.max_response_bytes = 8 << 20  # a longer response body is not read: row withheld
    c.endpoint.max_retries = 4  # on 429/5xx/connection errors, exponential backoff
    c.endpoint.backoff_s = 1.0  # first retry delay (doubles each retry, jittered, max 60 s)
    c.endpoint.concurrency = 8  # rows reviewed at once (one kept-alive connection each)
    c.endpoint.temperature = 0.0
    c.endpoint.max_tokens = 2048
    # JSON object of extra request fields, e.g.
    # '{"seed": 0, "top_p": 0.95, "chat_template_kwargs": {"enable_thinking": false}}'
    c.endpoint.extra_body = ""
    c.endpoint.response_format = "none"  # none | json_object | json_schema (a schema per stage)
    c.mode = "auto"  # auto | keep (single-turn procedure) | exclude (agentic procedure)
    c.rows = "verifier_positive"  # verifier_positive | all
    c.undecided = "withhold"  # a null verdict counts as positive only with "keep" (as curate)
    c.unverified = "withhold"  # a row with no verdict counts as positive only with "keep"
    c.overwrite = False  # re-review rows that already carry an annotation
    c.max_step_retries = 2  # re-asks of one step whose answer fails a check
    c.max_repair_rounds = 2  # single-turn audit -> repair rounds before annotation_drop
    c.step_group = 4  # agentic: assistant steps judged per discovery request
    c.max_answer_chars = 50_000  # a longer answer is withheld reviewer_oversized
    # The paper's IF rule (on by default, as in the paper): verifier-positive rows of these
    # domains skip review, fully supervised (their verifier checks the whole response).
    c.if_bypass = True
    c.if_domains = "if,ifeval,instruction_following"
    # What validation compiles with: set these as in the curate run that reads the output.
    c.tokenizer = "qwen"
    c.template = "chatml"
    c.max_length = 32768  # rows longer than this are withheld too_long before asking; 0 = none
    c.cache_dir = ""  # default WORKDIR/cache
    # On a rerun: failed = ask again the cached answers that failed a check (unparseable, cut
    # off, ...), replay the rest; none = replay every cached answer; all = ask everything again.
    c.reask = "failed"
    c.chunk_rows = 1024  # rows asked per step (bounds memory)
    c.rows_per_shard = 0  # 0 = one output file (curate reads one file per run)
    c.compress = True  # .jsonl.gz shards
    c.progress = True
    # Excluded-content classification (rossjax/review/classify.py, docs/review.md): instead of
    # reviewing, sample excluded spans of the input's annotated rows (up to classify_per_domain
    # per domain, uniformly over rows first, seeded) and label each with one of seven
    # categories; WORKDIR/classify/report.json, spans.jsonl and categories.png.
    c.classify = False
    c.classify_per_domain = 50
    c.classify_seed = 0
    c.classify_context_chars = 1500  # rollout text shown before and after each span
    return c
