"""The verifier registry and `verify_one` (the Verdict type is in verdict.py)."""

from __future__ import annotations

import importlib

from rossjax.errors import InputError
from rossjax.verify.verdict import Verdict, Verifier

# name -> "module:function" (loaded on first use, so `import rossjax.verify` does not
# pull in sympy or reasoning-gym) or a callable registered at run time.
_REGISTRY: dict[str, str | Verifier] = {
    "math": "rossjax.verify.math_verifier:verify",
    "code": "rossjax.verify.code_verifier:verify",
    "induction": "rossjax.verify.induction:verify",
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
        from rossjax.verify.gym import make_verifier

        _REGISTRY[name] = make_verifier(name[len(_GYM_PREFIX):])
    entry = _REGISTRY.get(name)
    if entry is None:
        raise InputError(f"verifier {name!r} is not registered; known: {', '.join(names())}, gym:<dataset>")
    if isinstance(entry, str):
        module, func = entry.split(":")
        entry = getattr(importlib.import_module(module), func)
        _REGISTRY[name] = entry
    return entry


def names() -> list[str]:
    return sorted(_REGISTRY)


def verifier_name(record: dict, default: str | None = None) -> str | None:
    """The record's `verifier.name`, else `task.domain` when that names a verifier, else default."""
    name = (record.get("verifier") or {}).get("name")
    if name:
        return name
    domain = (record.get("task") or {}).get("domain")
    return domain if domain in names() else default


def verify_one(record: dict, name: str | None = None) -> Verdict:
    """Never raises: an unknown verifier or a crash inside one is an undecided verdict."""
    name = name or verifier_name(record)
    if not name:
        return Verdict(None, "the record names no verifier (verifier.name or task.domain)")
    try:
        return get(name)(record)
    except Exception as e:
        return Verdict(None, f"verifier {name} error: {type(e).__name__}: {e}"[:300])
