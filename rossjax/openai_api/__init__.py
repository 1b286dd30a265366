"""The OpenAI-compatible client every CPU-half room that asks a model speaks through: review
(the reviewer), reconstruct (its model), train/solvers (endpoint solvers) and agents
(OpenAIPolicy). `client` holds ChatClient (retries, cache, scrubbed credentials) and
`transport` one POST under one deadline and a byte cap. Like the rest of the CPU half it never
imports jax.
"""

from rossjax.openai_api.client import REASK, ChatClient, ChatError, Reply, parse_extra_body

__all__ = ["REASK", "ChatClient", "ChatError", "Reply", "parse_extra_body"]
