"""`rossjax swe-pool --config=configs/propel_swe.py:pool`: PROPEL's offline SWE bug pool, the base
generator's episodes over each repository, every final diff verified as a bug
(verify.swe.verify_bug), written as the pool `rossjax label-corpus
--config=configs/propel_swe.py:label` reads.

The generator (config.generator.kind):
  model     an HF folder (`path`) or a preset on the rollout engine (rossjax/train/rl/agentic.py,
            the env agents/swe_env.py SweBugEnv: GRPO's episode exactly), `episodes_per_repo`
            episodes of each repository as one group; the records keep the exact token ids and
            one span per message (`agent.message_spans`), so the probe reads each generated turn;
  endpoint  an OpenAI-compatible server (agents.rollout.OpenAIPolicy), `generator.workers`
            episodes at a time in threads (agents.swe.write_bug; each its own scratch copy);
  fn        module:function, an agent policy, or a per-episode factory (`per_episode` true,
            called with (base, j)): `rossjax.agents.swe_pool:MUTATION_STANDIN`, the scripted
            stand-in of `:pool,runlocal` (NOT a model).
Records of the HTTP paths get the rendering's token ids (config.tokenizer, config.template) and
their message spans, the same fields the engine path writes.

Outputs (config.output, default WORKDIR/swe_pool):
  episodes.jsonl  every episode's record (messages, token_ids, agent.message_spans, patch,
                  verdict);
  pool.jsonl      the verified bugs only (the same records), label-corpus's `pool`;
  report.json     counts, invalid {id: reason} and reasons by kind, undecided, per repository,
                  settings, `next` (the label-corpus step, printed by the command).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shlex
import time
import types

from rossjax.errors import ConfigError

FIELD = "configs/propel_swe.py:pool"
KINDS = ("model", "endpoint", "fn")


def check_config(c) -> None:
    g = c.generator
    if g.kind not in KINDS:
        raise ConfigError(f"{FIELD}: config.generator.kind is {g.kind!r}; it is one of "
                          f"{', '.join(KINDS)}.")
    if g.kind == "model" and not (g.path or g.preset):
        raise ConfigError(f"{FIELD}: config.generator.path and .preset are both empty; give an HF "
                          "folder or a preset name.")
    if g.kind == "fn" and not g.fn:
        raise ConfigError(f"{FIELD}: config.generator.fn is empty; give module:function.")
    if g.kind == "endpoint" and not g.endpoint.model:
        raise ConfigError(f"{FIELD}: config.generator.endpoint.model is empty.")
    from rossjax.agents.parse import STYLES

    if g.kind != "model" and g.style not in STYLES:
        raise ConfigError(f"{FIELD}: config.generator.style is {g.style!r}; an {g.kind} generator "
                          f"runs on the HTTP driver, which reads {' or '.join(STYLES)} text (and "
                          "structured tool calls); config.agent.style is the engine path's.")
    from rossjax.agents.swe import MAX_WORKERS

    w = g.workers
    if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_WORKERS:
        raise ConfigError(f"{FIELD}: config.generator.workers is {w!r}; it must be an integer "
                          f"from 1 to {MAX_WORKERS} (episodes at once on the HTTP path).")
    if c.episodes_per_repo < 1:
        raise ConfigError(f"{FIELD}: config.episodes_per_repo is {c.episodes_per_repo}; it must "
                          "be at least 1.")


def reference(g) -> str:
    """The generator's frozen reference (what the probe reads): the model itself, or for an HF
    path the folder; an endpoint or fn generator names none (config.reference then)."""
    return g.path or (f"preset:{g.preset}" if g.preset else "")


def tokenizer_spec(c) -> str:
    """config.tokenizer, or when empty the generator's HF folder (else "qwen")."""
    return c.tokenizer or c.generator.path or "qwen"


def _tokenizer(c, workdir):
    from rossjax.train.propel.solvers import load_tokenizer

    return load_tokenizer(tokenizer_spec(c), workdir)


def with_ids(rec: dict, tok, template: str) -> dict:
    """An HTTP record given the rendering's token ids and message spans (engine records have
    their own)."""
    from rossjax.train.rl.agentic import message_spans, render

    tools = rec.get("tools") or []
    full = render(rec["messages"], template, tok, tools).text
    ids = tok.encode(full)
    view = types.SimpleNamespace(note="", messages=rec["messages"], tools=tools, ids=ids)
    rec["token_ids"] = [int(x) for x in ids]
    rec.setdefault("agent", {})["message_spans"] = message_spans(view, full, tok, template)
    return rec


