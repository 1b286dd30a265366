"""Solvers for PROPEL's tasks and their K trials per task: what `rossjax eval-generator` (utility
rate), `rossjax label-corpus` (U_S labels) and the Math oracles (reference answers) all run.

Kinds (`section.kind`):
  model     a local rossjax checkpoint (`path`, or a `preset` sized to the tokenizer) sampled on
            the rollout engine (rossjax.sample.generate), all of a batch's K answers at once;
  endpoint  an OpenAI-compatible chat-completions endpoint (`section.endpoint`: base_url, model,
            api_key_env, temperature, max_tokens, ...) through rossjax.openai_api's client
            (retries, one deadline per request, credentials scrubbed, optional cache); trial j
            sends `seed + j`, so K trials are K different requests (and cache entries);
  fn        a Python callable `module:function` (`section.fn`), `(task, k, seed) -> [k texts]`;
  oracle    the task's own answer (induction: its f; math: \\boxed{reference}): always solves;
  identity  (induction) returns its first argument;
  lookup    (induction) a table of the visible pairs: never infers f, so it scores 0 on hidden
            inputs (the check that they are hidden).
A trial is True/False, or None when it could not be decided (the reference run failed, or the
endpoint gave no answer: its request failed). An answer cut off at max_tokens (finish_reason
'length'; a checkpoint's at max_new_tokens) comes back as a verify.answers.Truncated text: a
failed trial, and an oracle failure (math_oracle), since the last \\boxed{} of a cut-off solution
may be an intermediate result. `Solver.stats` counts tasks, trials, answers that never came,
answers cut off and, for endpoints, requests, retries, cache hits and tokens: every report
carries it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os

from rossjax.errors import ConfigError
from rossjax.verify import induction_task, math_oracle
from rossjax.verify.answers import Truncated
from rossjax.verify.induction import verify

KINDS = ("model", "endpoint", "fn", "oracle", "identity", "lookup")
_INDUCTION_ONLY = ("identity", "lookup")


def load_model(section, tok, seed, field):
    """(ModelConfig, params) of a config section (path, or preset sized to the tokenizer),
    float32 on one device."""
    from rossjax.models import loading

    m = {"path": section.path, "preset": section.preset, "dtype": "float32"}
    if section.path:
        m["param_dtype"] = "float32"
    else:
        m["vocab_size"] = tok.vocab_size
    return loading.load_model(m, seed=seed, field=field)


def load_tokenizer(spec: str, workdir: str):
    from rossjax.tokenizers import load_tokenizer as load
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    return load(write_ascii_tokenizer(os.path.join(workdir, "tokenizer")) if spec == "ascii" else spec)


# PROPEL's solver sampling (temperature, nucleus, top-k): what solver_config's sections default
# to, for a checkpoint solver and (sent in the request) an endpoint; oracles sample the same way
PAPER_SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


def section_sampling(section, c) -> dict:
    """A model solver's sampling: the section's temperature / top_p / top_k; a section without
    them (a config from before) samples as it did, at `c.temperature`, unfiltered."""
    return {"temperature": float(section.get("temperature", c.temperature)),
            "top_p": float(section.get("top_p", 1.0)), "top_k": int(section.get("top_k", 0))}


def sample_texts(mc, params, tok, prompts_msgs, n, c, seed, template="chatml", sampling=None):
    """n answers per prompt (chat-rendered) from a model, decoded without the end marker; one
    that reached max_new_tokens without it is a Truncated text. `sampling` (temperature, top_p,
    top_k) defaults to `c.temperature`, unfiltered (a generator's sampling)."""
    from rossjax import sample
    from rossjax.templates import render_prompt

    sampling = sampling or {"temperature": c.temperature}
    prompts = [tok.encode(render_prompt(m, template, tok)) for m in prompts_msgs]
    gen = sample.generate(mc, params, prompts, c.max_new_tokens, **sampling,
                          stop_ids=(tok.eos_id,), num_samples=n, seed=seed)
    texts = [tok.decode([t for t in s if t != tok.eos_id]) for s in gen.sequences()]
    return [Truncated(x) if why == "length" else x for x, why in zip(texts, gen.finish_reason)]


def check_section(section, field: str = "config.solver"):
    """One-sentence ConfigErrors for a solver section, before any model loads."""
    kind = section.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{field}.kind {kind!r} is not one of {', '.join(KINDS)}.")
    if kind == "model" and not (section.get("path") or section.get("preset")):
        raise ConfigError(f"{field}.path and {field}.preset are both empty; give a model folder "
                          f"or a preset name (or another {field}.kind).")
    if kind == "fn" and not section.get("fn"):
        raise ConfigError(f"{field}.fn is empty; give the solver as module:function.")
    if kind == "endpoint" and not (section.get("endpoint") or {}).get("model"):
        raise ConfigError(f"{field}.endpoint.model is empty: name the model the endpoint serves.")


def model_identity(section) -> tuple | None:
    """What model a solver section asks (kind and its path / preset / endpoint / fn), or None
    for the programmatic kinds, which are checks, not models."""
    kind = section.get("kind")
    if kind == "model":
        return (kind, section.get("path") or "", section.get("preset") or "")
    if kind == "endpoint":
        e = section.get("endpoint") or {}
        return (kind, e.get("base_url") or "", e.get("model") or "")
    if kind == "fn":
        return (kind, section.get("fn") or "")
    return None


def check_oracles(oracles, field: str = "config.oracles"):
    """PROPEL's two oracles are two different models: the same model as both is refused
    unless `allow_same` says so (two draws of one model agree more often than two models)."""
    for name in ("a", "b"):
        check_section(oracles[name], f"{field}.{name}")
    same = model_identity(oracles["a"])
    if same is not None and same == model_identity(oracles["b"]) and not oracles.get(
            "allow_same", False):
        raise ConfigError(f"{field}.a and {field}.b are the same model ({' '.join(same)}); "
                          f"PROPEL's reference answers come from two different models: name "
                          f"another for {field}.b, or set {field}.allow_same=True.")


def _messages(task: dict, system: str) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": task["prompt"]}]


class Solver:
    """`answers(solver_tasks, k, seed) -> [[k texts (None: no answer came; Truncated: cut off at
    max_tokens)] per task]` for one configured solver; `stats` counts what it did."""

    def __init__(self, section, tok, c, seed: int = 0, field: str = "config.solver"):
        if section.kind not in KINDS:
            raise ConfigError(f"{field}.kind {section.kind!r} is not one of {', '.join(KINDS)}.")
        self.section, self.tok, self.c, self.seed, self.field = section, tok, c, seed, field
        self._model = None
        self._clients = {}  # endpoint: one client per trial seed
        self._fn = None
        self.stats = collections.Counter(tasks=0, trials=0, no_answer=0, cut_off=0)
        self.errors: list[str] = []  # the first few failed requests, for the report
        if section.kind == "fn":
            from rossjax.verify.rewards import load_custom

            self._fn = load_custom(section.get("fn", ""), field=f"{field}.fn")
        if section.kind == "endpoint":
            e = section.get("endpoint")
            if e is None or not e.get("model"):
                raise ConfigError(f"{field}.endpoint.model is empty: name the model the endpoint "
                                  f"serves.")
            if "seed" in _extra(e, field):
                raise ConfigError(f"{field}.endpoint.extra_body sets 'seed'; the solver sends its "
                                  f"own per trial (seed + trial index).")
            self._client(seed)  # a bad URL or setting fails here, before any model loads

    def _client(self, seed: int):
        from rossjax.openai_api import ChatClient

        if seed not in self._clients:
            e = self.section.endpoint
            self._clients[seed] = ChatClient(
                base_url=e.get("base_url") or None, model=e.model,
                api_key=os.environ.get(e.get("api_key_env") or "OPENAI_API_KEY", ""),
                timeout_s=e.get("timeout_s", 300), max_retries=e.get("max_retries", 4),
                temperature=e.get("temperature", 1.0), max_tokens=e.get("max_tokens", 4096),
                cache_dir=e.get("cache_dir") or None,
                extra_body={**endpoint_filters(e), **_extra(e, self.field), "seed": int(seed)},
                name="solver")
        return self._clients[seed]

    def answers(self, tasks: list[dict], k: int, seed: int) -> list[list[str | None]]:
        """k answers for each task."""
        kind = self.section.kind
        self.stats["tasks"] += len(tasks)
        self.stats["trials"] += len(tasks) * k
        if kind in _INDUCTION_ONLY and any(t.get("domain") == "math" for t in tasks):
            raise ConfigError(f"{self.field}.kind {kind!r} is an induction check; math tasks need "
                              f"model, endpoint, fn or oracle.")
        if kind == "oracle":
            return [[_oracle_answer(t, self.field)] * k for t in tasks]
        if kind == "identity":
            return [["```python\ndef f(*a):\n    return a[0]\n```"] * k for t in tasks]
        if kind == "lookup":
            return [[induction_task.lookup_answer(t)] * k for t in tasks]
        if kind == "fn":
            out = [self._fn_answers(t, k, seed) for t in tasks]
        elif kind == "endpoint":
            out = self._endpoint_answers(tasks, k, seed)
        else:
            self._model = self._model or load_model(self.section, self.tok, self.seed + 1,
                                                    self.field)
            system = self.section.get("system", "")
            texts = sample_texts(*self._model, self.tok, [_messages(t, system) for t in tasks],
                                 k, self.c, seed, sampling=section_sampling(self.section, self.c))
            out = [texts[i * k:(i + 1) * k] for i in range(len(tasks))]
        self.stats["no_answer"] += sum(a is None for row in out for a in row)
        self.stats["cut_off"] += sum(isinstance(a, Truncated) for row in out for a in row)
        return out

    def _fn_answers(self, task: dict, k: int, seed: int) -> list:
        got = self._fn(task, k, seed)
        if not isinstance(got, (list, tuple)) or len(got) != k or not all(
                a is None or isinstance(a, str) for a in got):
            raise TypeError(f"{self.field}.fn {self.section.get('fn')} must return a list of {k} texts "
                            f"(str or None) for task {task.get('id')!r}, got {str(got)[:80]}.")
        return list(got)

    def _endpoint_answers(self, tasks, k, seed):
        from rossjax.openai_api import ChatError

        system = self.section.get("system", "")

        def one(job):
            i, j = job
            try:
                reply = self._client(seed + j).ask(_messages(tasks[i], system), stage="solver")
            except ChatError as err:  # this trial has no answer; the run goes on
                if len(self.errors) < 5:
                    self.errors.append(f"task {tasks[i].get('id')!r} trial {j + 1}: {err}")
                return None
            return Truncated(reply.text) if reply.finish_reason == "length" else reply.text

        jobs = [(i, j) for i in range(len(tasks)) for j in range(k)]
        for j in range(k):
            self._client(seed + j)  # made here: the pool's threads only read the dict
        workers = max(1, int(self.section.endpoint.get("workers", 8)))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            texts = list(pool.map(one, jobs))
        return [texts[i * k:(i + 1) * k] for i in range(len(tasks))]

    def report(self) -> dict:
        """What the solver did: tasks, trials, answers that never came or were cut off, and for
        an endpoint its requests, retries, cache hits and tokens."""
        out = {"kind": self.section.kind, **self.stats}
        if self._clients:
            tot = collections.Counter()
            for cl in self._clients.values():
                tot.update(cl.totals())
            out["endpoint"] = {"url": next(iter(self._clients.values())).base_url, **tot}
            out["errors"] = list(self.errors)
        return out


def endpoint_filters(e) -> dict:
    """An endpoint's top_p / top_k request fields (top_k is vLLM's and SGLang's extension);
    0 or absent sends none, so a server without them is asked nothing new."""
    out = {}
    if e.get("top_p") and float(e.get("top_p")) < 1.0:
        out["top_p"] = float(e.get("top_p"))
    if e.get("top_k") and int(e.get("top_k")) > 0:
        out["top_k"] = int(e.get("top_k"))
    return out


def _extra(e, field) -> dict:
    from rossjax.openai_api import parse_extra_body

    try:
        return parse_extra_body(e.get("extra_body"))
    except ConfigError as err:
        raise ConfigError(f"{field}.endpoint: {err}") from None


def _oracle_answer(task: dict, field: str) -> str:
    if task.get("domain") != "math":
        return f"```python\n{task['program']}\n```"
    if task.get("reference") is None:
        raise ConfigError(f"{field}.kind 'oracle' answers with the task's reference, and a math "
                          f"task being labelled has none; give the oracles a model, endpoint or fn.")
    return f"\\boxed{{{task['reference']}}}"


def judge(task: dict, answer: str | None) -> bool | None:
    """One trial: an induction answer scored on the task's hidden inputs only; a math answer
    against the task's reference (math-verify); no answer is undecided (None), an answer cut
    off at max_tokens failed (False)."""
    if answer is None:
        return None
    if isinstance(answer, Truncated):
        return False
    record = {"task": task, "messages": [{"role": "user", "content": task["prompt"]},
                                         {"role": "assistant", "content": answer}]}
    if task.get("domain") == "math":
        from rossjax.verify.math_verifier import verify as math_verify

        return math_verify(record).passed
    return verify(record).passed


def trials(solver: Solver, solver_tasks: list[dict | None], k: int, seed: int = 0,
           batch_tasks: int = 64) -> list[list]:
    """K trials per solver task ([] for None: an invalid task is not tried), sampled
    `batch_tasks` tasks at a time. A task's answers that are the same text are judged once (a
    sampled solver repeats itself often, and each judgment is a sandboxed run): a repeat would run
    the same program on the same inputs, so only a program whose own outcome varies run to run
    (near the time limit, or reading hash seeds) could be judged otherwise K times over."""
    out = [[] for _ in solver_tasks]
    todo = [i for i, t in enumerate(solver_tasks) if t is not None]
    for b in range(0, len(todo), max(1, batch_tasks)):
        chunk = todo[b:b + batch_tasks]
        answers = solver.answers([solver_tasks[i] for i in chunk], k, seed + b)
        for i, ans in zip(chunk, answers):
            seen = {}  # (kind, text) -> verdict: a Truncated text fails, its equal str may not
            for a in ans:
                key = (type(a).__name__, a)
                if key not in seen:
                    seen[key] = judge(solver_tasks[i], a)
            out[i] = [seen[(type(a).__name__, a)] for a in ans]
    return out


def oracle_labels(oracles: list[Solver], tasks: list[dict | None], attempts: int = math_oracle.ATTEMPTS,
                  seed: int = 0, batch_tasks: int = 64, names=("a", "b")) -> list:
    """The two-oracle reference policy (rossjax.verify.math_oracle) over math solver tasks
    (without references): each oracle answers each task `attempts` times; an OracleLabel per
    task, None for None (an invalid problem is not asked)."""
    todo = [i for i, t in enumerate(tasks) if t is not None]
    texts = {i: [] for i in todo}
    for o, solver in enumerate(oracles):
        for b in range(0, len(todo), max(1, batch_tasks)):
            chunk = todo[b:b + batch_tasks]
            # each oracle draws its own seeds: two copies of one model are two samples
            got = solver.answers([tasks[i] for i in chunk], attempts, seed + 7919 * (o + 1) + b)
            for i, row in zip(chunk, got):
                texts[i].append(row)
    return [math_oracle.agree(texts[i], names) if i in texts else None for i in range(len(tasks))]

