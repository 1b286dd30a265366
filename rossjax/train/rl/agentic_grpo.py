"""`rossjax grpo` with an environment (config.agent.env set; configs/grpo_agentic.py).

A step's batch is `contexts` tasks x `group_size` agent episodes on the rollout engine
(rossjax.train.rl.agentic). The trajectory reward is the environment's verdict (reward function
"env": 1 passed, 0 failed, NaN undecided, which gets advantage 0), delivered through the same
CPU-scores channel as the single-turn rewards (or, with reward.functions ("probe",) or
("solver",), PROPEL's reward on episodes the verdict passes and `invalid_reward` on the others:
configs/propel_swe.py) so advantages, the loss registries, IS
corrections, dynamic sampling and the records are the single-turn code unchanged. The update
row is the whole trajectory; the loss mask is 1 only where the target is a sampled token, so
observations and template tokens are context. The batch length is agent.max_tokens (rounded
up to 16), fixed, so the update compiles once.

History rows (rollout schema): messages with tool calls and tool results, `tools` (when they
are in the prompt), `token_ids` (the exact trajectory: prompt, sampled and observation tokens),
`logprobs` (the sampler's, of the policy tokens in order), `verifier` (the env's verdict),
`reward`, and `agent` {env, turns, stop, style, policy_spans, message_spans, calls, note}.
`rossjax curate --config.rows=verifier_positive --config.mask_mode=eligible` projects the
stored ids onto the rendered messages and supervises the assistant turns.
"""

from __future__ import annotations

import math
import time

import numpy as np

from rossjax.errors import ConfigError
from rossjax.sample import GenerationResult
from rossjax.train.rl import agentic, grpo_step, rollout

ENV_REWARD = "env"
GATED_BY = ("probe", "solver")  # rewards paid on valid episodes, -invalid_reward elsewhere
GATED = ((ENV_REWARD,), *((f,) for f in GATED_BY))


def enabled(cfg) -> bool:
    a = cfg.get("agent")
    return bool(a is not None and a.get("env"))


def spec_of(cfg) -> agentic.AgentSpec:
    return agentic.AgentSpec.from_config(cfg.agent, cfg.grpo.max_new_tokens)


def loss_len(cfg) -> int:
    """The longest loss region of a row (the constant normalizer of Dr. GRPO's aggregation)."""
    return int(cfg.agent.max_tokens) if enabled(cfg) else int(cfg.grpo.max_new_tokens)


def check_config(cfg):
    """One sentence per bad agent field, before a model loads."""
    a, g, r = cfg.agent, cfg.grpo, cfg.reward
    if tuple(r.functions) not in GATED or len(r.weights) != 1:
        raise ConfigError(f"config.reward.functions is {tuple(r.functions)}; with config.agent.env "
                          f"the reward is the environment's verdict ('{ENV_REWARD}',), or PROPEL's "
                          "('probe',) / ('solver',) with the verdict as validity; one weight.")
    for f in r.functions:  # PROPEL's rewards gate on the env's verdict (configs/propel_swe.py)
        if f in GATED_BY and r[f].validity != ENV_REWARD:
            raise ConfigError(f"config.reward.{f}.validity is {r[f].validity!r}; with "
                              f"config.agent.env the validity check is the env's verdict: "
                              f"'{ENV_REWARD}'.")
    for field in ("max_turns", "max_tokens"):
        if int(a[field]) < 1:
            raise ConfigError(f"config.agent.{field} is {a[field]}; it must be at least 1.")
    if int(a.max_tokens) <= g.max_new_tokens:
        raise ConfigError(f"config.agent.max_tokens ({a.max_tokens}) must exceed "
                          f"config.grpo.max_new_tokens ({g.max_new_tokens}, one turn's budget).")
    if r.functions[0] in GATED_BY:
        from rossjax.train.propel import (
            rewards as propel_rewards,  # the probe's calibration, the SIL section
        )

        propel_rewards.check_config(r)
    spec = spec_of(cfg)
    spec.parser()  # a module:function style imports here
    spec.make_env()  # the name (or module:Class) and env_kwargs resolve here


def overlong_basis(cfg, sampled) -> tuple:
    """(lengths, max_len) of DAPO's soft overlong penalty: a completion's generated tokens
    against grpo.max_new_tokens, or an agentic trajectory's tokens (prompt, turns and
    observations: what fills the context) against its budget agent.max_tokens."""
    if not enabled(cfg):
        return sampled["gen"].lengths, int(cfg.grpo.max_new_tokens)
    return [len(r["token_ids"]) for r in sampled["records"]], int(cfg.agent.max_tokens)


