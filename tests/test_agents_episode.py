"""The one agent turn (rossjax/agents/episode.py) and the env handle contract (agents/env.py,
agents/remote.py), driven by scripted model calls: no endpoint, no model, no compile.

Each StopReason is reached through both drivers' paths: the HTTP driver (agents/rollout.py's
run_episode, over a scripted policy callable) and the engine's token driver
(train/rl/agentic.py's TokenTurns, fed scripted sampled tokens as the engine would hand them)."""

import json
import time
from dataclasses import dataclass, field

import pytest

from rossjax.agents import Environment, Observation
from rossjax.agents.env import EnvSpec, LocalEnv, as_handle, episode_over, step_overran
from rossjax.agents.episode import Episode, Reply, StopReason, play
from rossjax.agents.remote import RemoteEnv
from rossjax.agents.rollout import run_episode
from rossjax.verify.verdict import Verdict


def _schema(name):
    return {"type": "function", "function": {"name": name, "description": name,
                                             "parameters": {"type": "object"}}}


@dataclass
class CountEnv(Environment):
    """`tick` counts; the step that reaches `done_at` says done; the answer passes when it
    names the count; `delay_s` makes each step slow."""

    name: str = "count"
    tools: list = field(default_factory=lambda: [_schema("tick")])
    done_at: int = 0
    delay_s: float = 0.0

    def reset(self, task):
        self.n = 0
        return [{"role": "user", "content": task["prompt"]}]

    def step(self, calls):
        time.sleep(self.delay_s)
        self.n += len(calls)
        done = bool(self.done_at) and self.n >= self.done_at
        return ([Observation(f"n={self.n}", c.id, c.name) for c in calls], done,
                Verdict(True, "reached") if done else None)

    def finish(self, text):
        return Verdict(text.strip() == str(self.n), f"answered {text.strip()!r}")


TICK = '<tool_call>{"name": "tick", "arguments": {}}</tool_call>'
BAD = "<tool_call>{nope</tool_call>"
TASK = {"id": "t", "prompt": "count"}


class Script:
    """A policy callable for run_episode: answers `texts` in order, records what it was sent."""

    def __init__(self, *texts):
        self.texts, self.sent = list(texts), []

    def __call__(self, messages, tools):
        self.sent.append([dict(m) for m in messages])
        return {"content": self.texts.pop(0), "tool_calls": []}


def _http(env, *texts, **kw):
    return run_episode(env, TASK, Script(*texts), rid="r", **kw)


# -- the HTTP driver's path ----------------------------------------------------------------

def test_http_answered_after_a_malformed_call_and_a_step():
    row = _http(CountEnv(), BAD, TICK, "1")
    assert row["agent"]["stop"] == StopReason.ANSWERED == "answered" and row["agent"]["turns"] == 3
    tools = [m["content"] for m in row["messages"] if m["role"] == "tool"]
    assert tools[0].startswith("error: malformed tool call: tool call 1: not JSON")
    assert tools[1] == "n=1" and row["verifier"]["passed"] is True and row["reward"] == 1.0


def test_http_done_max_turns_and_context_budget():
    row = _http(CountEnv(done_at=2), TICK, TICK, TICK)
    assert row["agent"]["stop"] == "done" and row["agent"]["turns"] == 2
    assert row["verifier"] == {"name": "agents.count", "passed": True, "evidence": "reached"}
    row = _http(CountEnv(), TICK, TICK, TICK, max_turns=2)
    assert row["agent"]["stop"] == "max_turns" and row["agent"]["turns"] == 2
    assert row["verifier"]["passed"] is None and "no verdict (max_turns)" in row["verifier"]["evidence"]
    row = _http(CountEnv(), TICK, TICK, max_chars=len("count") + len(TICK) + 2)
    assert row["agent"]["stop"] == "context_budget" and row["agent"]["turns"] == 1


