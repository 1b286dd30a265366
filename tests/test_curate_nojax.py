"""The CPU half (rossjax.curate, verify, routes, tokenizers, templates, review, plus errors and
monitor) and every submodule import, and compile a rollout, with jax/flax unimportable."""

import os
import pkgutil
import subprocess
import sys

import rossjax.curate

SCRIPT = r"""
import importlib, importlib.abc, pkgutil, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "flax", "optax", "orbax"):
            raise ImportError(f"blocked import of {name}")
        return None

sys.meta_path.insert(0, Block())
import rossjax.curate as c
names = sys.argv[1:]
for n in names:
    importlib.import_module(n)
for attr in ("load_tokenizer", "compile_rollout", "CompiledExample", "iter_records"):
    getattr(c, attr)
tok = c.load_tokenizer("qwen")
ex = c.compile_rollout({"id": "a", "messages": [{"role": "user", "content": "hi"},
                                                {"role": "assistant", "content": "hello"}]}, tok)
assert ex.status == "kept", ex.reason
bad = [m for m in sys.modules if m.split(".")[0] in ("jax", "flax")]
assert not bad, bad
print("ok", len(names))
"""


PACKAGES = ("curate", "verify", "routes", "tokenizers", "templates", "review")


def test_curate_imports_without_jax():
    base = os.path.dirname(os.path.dirname(rossjax.curate.__file__))
    mods = ["rossjax.errors", "rossjax.monitor", "rossjax.resources"]
    for pkg in PACKAGES:
        mods.append(f"rossjax.{pkg}")
        mods += [m.name for m in pkgutil.walk_packages([os.path.join(base, pkg)],
                                                       prefix=f"rossjax.{pkg}.")
                 # *_boot modules are child-process entry scripts (they run on import), not
                 # library code.
                 if not m.name.endswith(("_boot", "__main__"))]
    for m in ("rossjax.curate.masks", "rossjax.curate.view", "rossjax.verify.pool",
              "rossjax.verify.rewards", "rossjax.routes.fingerprint", "rossjax.tokenizers.hf",
              "rossjax.templates.jinja", "rossjax.review"):
        assert m in mods, m
    out = subprocess.run([sys.executable, "-c", SCRIPT, *mods], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == f"ok {len(mods)}"
