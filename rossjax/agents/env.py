"""The environment interface an agent rollout talks to, the handle episodes step, and the
registry that names them.

    env = make_env("calculator")          # or "my_pkg.envs:MyEnv" for a user's own class
    messages = env.reset(task)            # the opening chat messages (system/user)
    obs, done, verdict = env.step(calls)  # tool results for the policy's tool calls

An `Environment` is what a user writes. An episode (agents/episode.py) talks to an `EnvHandle`:
`step(calls, deadline)` and `finish(text, deadline)` never raise or hang. `LocalEnv` is the
handle of an in-process env, `remote.RemoteEnv` of one in its own worker process (built from
an `EnvSpec`); both end an overrun, a raise or a broken answer with the same observations and
verdicts (`failed_step`, `episode_over`, `step_overran`, `step_raised`).

An environment runs on the CPU worker pool (it never imports jax). `step` is bounded by the
per-step limit (`step_timeout_s`) and the episode by `episode_timeout_s`: `timed_step` runs each
step in a worker thread and turns an overrun into a tool observation and a failed verdict, never
a hang of the rollout loop. Built-in environments that run code bound it themselves with the
sandbox's own kernel-enforced timeout; the thread deadline is the backstop for a user's class.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import json
import time
from dataclasses import dataclass, field
from typing import Protocol

from rossjax.errors import ConfigError, InputError
from rossjax.verify.base import load_fn
from rossjax.verify.verdict import Verdict


@dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str = ""

    def to_message(self) -> dict:
        """The OpenAI-style entry of an assistant message's `tool_calls`."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Observation:
    content: str
    tool_call_id: str = ""
    name: str = ""

    def to_message(self) -> dict:
        m = {"role": "tool", "content": self.content}
        if self.tool_call_id:
            m["tool_call_id"] = self.tool_call_id
        if self.name:
            m["name"] = self.name
        return m


@dataclass
class Environment:
    """Base class. Subclasses set `name`, `tools` (OpenAI function schemas) and implement
    `reset` and `step`; `verdict` is None until the episode is judged."""

    step_timeout_s: float = 10.0
    episode_timeout_s: float = 120.0
    name: str = "environment"
    tools: list = field(default_factory=list)

    def reset(self, task: dict) -> list[dict]:
        raise NotImplementedError

    def step(self, tool_calls: list[ToolCall]) -> tuple[list[Observation], bool, Verdict | None]:
        raise NotImplementedError

    def finish(self, final_text: str) -> Verdict | None:
        """The verdict when the policy answers without a tool call (default: none)."""
        return None


StepResult = tuple  # (list[Observation], done: bool, Verdict | None)


def step_limit(step_timeout_s: float, deadline: float) -> float:
    """Seconds this step may take: the step limit, or what is left of the episode."""
    return min(float(step_timeout_s), deadline - time.monotonic())


def failed_step(calls, observation: str, evidence: str, passed: bool | None = False):
    """A step that ends the episode: one observation (to the first call) and the verdict."""
    cid = calls[0].id if calls else ""
    return [Observation(observation[:500], cid)], True, Verdict(passed, evidence[:300])


def episode_over(calls, episode_timeout_s: float):
    return failed_step(calls, "error: episode time limit reached",
                       f"episode over its {episode_timeout_s:g} s limit")


def step_overran(name: str, calls, left: float, also: str = ""):
    return failed_step(calls, f"error: tool step took longer than {left:.3g} s",
                       f"{name} step over its {left:.3g} s limit{also}")


def step_raised(name: str, calls, error: str):
    """A broken tool: the policy's observation, the episode ends undecided."""
    return failed_step(calls, f"error: {error}", f"{name} step raised {error}", None)


_POOL = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="rossjax-env")


