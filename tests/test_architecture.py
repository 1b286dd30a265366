"""The layering of rossjax, read from its source: no import cycle between modules or between the
top-level packages, and no library module importing the CLI (docs/architecture.md).

The graph holds every `import` / `from ... import` statement with ast, function-level ones
included (a lazy import still ties two modules together); imports under `if TYPE_CHECKING:` are
left out because they never run. A package's `__init__` is the package's own node.
"""

from __future__ import annotations

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parent.parent / "rossjax"
SKIP = {"configs", "data"}  # rossjax/configs, rossjax/data link to configs/, data/: package data


def module_files() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent)
        if SKIP & set(rel.parts[1:-1]) or "__pycache__" in rel.parts:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:` (type-only imports never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, modules) -> str | None:
    """The longest prefix of `name` that is a rossjax module (None outside rossjax)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(module: str, path: pathlib.Path, modules) -> set[str]:
    """The rossjax modules `module` imports. `from pkg import name` points at pkg.name when that
    is a module, else at pkg."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {_resolve(a.name, modules) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: strip `level` parts from this module's package
                here = module.split(".") if is_pkg else module.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([base] if base else []))
            for a in node.names:
                out.add(_resolve(f"{base}.{a.name}", modules) or _resolve(base, modules))
    out.discard(None)
    out.discard(module)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def unit(module: str) -> str:
    """The top-level room a module belongs to: rossjax.curate.masks -> rossjax.curate. Entry
    points (`python -m rossjax`, `python -m rossjax.bench`) belong to the CLI."""
    if module.split(".")[-1] == "__main__":
        return "rossjax.cli"
    return ".".join(module.split(".")[:2])


def package_graph(graph) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(unit(m), set()).update(unit(d) for d in deps if unit(d) != unit(m))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index, low, on, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _describe(graph, comps) -> str:
    lines = []
    for comp in comps:
        edges = [f"{a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp]
        lines.append(f"cycle {comp}: " + "; ".join(edges))
    return "\n".join(lines)


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    """The checker itself: a lazy import inside a function and a relative import are edges, a
    TYPE_CHECKING import is not, and a two-module loop is found."""
    src = {
        "p/__init__.py": "",
        "p/a.py": "def f():\n    from p import b\n",
        "p/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.c\n"
                  "from .a import f\n",
        "p/c.py": "import p.b\n",
    }
    for rel, text in src.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    modules = {"p": 0, "p.a": 0, "p.b": 0, "p.c": 0}
    graph = {m: imports_of(m, tmp_path / (m.replace(".", "/") + (".py" if m != "p" else
                                                                   "/__init__.py")), modules)
             for m in modules}
    assert graph == {"p": set(), "p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.b"}}
    assert cycles(graph) == [["p.a", "p.b"]]


def test_graph_covers_the_package():
    graph = import_graph()
    assert {"rossjax.cli", "rossjax.cli.flags", "rossjax.errors", "rossjax.curate"} <= set(graph)
    assert "rossjax.cli.flags" in graph["rossjax.cli"]


def test_no_import_cycle_between_modules():
    graph = import_graph()
    comps = cycles(graph)
    assert not comps, "\n" + _describe(graph, comps)


def test_no_import_cycle_between_packages():
    graph = package_graph(import_graph())
    comps = cycles(graph)
    assert not comps, "\n" + _describe(graph, comps)


def test_no_library_module_imports_the_cli():
    """The CLI sits on top: commands import the library, never the reverse. Entry points
    (`__main__` modules) are part of the CLI."""
    graph = import_graph()
    bad = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                 if unit(d) == "rossjax.cli" and unit(m) != "rossjax.cli")
    assert not bad, "library modules import the CLI:\n" + "\n".join(bad)


# The layer table of docs/architecture.md: a room may import rooms of its own layer or below,
# never above. Layers 1-3 are the CPU half (no jax), 4-8 the device half, then the applications
# and the CLI on top. A new top-level package or module needs a row here (and in the doc).
LAYERS = {
    "rossjax": 0, "rossjax.errors": 0, "rossjax.monitor": 0, "rossjax.resources": 0,
    "rossjax.hostheap": 0,
    "rossjax.defaults": 0, "rossjax.runlock": 0, "rossjax.checksums": 0, "rossjax.plugins": 0,
    "rossjax.tokenizers": 1, "rossjax.templates": 1, "rossjax.verify": 1, "rossjax.openai_api": 1,
    "rossjax.routes": 2, "rossjax.curate": 2,
    "rossjax.review": 3, "rossjax.agents": 3, "rossjax.reconstruct": 3,
    "rossjax.sharding": 4,
    "rossjax.models": 5,
    "rossjax.sample": 6, "rossjax.engine": 6,
    "rossjax.probes": 7,
    "rossjax.train": 8,
    "rossjax.bench": 9, "rossjax.demo": 9, "rossjax.repro": 9, "rossjax.serve": 9,
    "rossjax.plan": 9,
    "rossjax.cli": 10,
}


def test_every_room_has_a_layer():
    missing = sorted({unit(m) for m in import_graph()} - set(LAYERS))
    assert not missing, f"add {missing} to LAYERS here and to docs/architecture.md"


def test_imports_point_down_the_layer_table():
    graph = import_graph()
    bad = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                 if LAYERS.get(unit(m), 99) < LAYERS.get(unit(d), -1))
    assert not bad, "imports up the layer table (docs/architecture.md):\n" + "\n".join(bad)


DEVICE_LIBS = {"jax", "jaxlib", "flax", "optax", "orbax"}


def test_the_cpu_half_never_names_jax():
    """Layers 0-3 (the CPU half) run on workers without an accelerator: no import statement of
    theirs, at any depth, names jax or a library built on it (test_curate_nojax.py checks the
    same at run time for curate)."""
    bad = []
    for m, path in module_files().items():
        if LAYERS.get(unit(m), 99) > 3:
            continue
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            bad += [f"{m}: import {n}" for n in names if n.split(".")[0] in DEVICE_LIBS]
    assert not bad, "\n".join(bad)


def test_errors_import_nothing_from_rossjax():
    """rossjax.errors is the bottom layer every room may raise from."""
    assert import_graph()["rossjax.errors"] == set()



def test_the_doc_lists_every_command():
    """docs/architecture.md's command table has a row per command the dispatcher knows."""
    from rossjax.cli import COMMANDS

    doc = (PKG.parent / "docs" / "architecture.md").read_text()
    missing = sorted(c for c in COMMANDS if f"| `{c}` |" not in doc)
    assert not missing, f"add {missing} to the command table of docs/architecture.md"


def _train_room(m: str) -> str | None:
    parts = m.split(".")
    if parts[:2] != ["rossjax", "train"]:
        return None
    return parts[2] if len(parts) > 3 and parts[2] in TRAIN_ROOMS else "core"


# train/ is split by what it trains (docs/architecture.md): the core (state, losses, optim,
# checkpoint, ...) imports no folder of its own; sft/ and export/ never reach RL; rl/ and propel/
# meet where PROPEL's rewards plug into GRPO and its commands reuse GRPO's CPU rollout side.
TRAIN_ROOMS = {"sft": {"core", "export"}, "export": {"core"}, "rl": {"core", "propel"},
               "propel": {"core", "rl"}}
# The one exception: rossjax.train.losses is the public face of every loss (`losses.grpo_loss`).
TRAIN_FACADES = {("rossjax.train.losses", "rl")}


def test_train_rooms_import_down():
    graph = import_graph()
    bad = []
    for m, deps in graph.items():
        room = _train_room(m)
        for d in deps:
            to = _train_room(d)
            if room is None or to is None or to == room or (m, to) in TRAIN_FACADES:
                continue
            if to not in TRAIN_ROOMS.get(room, set()):
                bad.append(f"{m} ({room}) -> {d} ({to})")
    assert not bad, "train/ rooms import across (docs/architecture.md):\n" + "\n".join(bad)
