"""Verdict type and the verifier registry (kept import-light: sandbox.py imports it too)."""

from __future__ import annotations

import importlib
from typing import Callable, NamedTuple


class Verdict(NamedTuple):
    """Outcome of a verifier: passed is True/False, or None when the check itself could not
    decide (unparseable gold answer, missing tests); evidence says why in one line."""

    passed: bool | None
    evidence: str


Verifier = Callable[[dict], Verdict]

# name -> "module:function" (loaded on first use, so `import rossjax.curate.verifiers` does not
# pull in sympy or reasoning-gym) or a callable registered at run time.
_REGISTRY: dict[str, str | Verifier] = {
    "math": "rossjax.curate.verifiers.math_verifier:verify",
    "code": "rossjax.curate.verifiers.code_verifier:verify",
    "induction": "rossjax.curate.verifiers.induction:verify",
}
_GYM_PREFIX = "gym:"


def register(name: str):
    """Decorator: `@register("mine") def verify(record) -> Verdict`."""

    def deco(fn: Verifier) -> Verifier:
        _REGISTRY[name] = fn
        return fn

    return deco


def get(name: str) -> Verifier:
    """The verifier called `name` ("math", "code", "induction", "gym:<dataset>", or registered)."""
    if name.startswith(_GYM_PREFIX) and name not in _REGISTRY:
        from rossjax.curate.verifiers.gym import make_verifier

        _REGISTRY[name] = make_verifier(name[len(_GYM_PREFIX):])
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"verifier {name!r} is not registered; known: {', '.join(names())}, gym:<dataset>")
    if isinstance(entry, str):
        module, func = entry.split(":")
        entry = getattr(importlib.import_module(module), func)
        _REGISTRY[name] = entry
    return entry


def names() -> list[str]:
    return sorted(_REGISTRY)
