"""RetroGen reconstruction: expert artifacts + a corpus -> verified tool-use trajectories.

Run (needs a chat model behind an OpenAI-compatible endpoint: vLLM, SGLang, TGI, llama.cpp
server, OpenAI, or `rossjax serve` on a local checkpoint):

    export OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=...   # or endpoint.base_url
    rossjax reconstruct --config=configs/reconstruct.py --workdir=/tmp/rc \
        --config.endpoint.model=Qwen/Qwen3-32B
    rossjax retrogen --config=configs/retrogen.py --config.input=/tmp/rc/trajectories.jsonl \
        --config.output=/tmp/rc/retrogen
  `:runlocal` needs nothing started by hand: it starts a STAND-IN endpoint on a free 127.0.0.1
  port (rossjax/reconstruct/standin.py: rule-based answers over the shipped corpus, NOT a
  model; model id rules-standin) and stops it at the end, so the run ends with kept
  trajectories scored on all four signals, then gates, thresholds and serializes them into SFT
  rows (WORKDIR/retrogen, config.then_retrogen), curates them and trains a random tiny model
  on them with `rossjax train --config=configs/retrogen_sft.py:runlocal` (WORKDIR/curated,
  WORKDIR/sft, config.then_sft; ~30 s on 2 CPU cores, compilation dominates); its figures
  measure the rules, not RetroGen.
  --config.serve.model=tiny serves a random tiny model with `rossjax serve` instead.
  `rossjax retrogen-loop --config=configs/reconstruct.py:runlocal --workdir=DIR` repeats it
  for config.loop.rounds rounds, each later round served by the model the round before
  trained (docs/retrogen.md, "The loop"); DIR/report.md holds every round's figures.
  Baselines: --config.method=forwardgen | artifact_only (the same reconstruction with its
  trajectory removed); the selection ablations (next-N replace, single-signal filters) act on
  these records in `rossjax retrogen` (rossjax/curate/retrogen.py `selection`).

Needs: config.input, artifacts as JSONL ({"id", "domain", "text", "kind"?, "title"?,
"context"? (side context for induction, e.g. an abstract)}; shipped:
data/retrogen/artifacts.jsonl, a related-work section, a 10-K narrative and a judgment per
domain) and config.corpus, documents as JSONL ({"id", "text", "title"?}; shipped:
data/retrogen/corpus.jsonl). Writes WORKDIR/trajectories.jsonl (the records `rossjax retrogen`
reads), withheld.jsonl, invalid.jsonl, transcripts.jsonl, report.json, journal.jsonl (resume)
and cache/ (every answer: a rerun asks nothing twice).

Paper defaults: at most 30 tool steps, an 8,000-character sliding context window, Eq. 4 with
lambda = 0.25, the rubric (coverage / structure / synthesis / citation) before the task, the
agent never shown y*. rossjax's own (docs/deviations.md): the prompts' wording (not App. C's
text), cue rules, leak rules (8-word n-gram, cue kinds, length), retrieval depth 3 per cue and
8 documents in Ê, the diversity pools. Time: ~13-21 requests an artifact (3 anchor, 1 plan,
one per step, 4 verification); estimated, not measured: a 32B model on one GPU at concurrency 8 reconstructs
~10-30 artifacts a minute.
"""

import ml_collections