def test_http_step_over_its_limit_ends_done_failed():
    env = CountEnv(delay_s=1.0, step_timeout_s=0.1)
    row = _http(env, TICK)
    assert row["agent"]["stop"] == "done"
    assert row["messages"][-1]["content"].startswith("error: tool step took longer than")
    assert row["verifier"]["passed"] is False and "step over its" in row["verifier"]["evidence"]


def test_play_with_an_injected_model_call_and_a_user_parser_that_raises():
    def broken(text, n0):
        raise RuntimeError("no")

    ep = Episode(env=as_handle(CountEnv()), messages=[{"role": "user", "content": "q"}],
                 max_turns=2, parse=broken, deadline=time.monotonic() + 30)
    assert play(ep, lambda e: Reply("anything")) == StopReason.MAX_TURNS
    assert ep.messages[2]["content"].startswith("error: malformed tool call: the tool-call "
                                                "parser raised RuntimeError: no")
    # structured calls from an endpoint are read as such, ids kept
    env = as_handle(CountEnv(done_at=1))
    ep = Episode(env=env, messages=env.reset(TASK), deadline=time.monotonic() + 30)
    tc = [{"id": "x9", "function": {"name": "tick", "arguments": "{}"}}]
    assert play(ep, lambda e: Reply("", tc)) == StopReason.DONE
    assert ep.messages[-1]["tool_call_id"] == "x9" and ep.verdict.passed is True
    assert play(Episode(env=as_handle(CountEnv()), messages=[], max_turns=0),
                lambda e: pytest.fail("no turn")) == StopReason.MAX_TURNS


# -- the engine's token driver (host half; scripted tokens, no engine) ----------------------

@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from rossjax.tokenizers import load_tokenizer
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    return load_tokenizer(write_ascii_tokenizer(str(tmp_path_factory.mktemp("tok"))))


def _engine_turns(tok, **kw):
    from rossjax.train.rl import agentic

    spec = agentic.AgentSpec(**{"max_turns": 3, "max_tokens": 400, "max_new_tokens": 64,
                                "tools_in_prompt": False, **kw})
    return agentic, agentic.TokenTurns(spec, tok, "chatml")


def _traj(agentic, turns, tok, env):
    handle = LocalEnv(env)
    opening = handle.reset(TASK)
    t = turns.start(TASK, 0, handle, opening, [],
                    tok.encode(agentic.prompt_text(opening, "chatml", tok, [])))
    t.deadline = time.monotonic() + 30
    return t


def _drive(turns, tok, t, texts, room=lambda n: 10_000):
    """What train.agentic._drive does with each finished turn, with scripted sampled text."""
    for text in texts:
        toks = tok.encode(text) + [tok.eos_id]
        nxt = turns.observe(t, turns.after_turn(t, toks, [-0.5] * len(toks), "stop"), room)
        if nxt is None:
            return t.stop
    return None


def test_engine_answered_after_a_malformed_call_and_a_step(tok):
    agentic, turns = _engine_turns(tok)
    t = _traj(agentic, turns, tok, CountEnv())
    assert _drive(turns, tok, t, [BAD, TICK, "1"]) == StopReason.ANSWERED and t.turns == 3
    tools = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert tools[0].startswith("error: malformed tool call: tool call 1: not JSON")
    assert tools[1] == "n=1" and t.verdict.passed is True
    # a call not in the template's canonical form is stored raw, its parsed calls beside it
    assert t.messages[3] == {"role": "assistant", "content": TICK}
    assert t.calls["3"][0]["function"]["name"] == "tick"
    assert t.policy_tokens == sum(len(tok.encode(x)) + 1 for x in (BAD, TICK, "1"))
    turns.close_record(t)
    full = agentic.render(t.messages, "chatml", tok, []).text
    assert tok.decode_bytes(t.ids).decode() == full.removesuffix("\n")  # as single-turn rows end


