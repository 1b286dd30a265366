"""Named implementations of one kind (policy loss, advantage estimator, KL estimator, loss
aggregation), chosen by a config field instead of if/elif over a tuple of strings.

A config value is a registered name ("gspo") or `module:function` (rossjax.plugins, the loader
and the error of every such field): the callable is imported once, checked, and registered under
that spec, so `--config.grpo.policy_loss=mylosses:my_loss` runs a user's loss without editing
rossjax. In Python, `POLICY_LOSS_REGISTRY.register("name")` as a decorator does the same. Each
registry is named for its kind (KL_REGISTRY, ADVANTAGE_REGISTRY, POLICY_LOSS_REGISTRY,
AGGREGATION_REGISTRY); grpo_losses' tuples of the same kinds hold the built-in names.
"""

from __future__ import annotations

from collections.abc import Callable

from rossjax.errors import ConfigError
from rossjax.plugins import load_callable


class Registry:
    """name -> implementation for one `kind`; `field` is the config field that picks it."""

    def __init__(self, kind: str, field: str, check: Callable | None = None):
        self.kind, self.field = kind, field
        self._check = check   # check(obj) -> error sentence or None, for user implementations
        self._items: dict[str, object] = {}

    def register(self, name: str, obj=None):
        """Register `obj` as `name` (or, without obj, return a decorator that does)."""
        if obj is None:
            return lambda o: self.register(name, o)
        if name in self._items and self._items[name] is not obj:
            raise ConfigError(f"{self.kind} {name!r} is registered already; pick another name.")
        self._items[name] = obj
        return obj

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def __contains__(self, name) -> bool:
        return name in self._items

    def get(self, name: str):
        """The implementation `name` picks; `module:function` is imported (and registered)."""
        if name in self._items:
            return self._items[name]
        if isinstance(name, str) and ":" in name:
            obj = load_callable(name, field=self.field)
            why = self._check(obj) if self._check else None
            if why:
                raise ConfigError(f"{self.field} {name!r}: {why}")
            return self.register(name, obj)
        builtin = [n for n in self._items if ":" not in n]  # not the user specs loaded so far
        raise ConfigError(f"{self.field} {name!r} is not one of {', '.join(builtin)} "
                          f"(or a module:function of your own).")
