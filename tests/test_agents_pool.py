"""Agent environments on CPU worker processes: agentic rollouts step each episode's env in its own
worker (rossjax.agents.remote.RemoteEnv over rossjax.verify.pool.Worker); a hung step is
killed and fails only its episode, a worker that dies fails only its episode.

This module's top level must stay jax-free: the workers import it to build PoolEnv."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field

import pytest

from rossjax.agents import Environment, Observation, ToolCall
from rossjax.verify.pool import Worker, WorkerError
from rossjax.verify.verdict import Verdict


@dataclass
class PoolEnv(Environment):
    """Behaves by task id: ok answers, hang sleeps in its step, die exits its process, raise
    raises; every step reports the process it ran in; close() is logged to `log`."""

    name: str = "pool"
    tools: list = field(default_factory=list)
    log: str = ""

    def reset(self, task):
        self.task = task["id"].split("-")[0]
        return [{"role": "user", "content": task["prompt"]}]

    def step(self, calls):
        if self.task == "hang":
            time.sleep(3600)
        if self.task == "die":
            os._exit(3)
        if self.task == "raise":
            raise ValueError("the tool broke")
        where = f"pid {os.getpid()} jax {'jax' in sys.modules}"
        return [Observation(where, c.id, c.name) for c in calls], False, None

    def finish(self, text):
        return Verdict(True, "answered")

    def close(self):
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{self.task} {os.getpid()}\n")


def one_call(text, n0):
    """The first turn calls the tool; later turns answer."""
    return ([ToolCall("probe", {}, f"call_{n0}")], []) if n0 < 1 else ([], [])


def _spec(agentic, log="", **kw):
    base = dict(env="test_agents_pool:PoolEnv", style="test_agents_pool:one_call", max_turns=3,
                max_tokens=256, max_new_tokens=4, tools_in_prompt=False,
                env_kwargs=json.dumps({"log": log}))
    return agentic.AgentSpec(**{**base, **kw})


def _alive(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_env_lives_and_steps_in_a_jax_free_worker(tmp_path):
    from rossjax.agents.remote import RemoteEnv
    from rossjax.train.rl import agentic

    log = tmp_path / "close.log"
    env = RemoteEnv(_spec(agentic, str(log)))
    assert env.reset({"id": "ok", "prompt": "p"}) == [{"role": "user", "content": "p"}]
    assert env.name == "pool" and env.pid != os.getpid()
    obs, done, verdict = env.step([ToolCall("probe", {}, "c0")], time.monotonic() + 30)
    assert obs[0].content == f"pid {env.pid} jax False" and obs[0].tool_call_id == "c0"
    assert (done, verdict) == (False, None)
    env.close()
    assert log.read_text() == f"ok {env.pid}\n"
    # the env's own raise is the policy's observation; the worker lives on
    env.reset({"id": "raise", "prompt": "p"})
    obs, done, verdict = env.step([ToolCall("probe", {}, "c1")], time.monotonic() + 30)
    assert obs[0].content == "error: ValueError: the tool broke" and done
    assert verdict.passed is None and "raised ValueError" in verdict.evidence
    assert not env.lost and _alive(env.pid)
    env.shutdown()
    # a factory that raises: one sentence, and the worker is spent
    w = Worker(int, ("not a number",))
    with pytest.raises(WorkerError, match="ValueError: invalid literal"):
        w.info(60)
    assert w.dead.startswith("building the worker's object raised ValueError")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import jax

    from rossjax import models
    from rossjax.tokenizers import load_tokenizer
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    tok = load_tokenizer(write_ascii_tokenizer(str(tmp_path_factory.mktemp("tok"))))
    cfg = models.get_preset("tiny_qwen2", vocab_size=tok.vocab_size)
    return cfg, models.init_params(cfg, jax.random.PRNGKey(0)), tok


def test_hung_and_dying_steps_fail_only_their_episodes(tiny, tmp_path):
    from rossjax.train.rl import agentic, agentic_grpo

    cfg, params, tok = tiny
    log = tmp_path / "close.log"
    spec = _spec(agentic, str(log), step_timeout_s=1.0)
    tasks = [{"id": k, "prompt": "Go."} for k in ("ok", "hang", "die")]
    envs = []
    t0 = time.monotonic()
    trajs = agentic.rollouts(cfg, params, tok, tasks, spec, group=2, temperature=1.0, seed=0,
                             envs=envs)
    assert time.monotonic() - t0 < 120  # the hung step (3600 s) did not hang the rollout
    ok, hang, die = trajs[0:2], trajs[2:4], trajs[4:6]
    pids = [t.env.pid for t in trajs]
    assert len(set(pids)) == 6 and os.getpid() not in pids  # one worker per live episode
    for t in ok:
        assert t.stop == "answered" and not t.timed_out
        assert t.messages[2] == {"role": "tool", "content": f"pid {t.env.pid} jax False",
                                 "tool_call_id": "call_0", "name": "probe"}
        assert agentic_grpo.verdict_of(t)[0] == 1.0
    for t in hang:
        assert t.stop == "done" and t.timed_out and t.turns == 1
        assert t.messages[-1]["content"].startswith("error: tool step took longer than")
        reward, verdict = agentic_grpo.verdict_of(t)
        assert reward == 0.0 and "limit; its worker was killed" in verdict["evidence"]
    for t in die:
        assert t.stop == "done" and not t.timed_out and t.turns == 1
        assert t.messages[-1]["content"] == "error: the environment's process died"
        reward, verdict = agentic_grpo.verdict_of(t)
        assert reward == 0.0 and "exited with code 3 during step" in verdict["evidence"]
    for t in hang + die:
        assert not _alive(t.env.pid)  # killed / gone, not left running
    # the healthy workers are kept for the next step; the lost ones are replaced
    assert [e is t.env for e, t in zip(envs, trajs)] == [True, True, False, False, False, False]
    assert all(_alive(p) for p in pids[:2])
    # close() ran at episode end for the episodes whose worker still held the env
    assert sorted(log.read_text().split("\n")[:-1]) == sorted(f"ok {p}" for p in pids[:2])
    for e in envs:
        e.shutdown()
    assert not any(_alive(p) for p in pids[:2])
