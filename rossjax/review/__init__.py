"""LLM reviewer client and staged annotation: the stage that writes the `annotation` field.

    rossjax review --config=configs/review.py --workdir=DIR

asks a reviewer model behind an OpenAI-compatible chat-completions endpoint to annotate
verifier-positive rollouts (keep anchors for single-turn rows, exclude/protect quotes for agentic
ones), checks every annotation by compiling it with the curate code, and writes annotated
rollouts that `rossjax curate` reads. Like rossjax.curate it never imports jax.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ReviewerClient": "rossjax.review.client",
    "ReviewerError": "rossjax.review.client",
    "PROMPT_VERSION": "rossjax.review.prompt",
    "build_messages": "rossjax.review.prompt",
    "review_mode": "rossjax.review.prompt",
    "extract_json": "rossjax.review.answers",
    "review": "rossjax.review.annotate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rossjax.review' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
