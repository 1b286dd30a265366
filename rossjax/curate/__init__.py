"""CPU curation half of rossjax: records, tokenizers, chat rendering, token masks, verifiers.

Never imports jax or flax (tests enforce it), so it runs on plain CPU workers. The public names
are resolved lazily so `import rossjax.curate` stays cheap for worker processes.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "load_tokenizer": "rossjax.tokenizers",
    "Tokenizer": "rossjax.tokenizers",
    "iter_records": "rossjax.curate.schema",
    "validate_record": "rossjax.curate.schema",
    "Row": "rossjax.curate.schema",
    "render_chat": "rossjax.templates",
    "compile_rollout": "rossjax.curate.masks",
    "CompiledExample": "rossjax.curate.masks",
    "fingerprint": "rossjax.routes.fingerprint",
    "select": "rossjax.routes.selection",
    "read_compiled": "rossjax.curate.compiled",
    "make_loader": "rossjax.curate.packing",
    "verify_many": "rossjax.verify",
}
_SUBPACKAGES = ("compiled", "ledger", "pipeline", "packing")

__all__ = sorted([*_EXPORTS, *_SUBPACKAGES])


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"rossjax.curate.{name}")
    else:
        raise AttributeError(f"module 'rossjax.curate' has no attribute {name!r}")
    globals()[name] = value
    return value