def verdict_of(traj) -> tuple[float, dict]:
    """(reward, verdict dict) of a finished episode (module doc)."""
    name = f"agents.{traj.env.name}"
    v = traj.verdict
    if v is not None and v.passed is not None:
        passed, why = bool(v.passed), v.evidence
    elif v is None and traj.stop in ("max_turns", "context_budget"):
        passed, why = False, f"no answer before the episode stopped ({traj.stop})"
    else:
        passed = None
        why = (v.evidence if v is not None else traj.note or f"no verdict ({traj.stop})")
    reward = math.nan if passed is None else float(passed)
    return reward, {"name": name, "passed": passed, "evidence": str(why)[:300]}


def env_scores(kinds, records):
    """The CPU-scores channel's answer for agentic records: {"env": (reward, verdict)}."""
    return [{ENV_REWARD: (r["agent"]["reward"], r["agent"]["verdict"])} for r in records]


def _runs(mask) -> list:
    """[start, end) runs of True in a bool list."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append([start, i])
            start = None
    return out


def make_record(traj, *, run: str, step: int, style: str) -> dict:
    reward, verdict = verdict_of(traj)
    finish = "length" if traj.stop == "context_budget" or traj.truncated else "stop"
    rec = {"id": f"{run}-s{step}-{traj.task['id']}-g{traj.sample}",
           "task": rollout.task_for_record(traj.task),
           "source": {"run": run, "step": int(step), "sample": int(traj.sample),
                      "finish_reason": finish, "prompt_tokens": int(traj.n_prompt)},
           "messages": traj.messages,
           "token_ids": [int(t) for t in traj.ids],
           "logprobs": [float(x) for x, p in zip(traj.logprobs, traj.policy) if p],
           "agent": {"env": traj.env.name, "turns": traj.turns, "stop": str(traj.stop),
                     "style": style, "policy_spans": _runs(traj.policy),
                     "message_spans": traj.spans, "calls": traj.calls, "note": traj.note,
                     "reward": reward, "verdict": verdict}}
    if traj.tools:
        rec["tools"] = traj.tools
    if getattr(traj.verdict, "patch", None) is not None:  # the SWE bug (agents/swe_env.py)
        rec["patch"] = traj.verdict.patch
    return rec


def trajectory_batch(trajs, seq_len: int) -> dict:
    """numpy [B, S] update rows: `mask[r, p] = 1` where token p+1 was sampled (grpo_step's
    layout; the row is cut after its last sampled token) + the sampler's log-probs there."""
    b = len(trajs)
    out = {k: np.zeros((b, seq_len), np.int32) for k in grpo_step.BATCH_KEYS}
    out["sampler_logp"] = np.zeros((b, seq_len), np.float32)
    for r, t in enumerate(trajs):
        pol = np.asarray(t.policy, bool)
        n = int(np.flatnonzero(pol)[-1]) + 1 if pol.any() else len(t.ids)
        if n > seq_len:
            raise ValueError(f"agentic grpo: a {n}-token trajectory exceeds the batch length {seq_len}.")
        ids = np.asarray(t.ids[:n], np.int32)
        out["tokens"][r, :n] = ids
        out["positions"][r, :n] = np.arange(n)
        out["segment_ids"][r, :n] = 1
        out["targets"][r, :n - 1] = ids[1:]
        out["mask"][r, :n - 1] = pol[1:n]
        out["sampler_logp"][r, :n - 1] = np.asarray(t.logprobs[1:n], np.float32) * pol[1:n]
    return out


def generation(trajs, records) -> GenerationResult:
    """The policy tokens of each trajectory as a GenerationResult (what metrics, DAPO's filter
    and dynamic sampling read): lengths are sampled tokens per trajectory."""
    lens = np.asarray([t.policy_tokens for t in trajs], np.int32)
    width = max(1, int(lens.max(initial=1)))
    toks = np.zeros((len(trajs), width), np.int32)
    lps = np.zeros((len(trajs), width), np.float32)
    for r, t in enumerate(trajs):
        pol = np.asarray(t.policy, bool)
        toks[r, :lens[r]] = np.asarray(t.ids)[pol]
        lps[r, :lens[r]] = np.asarray(t.logprobs)[pol]
    return GenerationResult(toks, lps, lens, [rec["source"]["finish_reason"] for rec in records])


def sample(run, params, tasks, step: int, refill: int = 0) -> dict:
    """Run.sample for an agentic run: the batch dict grpo.GRPOTrainer consumes."""
    cfg, g = run.cfg, run.cfg.grpo
    spec = spec_of(cfg)
    t0 = time.perf_counter()
    trajs = agentic.rollouts(run.model_cfg, params, run.tok, tasks, spec, group=g.group_size,
                             temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
                             seed=cfg.train.seed * 100_003 + step + refill * 1_000_003,
                             template=cfg.template, partitioner=run.part,
                             envs=run.__dict__.setdefault("agent_envs", []))  # reused
    records = [make_record(t, run=cfg.run_name, step=step, style=spec.style) for t in trajs]
    batch = trajectory_batch(trajs, grpo_step.round_up(spec.max_tokens, 16))
    return {"tasks": tasks, "records": records, "batch": batch,
            "gen": generation(trajs, records), "sample_s": time.perf_counter() - t0}