def timed_step(env: Environment, calls: list[ToolCall], deadline: float):
    """`env.step(calls)` within min(step limit, what is left of the episode); an overrun or a
    raise becomes observations and, for an overrun, done with a failed verdict."""
    left = step_limit(env.step_timeout_s, deadline)
    if left <= 0:
        return episode_over(calls, env.episode_timeout_s)
    fut = _POOL.submit(env.step, calls)
    try:
        return fut.result(timeout=left)
    except cf.TimeoutError:
        # the thread cannot be killed; the env must bound its own work (the sandbox does)
        return step_overran(env.name, calls, left)
    except Exception as e:  # a broken tool is the policy's observation, the episode ends
        return step_raised(env.name, calls, f"{type(e).__name__}: {e}")


class EnvHandle(Protocol):
    """What an episode steps: an env in process (LocalEnv) or in a worker (RemoteEnv).
    `step` and `finish` take the episode's deadline (time.monotonic()) and never raise."""

    name: str
    tools: list
    step_timeout_s: float
    episode_timeout_s: float

    def reset(self, task: dict) -> list[dict]: ...
    def step(self, calls: list[ToolCall], deadline: float) -> StepResult: ...
    def finish(self, text: str, deadline: float) -> Verdict | None: ...
    def close(self) -> None: ...


class LocalEnv:
    """The handle of an in-process Environment: steps run under timed_step's thread deadline."""

    def __init__(self, env: Environment):
        self.env = env

    name = property(lambda self: self.env.name)
    tools = property(lambda self: self.env.tools)
    step_timeout_s = property(lambda self: self.env.step_timeout_s)
    episode_timeout_s = property(lambda self: self.env.episode_timeout_s)

    def reset(self, task: dict) -> list[dict]:
        return self.env.reset(task)

    def step(self, calls, deadline: float):
        return timed_step(self.env, calls, deadline)

    def finish(self, text: str, deadline: float):
        return self.env.finish(text)  # in process: the env bounds its own judging

    def close(self):
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


def as_handle(env) -> EnvHandle:
    """An Environment wrapped in LocalEnv; a handle (RemoteEnv, LocalEnv) as it is."""
    return LocalEnv(env) if isinstance(env, Environment) else env


@dataclass(frozen=True)
class EnvSpec:
    """What builds an environment anywhere (in process or in a worker): the registry name or
    module:Class, its keyword arguments as a JSON object, and its limits."""

    env: str = "calculator"
    env_kwargs: str = "{}"          # JSON object of keyword arguments for the env class
    step_timeout_s: float = 10.0
    episode_timeout_s: float = 120.0

    def kwargs(self) -> dict:
        try:
            kw = json.loads(self.env_kwargs or "{}")
        except json.JSONDecodeError as e:
            raise ConfigError(f"config.agent.env_kwargs is not JSON ({e.msg}).") from None
        if not isinstance(kw, dict):
            raise ConfigError("config.agent.env_kwargs must be a JSON object.")
        return kw

    def make_env(self) -> Environment:
        return make_env(self.env, step_timeout_s=self.step_timeout_s,
                        episode_timeout_s=self.episode_timeout_s, **self.kwargs())


REGISTRY: dict[str, str] = {
    "python": "rossjax.agents.builtin:PythonEnv",
    "calculator": "rossjax.agents.builtin:CalculatorEnv",
    "corpus": "rossjax.agents.corpus:CorpusEnv",
    "bash": "rossjax.agents.bash:BashEnv",
    "vault": "rossjax.agents.vault:VaultEnv",
}


def make_env(spec: str, **kwargs) -> Environment:
    """A registered name or a user's `module:Class` (loaded as GRPO's reward.fn is)."""
    target = REGISTRY.get(spec, spec)
    if ":" not in target:
        raise InputError(f"environment {spec!r} is neither one of {', '.join(sorted(REGISTRY))} "
                         "nor module:Class.")
    if target in REGISTRY.values():
        mod, _, cls_name = target.partition(":")
        cls = getattr(importlib.import_module(mod), cls_name)
    else:
        cls = load_fn(target, "environment")  # a class is callable
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise InputError(f"environment {spec!r} is not a subclass of "
                         "rossjax.agents.Environment.")
    return cls(**kwargs)
