"""Label a pool of generated tasks for probe training (PROPEL's U_S): K solver trials per task.
Induction (`domain=induction`): the AZR protocol (5 shown pairs + the message, scored on the 5
hidden inputs). Math (`domain=math`): the generator wrote a problem only; two oracles answer it
twice each and it is scored only when all four answers agree (the agreed answer becomes the
reference; else invalid: oracle disagreement / oracle failure), then the solver's K answers are
checked against that reference with math-verify.

    rossjax label-corpus --config=configs/label_corpus.py --config.pool=runs/pool.jsonl \
        --config.solver.path=SOLVER_DIR --workdir=runs/labels
    rossjax label-corpus --config=configs/label_corpus.py --config.domain=math \
        --config.pool=runs/math_pool.jsonl --config.solver.kind=endpoint \
        --config.solver.endpoint.base_url=http://127.0.0.1:8000/v1 \
        --config.solver.endpoint.model=SOLVER --config.oracles.a.kind=endpoint \
        --config.oracles.a.endpoint.model=ORACLE_A --config.oracles.b.kind=endpoint \
        --config.oracles.b.endpoint.base_url=http://127.0.0.1:8001/v1 \
        --config.oracles.b.endpoint.model=ORACLE_B --workdir=runs/math_labels
    rossjax extract --config=configs/extract.py --config.input=runs/labels/label_corpus/inputs.jsonl ...
    rossjax probe-sweep --config=configs/probe_sweep.py \
        --config.labels=runs/labels/label_corpus/labels.jsonl ...

Needs: a pool JSONL of task objects (induction {"id", "program", "inputs", "message"}; math
{"id", "problem"}) or generator records (a GRPO history.jsonl works: its ids, probe scores and
steps are kept) and a solver. Solver kinds (rossjax/train/propel/solvers.py): `model` (a checkpoint,
`path` or `preset`, on the rollout engine), `endpoint` (an OpenAI-compatible server, e.g.
`rossjax serve` or vLLM; the key is read from the variable `endpoint.api_key_env` names),
`fn` (`module:function`), and the checks `oracle` / `identity` / `lookup`. Writes labels.jsonl,
inputs.jsonl (for `rossjax extract`, same ids, rendered as GRPO's probe reads a task),
tasks.jsonl and report.json (with the solver's and the oracles' trial counts) into
WORKDIR/label_corpus (or --config.output).

Time: one sandboxed reference run per task (induction) or 2 x 2 oracle answers (math) plus K
solver samples and K checks; with a 1.5B solver, 2k tasks x K = 8 is a TPU job (estimated, not
measured: tens of minutes, mostly sampling); the programmatic solvers label ~10 tasks/s on this
CPU.
"""

import ml_collections

from rossjax.configs import common


def solver_config(kind: str = "model"):
    """A solver section (shared with configs/eval_generator.py)."""
    endpoint = ml_collections.ConfigDict(dict(
        base_url="",                 # "" = $OPENAI_BASE_URL, else http://127.0.0.1:8000/v1
        model="",                    # the model name the endpoint serves
        api_key_env="OPENAI_API_KEY",  # the variable holding the key (never the key itself)
        temperature=0.6, top_p=0.95, top_k=20,  # PROPEL's solver sampling (top_k: vLLM's field)
        max_tokens=4096, timeout_s=300.0, max_retries=4,
        cache_dir="",                # answers cached on disk (a rerun asks nothing twice)
        workers=8,                   # requests in flight
        extra_body=""))              # JSON object of extra request fields (not seed: per trial)
    # a checkpoint solver's (kind model) sampling: PROPEL's T=0.6, top_p 0.95, top_k 20
    return ml_collections.ConfigDict(dict(kind=kind, path="", preset="", fn="", system="",
                                          temperature=0.6, top_p=0.95, top_k=20,
                                          endpoint=endpoint))


def get_config():
    c = ml_collections.ConfigDict()
    c.workdir = ""
    c.pool = ""                     # JSONL(.gz) of tasks or generator records
    c.output = ""                   # default: WORKDIR/label_corpus
    c.domain = "induction"          # induction | math
    c.tokenizer = "qwen"            # the reference model's tokenizer (inputs.jsonl), or "ascii"
    c.template = "chatml"           # as config.template of the GRPO run that uses the probe
    c.solver = solver_config()
    # math: the two reference oracles, `attempts` answers each; all must agree (math_oracle.py)
    # allow_same: one model as both oracles (refused by default: PROPEL uses two models)
    c.oracles = ml_collections.ConfigDict(dict(a=solver_config(), b=solver_config(), attempts=2,
                                               allow_same=False))
    c.k = 8                         # trials per task (K = 8: band [1/8, 3/8]; K = 3: band "open")
    c.lo, c.hi = 1 / 8, 3 / 8       # only for report.json's band rate; the sweep applies its own
    c.induction = ml_collections.ConfigDict(dict(n_inputs=10, n_visible=5, split="first"))
    c.batch_tasks = 64              # tasks sampled per solver batch
    c.max_new_tokens = 768
    c.temperature = 1.0             # only for solver sections without their own temperature
    c.seed = 0
    c.sandbox = common.sandbox_config()
    return c