def _http_episodes(c, repos, tok, seed) -> list[dict]:
    from rossjax.agents.swe import write_bug
    from rossjax.agents.swe_env import clean_baseline

    g, a = c.generator, c.agent
    if g.kind == "fn":
        from rossjax.verify.base import load_fn

        gen = load_fn(g.fn, "config.generator.fn")
    else:
        from rossjax.train.propel.swe_label import policy as endpoint_policy

        gen = endpoint_policy(types.SimpleNamespace(kind="endpoint", endpoint=g.endpoint))
    jobs = [(repo, clean_baseline(repo, a.suite_timeout_s), j) for repo in repos
            for j in range(c.episodes_per_repo)]

    def one(job):
        repo, base, j = job
        policy = gen(base, j) if getattr(gen, "per_episode", False) else gen
        row, _ = write_bug(base, policy, f"{base.name}-{j}", suite_timeout_s=a.suite_timeout_s,
                           style=g.style, max_turns=a.max_turns,
                           env={"step_timeout_s": a.step_timeout_s,
                                "episode_timeout_s": a.episode_timeout_s})
        row["task"]["repo"] = repo
        return with_ids(row, tok, c.template)

    if g.workers <= 1 or len(jobs) <= 1:
        return [one(job) for job in jobs]
    # episodes at once, each with its own env and scratch copy; rows in job order
    with cf.ThreadPoolExecutor(min(g.workers, len(jobs)), thread_name_prefix="rossjax-gen") as pool:
        return list(pool.map(one, jobs))


def _engine_episodes(c, repos, tok, seed) -> list[dict]:
    from rossjax.agents.swe import GENERATOR_PROMPT
    from rossjax.agents.swe_env import clean_baseline
    from rossjax.train.propel.solvers import load_model
    from rossjax.train.rl.agentic import AgentSpec, rollouts
    from rossjax.train.rl.agentic_grpo import make_record

    g, a = c.generator, c.agent
    mc, params = load_model(g, tok, seed, "config.generator")
    spec = AgentSpec(env="rossjax.agents.swe_env:SweBugEnv",
                     env_kwargs=json.dumps({"suite_timeout_s": a.suite_timeout_s}),
                     step_timeout_s=a.step_timeout_s, episode_timeout_s=a.episode_timeout_s,
                     style=a.style, max_turns=a.max_turns, max_tokens=a.max_tokens,
                     max_new_tokens=a.max_new_tokens)
    out, envs = [], []
    for i, repo in enumerate(repos):  # one repository's group at a time: slots = episodes
        name = clean_baseline(repo, a.suite_timeout_s).name
        task = {"id": f"swe-{name}", "repo": repo, "domain": "swe",
                "prompt": GENERATOR_PROMPT.format(name=name)}
        trajs = rollouts(mc, params, tok, [task], spec, group=c.episodes_per_repo,
                         temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
                         seed=seed * 1_000_003 + i, template=c.template, envs=envs)
        for t in trajs:
            rec = make_record(t, run="swe-pool", step=0, style=spec.style)
            rec["id"] = f"{name}-{t.sample}"
            rec["task"]["repo"] = repo
            out.append(rec)
    for e in envs:
        e.shutdown()
    return out


def episodes(c, repos, workdir: str, seed: int = 0) -> list[dict]:
    """The generator's records over `repos` (module doc), `episodes_per_repo` each."""
    tok = _tokenizer(c, workdir)
    if c.generator.kind == "model":
        return _engine_episodes(c, repos, tok, seed)
    return _http_episodes(c, repos, tok, seed)


def write_jsonl(path: str, rows) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(path + ".tmp", path)


def next_step(c, out: str) -> str:
    """label-corpus over this pool, runnable as printed (`:runlocal`: the reverting stand-in
    solver; else the solver endpoint config.next_solver names, SOLVER when empty)."""
    q = shlex.quote
    ref = c.reference or reference(c.generator)
    cmd = (f"rossjax label-corpus --config=configs/propel_swe.py:label"
           f"{',runlocal' if c.runlocal else ''} --config.pool={q(os.path.join(out, 'pool.jsonl'))} "
           f"--config.reference={q(ref)} --config.tokenizer={q(tokenizer_spec(c))} "
           f"--config.template={q(c.template)} --config.output={q(os.path.join(out, 'labels'))}")
    if not c.runlocal:
        cmd += f" --config.solver.endpoint.model={q(c.next_solver or 'SOLVER')}"
    return cmd


def run(c, workdir: str) -> dict:
    from rossjax.agents.swe_pool import is_kept, split_repos, summarize

    check_config(c)
    out = c.output or os.path.join(workdir or ".", "swe_pool")
    os.makedirs(out, exist_ok=True)
    for name in ("report.json", "pool.jsonl"):  # an earlier run's must not pass for this one's
        if os.path.isfile(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    repos = split_repos(c.split, tuple(c.repos))
    t0 = time.perf_counter()
    recs = episodes(c, repos, out, c.seed)
    write_jsonl(os.path.join(out, "episodes.jsonl"), recs)
    kept = [r for r in recs if is_kept(r)]
    write_jsonl(os.path.join(out, "pool.jsonl"), kept)
    s = summarize(recs)
    g = c.generator
    report = {**s, "repos": repos, "episodes_per_repo": c.episodes_per_repo,
              "generator": {"kind": g.kind, **({"fn": g.fn} if g.kind == "fn" else
                                               {"model": g.endpoint.model} if g.kind == "endpoint"
                                               else {"model": reference(g)})},
              "agent": c.agent.to_dict(), "seconds": round(time.perf_counter() - t0, 1),
              "next": next_step(c, out) if kept else None}
    with open(os.path.join(out, "report.json.tmp"), "w") as f:
        json.dump(report, f, indent=1)
    os.replace(os.path.join(out, "report.json.tmp"), os.path.join(out, "report.json"))
    return {**report, "output": out}