def test_engine_done_max_turns_and_context_budget(tok):
    agentic, turns = _engine_turns(tok)
    t = _traj(agentic, turns, tok, CountEnv(done_at=2))
    assert _drive(turns, tok, t, [TICK, TICK, TICK]) == StopReason.DONE and t.turns == 2
    t = _traj(agentic, turns, tok, CountEnv())
    assert _drive(turns, tok, t, [TICK] * 4) == StopReason.MAX_TURNS and t.turns == 3
    t = _traj(agentic, turns, tok, CountEnv())  # the cache columns run out
    assert _drive(turns, tok, t, [TICK, TICK], room=lambda n: 0) == StopReason.CONTEXT_BUDGET
    agentic, turns = _engine_turns(tok, max_tokens=80)  # the trajectory's token budget
    t = _traj(agentic, turns, tok, CountEnv())
    assert _drive(turns, tok, t, [TICK, TICK]) == StopReason.CONTEXT_BUDGET and t.turns == 1


def test_engine_step_over_its_limit_ends_done_failed(tok):
    agentic, turns = _engine_turns(tok)
    t = _traj(agentic, turns, tok, CountEnv(delay_s=1.0, step_timeout_s=0.1))
    assert _drive(turns, tok, t, [TICK]) == StopReason.DONE and t.timed_out
    assert t.messages[-1]["content"].startswith("error: tool step took longer than")
    assert t.verdict.passed is False


def test_engine_token_faults_end_the_episode_failed(tok):
    agentic, turns = _engine_turns(tok)
    t = _traj(agentic, turns, tok, CountEnv())
    assert turns.after_turn(t, [tok.vocab_size + 3], [-1.0], "length") is None
    assert t.stop == StopReason.UNKNOWN_TOKEN and t.verdict.passed is False and t.turns == 1

    class Latin1:  # a tokenizer whose sampled bytes are not UTF-8
        def __getattr__(self, k):
            return getattr(tok, k)

        def decode_bytes(self, ids):
            return b"\xff" if list(ids) == [65] else tok.decode_bytes(ids)

    turns.tok = Latin1()
    t = _traj(agentic, turns, tok, CountEnv())
    assert turns.after_turn(t, [65], [-1.0], "length") is None
    assert t.stop == StopReason.INVALID_UTF8 and "turn 1 is not UTF-8" in t.note
    turns.tok = tok
    t = _traj(agentic, turns, tok, CountEnv())
    assert turns.delta(t, "another history") is None and t.stop == StopReason.TEMPLATE_MISMATCH


# -- one env handle contract ---------------------------------------------------------------

def test_local_and_remote_handles_end_a_spent_episode_alike():
    from rossjax.agents import ToolCall
    from rossjax.train.rl.agentic import AgentSpec

    calls = [ToolCall("tick", {}, "c0")]
    spec = AgentSpec(env="test_agents_episode:CountEnv", episode_timeout_s=7.0, max_turns=9)
    local = LocalEnv(spec.make_env())
    remote = RemoteEnv(spec.env_spec())  # a spent deadline answers before the worker starts
    assert local.step(calls, 0.0) == remote.step(calls, 0.0) == episode_over(calls, 7.0)
    obs, done, verdict = episode_over(calls, 7.0)
    assert obs[0].tool_call_id == "c0" and done and verdict == Verdict(
        False, "episode over its 7 s limit")
    assert step_overran("x", calls, 0.5, "; why")[2].evidence == "x step over its 0.5 s limit; why"
    # the env part of the agent spec lives in agents/: handles compare by it alone
    assert isinstance(spec, EnvSpec) and spec.env_spec() == EnvSpec(
        env="test_agents_episode:CountEnv", episode_timeout_s=7.0)
    assert AgentSpec(env=spec.env, episode_timeout_s=7.0, max_turns=1).env_spec() == spec.env_spec()
    assert json.loads(json.dumps({"stop": StopReason.DONE})) == {"stop": "done"}
