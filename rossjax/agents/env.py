"""The environment interface an agent rollout talks to, and the registry that names them.

    env = make_env("calculator")          # or "my_pkg.envs:MyEnv" for a user's own class
    messages = env.reset(task)            # the opening chat messages (system/user)
    obs, done, verdict = env.step(calls)  # tool results for the policy's tool calls

An environment runs on the CPU worker pool (it never imports jax). `step` is bounded by the
per-step limit (`step_timeout_s`) and the episode by `episode_timeout_s`: `timed_step` runs each
step in a worker thread and turns an overrun into a tool observation and a failed verdict, never
a hang of the rollout loop. Built-in environments that run code bound it themselves with the
sandbox's own kernel-enforced timeout; the thread deadline is the backstop for a user's class.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import time
from dataclasses import dataclass, field

from rossjax.errors import InputError
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


_POOL = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="rossjax-env")


def timed_step(env: Environment, calls: list[ToolCall], deadline: float):
    """`env.step(calls)` within min(step limit, what is left of the episode); an overrun or a
    raise becomes observations and, for an overrun, done with a failed verdict."""
    left = min(float(env.step_timeout_s), deadline - time.monotonic())
    ids = [c.id for c in calls] or [""]
    if left <= 0:
        return ([Observation("error: episode time limit reached", ids[0])], True,
                Verdict(False, f"episode over its {env.episode_timeout_s:g} s limit"))
    fut = _POOL.submit(env.step, calls)
    try:
        return fut.result(timeout=left)
    except cf.TimeoutError:
        # the thread cannot be killed; the env must bound its own work (the sandbox does)
        return ([Observation(f"error: tool step took longer than {left:.3g} s", ids[0])], True,
                Verdict(False, f"{env.name} step over its {left:.3g} s limit"))
    except Exception as e:  # a broken tool is the policy's observation, the episode ends
        return ([Observation(f"error: {type(e).__name__}: {e}"[:500], ids[0])], True,
                Verdict(None, f"{env.name} step raised {type(e).__name__}: {e}"[:300]))


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