from rossjax.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variants = common.variants(arg, ("runlocal",), "reconstruct.py")
    c = ml_collections.ConfigDict()
    c.input = common.data_file("retrogen", "artifacts.jsonl")
    c.corpus = common.data_file("retrogen", "corpus.jsonl")
    c.output = ""  # or --workdir=DIR
    c.method = "retrogen"  # retrogen | forwardgen | artifact_only
    c.seed = 0  # the diversity draws (per artifact and method, independent of row order)
    c.endpoint = ml_collections.ConfigDict()
    c.endpoint.base_url = ""  # "" = $OPENAI_BASE_URL, else http://127.0.0.1:8000/v1
    c.endpoint.model = ""  # the served model name (required unless serve.model is set)
    c.endpoint.api_key = ""  # "" = $OPENAI_API_KEY; redacted in reports
    c.endpoint.timeout_s = 300.0
    c.endpoint.max_response_bytes = 8 << 20
    c.endpoint.max_retries = 4
    c.endpoint.backoff_s = 1.0
    c.endpoint.concurrency = 8  # artifacts reconstructed at once
    c.endpoint.temperature = 0.7  # the steps sample; the seed of the draws varies the prompts
    c.endpoint.max_tokens = 2048
    c.endpoint.extra_body = ""  # JSON object of extra request fields (seed, top_p, ...)
    c.endpoint.response_format = "none"  # none | json_object (vLLM, SGLang, OpenAI: JSON only)
    c.reask = "failed"  # failed | none | all (review's cache policy)
    c.cache_dir = ""  # default WORKDIR/cache; share it across methods to reuse the anchor
    c.answer_retries = 1  # re-asks of a stage whose answer fails its check
    c.max_answer_chars = 50_000
    c.min_artifact_chars = 200
    c.max_artifact_chars = 20_000  # every induction prompt carries the artifact whole
    # anchor
    c.max_cues = 24
    c.rubric_min = 3
    c.rubric_max = 8
    c.leak = ml_collections.ConfigDict(dict(ngram=8, max_task_chars=600, max_task_ratio=0.5))
    c.retrieval_depth = 3  # BM25 documents per cue query
    c.max_evidence = 8  # documents in Ê
    c.retrieval_min_ratio = 0.3  # a document's best score >= this x the best document's
    c.search_k = 3  # hits a search step returns
    # trace
    c.max_tool_steps = 30
    c.max_writing_steps = 6  # outline steps (no tool) allowed besides the tool steps
    c.window_chars = 8000
    # verification
    c.evidence_chars = 1500  # characters of each Ê document shown to the grounding judge
    c.lam = 0.25  # Eq. 4
    # serve a local checkpoint for the run: a model folder, "tiny" (a random tiny model) or
    # "standin" (rule-based answers over the corpus, not a model: standin.py)
    c.serve = ml_collections.ConfigDict(dict(model="", model_id="local", max_len=8192, slots=4,
                                             startup_s=300.0))
    c.progress = True
    # then gate, threshold (the paper's values) and serialize the kept records into SFT rows
    # under WORKDIR/retrogen, as `rossjax retrogen` with configs/retrogen.py would
    c.then_retrogen = False
    # then curate those rows (recipe positive_sft) and train on them with `rossjax train`
    # (`rossjax reconstruct` runs both in its own process: rossjax/cli/reconstruct.py sft_chain);
    # needs then_retrogen. sft.base: a model folder to start from, or "tiny" (a random tiny model
    # with the ASCII tokenizer, built in WORKDIR/tiny_model); its tokenizer curates the rows.
    c.then_sft = False
    c.sft = ml_collections.ConfigDict(dict(base="tiny", config="retrogen_sft.py:runlocal",
                                           epochs=4, num_steps=-1, export=False))
    # `rossjax retrogen-loop` (rossjax/cli/retrogen_loop.py): rounds of reconstruct -> gate ->
    # SFT; round 1 uses the endpoint configured above, each later one serves the model the
    # round before trained (endpoint="served", `rossjax serve` on 127.0.0.1; answers cut at
    # max_tokens) or keeps the stand-in (endpoint="standin"); the seed moves by 1 a round
    c.loop = ml_collections.ConfigDict(dict(rounds=2, endpoint="served", max_tokens=64))
    if "runlocal" in variants:
        c.then_retrogen = True
        c.then_sft = True
        c.output = "runs/reconstruct_local"
        # the rule-driven stand-in endpoint (rossjax/reconstruct/standin.py): NOT a model; it
        # shows every stage, check and output end to end, not RetroGen's gains. "tiny" serves a
        # random tiny model instead (its answers are noise: every artifact ends invalid).
        c.serve.model = "standin"
        c.endpoint.temperature = 0.0
        c.endpoint.concurrency = 4
        c.endpoint.max_retries = 1
        c.answer_retries = 0
        c.progress = False
    return c
