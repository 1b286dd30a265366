"""The verifier registry, `verify_one` (the Verdict type is in verdict.py) and the user's own
verifier function (`rossjax curate --config.verify_fn=module:function`).

A verify function has GRPO's `reward.fn` signature, `(prompt, completion, task)` (prompt: the
last user message's text, completion: the last assistant message's text, task: the record's task
dict), so one function serves both; it returns a bool (passed), None (cannot decide), a Verdict,
a `(passed, evidence)` pair, or a number, which passes at >= `threshold` (config.verify_threshold,
like GRPO's reward.success_threshold). Its module is found on PYTHONPATH or in the working
directory; an exception inside it is an undecided verdict naming the error (never a lost row).
"""

from __future__ import annotations

import importlib
import math
import numbers

from rossjax.errors import InputError
from rossjax.plugins import load_callable
from rossjax.verify.verdict import Verdict, Verifier

# name -> "module:function" (loaded on first use, so `import rossjax.verify` does not
# pull in sympy or reasoning-gym) or a callable registered at run time.
_REGISTRY: dict[str, str | Verifier] = {
    "math": "rossjax.verify.math_verifier:verify",
    "code": "rossjax.verify.code_verifier:verify",
    "induction": "rossjax.verify.induction:verify",
    "swe": "rossjax.verify.swe:verify",
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


def load_fn(spec: str, field: str = "config.verify_fn"):
    """The callable `spec` ("module:function") names: rossjax.plugins.load_callable (imported
    once per process; one ConfigError sentence when it cannot be found)."""
    return load_callable(spec, field)


def _prompt_completion(record: dict) -> tuple[str, str]:
    from rossjax.verify.answers import last_assistant_content

    msgs = [m for m in record.get("messages") or [] if isinstance(m, dict)]
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=len(msgs))
    prompt = next((m.get("content") or "" for m in reversed(msgs[:last])
                   if m.get("role") == "user"), "")
    return prompt, last_assistant_content(record) or ""


def as_verdict(out, spec: str, threshold: float) -> Verdict:
    """A verify function's return value as a Verdict (see the module doc)."""
    if isinstance(out, Verdict):
        return out
    if out is None:
        return Verdict(None, f"{spec} returned None (cannot decide)")
    if isinstance(out, bool):
        return Verdict(out, f"{spec} returned {out}")
    if isinstance(out, numbers.Real):
        x = float(out)
        if math.isnan(x):
            return Verdict(None, f"{spec} returned NaN (cannot decide)")
        ok = x >= threshold
        return Verdict(ok, f"{spec} scored {x:g} {'>=' if ok else '<'} threshold {threshold:g}")
    if isinstance(out, tuple) and len(out) == 2 and (out[0] is None or isinstance(out[0], bool)):
        return Verdict(out[0], str(out[1])[:300])
    return Verdict(None, f"{spec} returned a {type(out).__name__}; return True/False/None, a "
                         f"number, a Verdict or (passed, evidence)")


def verify_with_fn(record: dict, spec: str, threshold: float = 0.5) -> Verdict:
    """The user's verify function on one record; never raises (an error is undecided)."""
    try:
        prompt, completion = _prompt_completion(record)
        return as_verdict(load_fn(spec)(prompt, completion, record.get("task") or {}), spec,
                          float(threshold))
    except Exception as e:  # noqa: BLE001 - one row's crash must not end the run
        return Verdict(None, f"{spec} error: {type(e).__name__}: {e}"[:300])


def verify_fn_job(args) -> Verdict:
    """For a WorkerPool: `verify_with_fn(record, spec, threshold)` (picklable, module-level)."""
    return verify_with_fn(*args)
