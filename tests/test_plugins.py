"""rossjax.plugins.load_callable: the one loader of a config's `module:function`, one error."""

from __future__ import annotations

import re
import sys

import pytest

from rossjax.errors import ConfigError
from rossjax.plugins import load_callable
from rossjax.train.registry import Registry
from rossjax.verify.base import load_fn
from rossjax.verify.rewards import load_custom


def test_every_module_function_field_loads_through_one_loader_with_one_error(tmp_path,
                                                                              monkeypatch):
    (tmp_path / "plug_mod_x.py").write_text("def f(): return 7\nnot_fn = 3\n")
    monkeypatch.chdir(tmp_path)  # found in the working directory, as `python -m` finds it
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert load_callable("plug_mod_x:f", "config.x")() == 7
    assert load_fn("plug_mod_x:f") is load_custom("plug_mod_x:f") is load_callable("plug_mod_x:f")
    for spec, why in (("nocolon", "is not module:function"),
                      ("plug_mod_x:not_fn", "plug_mod_x has no function 'not_fn'"),
                      ("no_such_mod_qq:f", "module .no_such_mod_qq. cannot be imported")):
        loads = [load_callable, load_fn, load_custom]
        if ":" in spec:  # a registry reads a name without a colon as one of its own
            loads.append(lambda s, field: Registry("thing", field).get(s))
        for load in loads:
            with pytest.raises(ConfigError, match=re.escape(f"config.y {spec!r}") + ":? " + why):
                load(spec, field="config.y")
