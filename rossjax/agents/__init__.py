"""Agents: tool environments (env.py, builtin.py, corpus.py), tool-call parsing (parse.py) and
the multi-turn rollout loop over an OpenAI-compatible endpoint (rollout.py). CPU half: never
imports jax. See docs/agents.md."""

from rossjax.agents.env import REGISTRY, Environment, Observation, ToolCall, make_env, timed_step

__all__ = ["REGISTRY", "Environment", "Observation", "ToolCall", "make_env", "timed_step"]
