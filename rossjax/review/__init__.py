"""LLM reviewer client and staged annotation: the stage that writes the `annotation` field.

    rossjax review --config=configs/review.py --workdir=DIR

asks a reviewer model behind an OpenAI-compatible chat-completions endpoint to annotate the
rollouts curate will train on: single-turn rows by proposal, deterministic checks, audit and
repair; agentic rows by semantic discovery over step groups, then boundary localization per
finding (docs/review.md). Every annotation is compiled with curate's own compiler before it is
kept. Like rossjax.curate it never imports jax.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ReviewerClient": "rossjax.review.client",
    "ReviewerError": "rossjax.review.client",
    "Reply": "rossjax.review.client",
    "PROMPT_VERSION": "rossjax.review.prompts",
    "review_mode": "rossjax.review.render",
    "extract_json": "rossjax.review.answers",
    "run": "rossjax.review.run",
    "read_transcript": "rossjax.review.transcripts",
    "format_transcript": "rossjax.review.transcripts",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rossjax.review' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
