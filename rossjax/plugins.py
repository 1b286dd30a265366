"""User code named in a config as `module:function` (a reward, verifier, solver, environment
class, agent style or GRPO loss piece): one loader, one error.

    fn = load_callable("mylosses:my_loss", "config.grpo.policy_loss")

The callable is imported once per process. A module that is not importable, or lacks the
name, or names something not callable, is a `ConfigError` (an InputError) naming the field.
A module found nowhere on sys.path is looked for in the working directory too, as `python -m`
would have it, so a file beside the config loads without setting PYTHONPATH.
"""

from __future__ import annotations

import importlib
import os
import sys

from rossjax.errors import ConfigError

_LOADED: dict = {}


def load_callable(spec: str, field: str = "config"):
    """The callable `spec` ("module:function") names, imported once per process; `field` is
    the config field that named it, for the one-sentence error."""
    if spec in _LOADED:
        return _LOADED[spec]
    mod_name, _, fn_name = str(spec).partition(":")
    if not mod_name or not fn_name:
        raise ConfigError(f"{field} {spec!r} is not module:function.")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        top = mod_name.split(".")[0]
        if (isinstance(e, ModuleNotFoundError) and e.name == top
                and os.getcwd() not in sys.path):
            sys.path.append(os.getcwd())  # the working directory, as `python -m` would have it
            return load_callable(spec, field)
        raise ConfigError(f"{field} {spec!r}: module {mod_name!r} cannot be imported ({e}); "
                          f"put its folder on PYTHONPATH.") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ConfigError(f"{field} {spec!r}: {mod_name} has no function {fn_name!r}.")
    _LOADED[spec] = fn
    return fn
