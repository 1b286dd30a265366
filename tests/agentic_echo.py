"""The echo environment and tool-call styles of tests/test_agentic_grpo.py, in a module of their
own that imports no jax: each episode's RemoteEnv worker process imports the env's module, and
the test module (jax, flax, rossjax.models) cost ~2 CPU s per worker, 16 workers per GRPO run.

A random tiny model never writes a tool call, so `two_calls` reads every reply as a call of
`echo` for the first two turns (then as an answer). `EchoEnv`'s verdict is the parity of the
final reply's bytes, so about half pass."""

import time
from dataclasses import dataclass, field

from rossjax.agents import Environment, Observation, ToolCall
from rossjax.verify.verdict import Verdict


def _schema(name):
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}


@dataclass
class EchoEnv(Environment):
    name: str = "echo"
    tools: list = field(default_factory=lambda: [_schema("echo")])
    delay_s: float = 0.0

    def reset(self, task):
        self.n = 0
        return [{"role": "user", "content": task["prompt"]}]

    def step(self, calls):
        time.sleep(self.delay_s)
        self.n += 1
        return [Observation(f"echo {self.n}: {c.arguments.get('text', '')[:6]!r}", c.id, c.name)
                for c in calls], False, None

    def finish(self, text):
        ok = sum(text.encode()) % 2 == 0
        return Verdict(ok, f"byte sum {'even' if ok else 'odd'}")


def two_calls(text, n0):
    """Every reply of the first two turns is a call of echo; later ones are answers."""
    return ([ToolCall("echo", {"text": text}, f"call_{n0}")], []) if n0 < 2 else ([], [])


def always_malformed(text, n0):
    return [], ["tool call 1: not JSON (Expecting value at character 0)"]
