"""Agents: tool environments (env.py, builtin.py, corpus.py) and the handles episodes step
(env.LocalEnv, remote.RemoteEnv), tool-call parsing (parse.py), the one agent turn
(episode.py) and its HTTP driver over an OpenAI-compatible endpoint (rollout.py). CPU half:
never imports jax. See docs/agents.md."""

from rossjax.agents.env import (
    REGISTRY,
    EnvHandle,
    Environment,
    EnvSpec,
    LocalEnv,
    Observation,
    ToolCall,
    as_handle,
    make_env,
    timed_step,
)
from rossjax.agents.episode import Episode, Reply, StopReason, play

__all__ = ["REGISTRY", "EnvHandle", "EnvSpec", "Environment", "Episode", "LocalEnv",
           "Observation", "Reply", "StopReason", "ToolCall", "as_handle", "make_env", "play",
           "timed_step"]
