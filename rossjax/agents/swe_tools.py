"""What PROPEL's SWE generator works with besides the shell: its turn format (a THOUGHT, then
exactly one ```bash block) and `browse_index`, an index of the repository's code entities and
the tests that reach each one. No jax, no sandbox: plain parsing of the files' text.

    calls, errors = bash_block(text, n0)        # agent.style=rossjax.agents.swe_tools:bash_block
    rows = entity_index(files)                   # [Entity(path, name, kind, start, end, tests)]
    print(render_index(files, "gridops/"))       # what `browse_index [PATH]` answers

A turn with one ```bash block (```sh and ```shell too) is one `bash` call with the block's body;
a turn with no block is the episode's answer (the generator is done); a turn with two or more
blocks runs none of them and is told so (the format is one command a turn). The THOUGHT is
not checked: it is the policy's reasoning, kept in the record like any text.

An entity is a top-level function or class of a non-test .py file, or a method of such a class
(`Class.method`). A test reaches an entity when the test function's body (or its module's
top-level imports, for the name itself) names it: an identifier or attribute equal to the
entity's last name part. The count is a cheap static stand-in for coverage; `rossjax
swe-repos` ranks repositories by tests per entity from it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from rossjax.agents.bash import BashEnv, clip
from rossjax.agents.env import Observation, ToolCall
from rossjax.errors import InputError
from rossjax.verify import pysource
from rossjax.verify.repo import RepoError, read_tree

_BLOCK = re.compile(r"```(?:bash|sh|shell)[ \t]*\n(.*?)```", re.DOTALL)
BROWSE = "browse_index"


def bash_block(text: str, n0: int):
    """(calls, errors) of one generator turn in the THOUGHT + one ```bash block format."""
    blocks = [b.strip() for b in _BLOCK.findall(text or "")]
    if not blocks:
        return [], []
    if len(blocks) > 1:
        return [], [f"this turn holds {len(blocks)} ```bash blocks and none was run: write "
                    "exactly one block per turn (one command; chain with && if needed)"]
    if not blocks[0]:
        return [], ["the ```bash block is empty: put one command in it"]
    return [ToolCall("bash", {"command": blocks[0]}, f"call_{n0}")], []


@dataclass(frozen=True)
class Entity:
    path: str
    name: str          # "f" or "Class.method"
    kind: str          # "def" | "class" | "method"
    start: int
    end: int
    tests: tuple = field(default_factory=tuple)  # test ids that name it


def _is_test(rel: str) -> bool:
    from rossjax.verify.swe import is_test_path

    return is_test_path(rel)


def _entities(rel: str, text: str) -> list[Entity]:
    try:
        tree = pysource.parse(text)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(Entity(rel, node.name, "def", node.lineno, node.end_lineno or node.lineno))
        elif isinstance(node, ast.ClassDef):
            out.append(Entity(rel, node.name, "class", node.lineno,
                              node.end_lineno or node.lineno))
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append(Entity(rel, f"{node.name}.{sub.name}", "method", sub.lineno,
                                      sub.end_lineno or sub.lineno))
    return out


def _names(node) -> set[str]:
    got = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            got.add(n.id)
        elif isinstance(n, ast.Attribute):
            got.add(n.attr)
    return got


def _tests(rel: str, text: str) -> dict[str, set[str]]:
    """{test id: the names its body uses} of a test file (test_* functions and methods)."""
    try:
        tree = pysource.parse(text)
    except (SyntaxError, ValueError):
        return {}
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                "test"):
            out[f"{rel}::{node.name}"] = _names(node)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        sub.name.startswith("test"):
                    out[f"{rel}::{node.name}::{sub.name}"] = _names(sub)
    return out


def entity_index(files: dict[str, str]) -> list[Entity]:
    """Every entity of the repository's non-test .py files with the tests that name it."""
    tests = {}
    for rel, text in sorted(files.items()):
        if rel.endswith(".py") and _is_test(rel):
            tests.update(_tests(rel, text))
    out = []
    for rel, text in sorted(files.items()):
        if not rel.endswith(".py") or _is_test(rel):
            continue
        for e in _entities(rel, text):
            last = e.name.rsplit(".", 1)[-1]
            hit = tuple(sorted(t for t, names in tests.items() if last in names))
            out.append(Entity(e.path, e.name, e.kind, e.start, e.end, hit))
    return out


def count_tests(files: dict[str, str]) -> int:
    return sum(len(_tests(rel, t)) for rel, t in files.items()
               if rel.endswith(".py") and _is_test(rel))


def render_index(files: dict[str, str], prefix: str = "", max_chars: int = 6000) -> str:
    """`browse_index [PATH]`'s answer: per module, its entities with line ranges and the tests
    that name them (the first three by name), for paths under `prefix`."""
    rows = [e for e in entity_index(files) if e.path.startswith(prefix.lstrip("./"))]
    mods = sorted({e.path for e in rows})
    lines = [f"index of {len(mods)} module(s), {len(rows)} entities, {count_tests(files)} "
             f"tests" + (f" under {prefix}" if prefix else "")]
    for m in mods:
        lines.append(m)
        for e in (r for r in rows if r.path == m):
            names = ", ".join(t.rsplit("::", 1)[-1] for t in e.tests[:3])
            more = f", +{len(e.tests) - 3}" if len(e.tests) > 3 else ""
            lines.append(f"  {e.kind} {e.name}  lines {e.start}-{e.end}  tests {len(e.tests)}"
                         + (f" ({names}{more})" if e.tests else ""))
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[:max_chars] + "\n[index cut]"


def browse_args(command: str) -> str | None:
    """The PATH of a `browse_index [PATH]` command, "" for none; None for any other command."""
    parts = (command or "").strip().split()
    if not parts or parts[0] != BROWSE or len(parts) > 2:
        return None
    return parts[1] if len(parts) == 2 else ""


@dataclass
class IndexedBashEnv(BashEnv):
    """The `bash` env with `browse_index [PATH]` answered from the scratch copy's own files (in
    this process: the index reads text, runs nothing), every other command in the sandbox."""

    name: str = "bash"
    system: str = ("You are in a shell at the root of a repository. Each reply is a THOUGHT and "
                   "then one ```bash block, which runs (its exit code, stdout and stderr come "
                   "back); a reply without a block ends the episode.")

    def call(self, c: ToolCall, timeout_s: float) -> Observation:
        path = browse_args(c.arguments.get("command")) if c.name == "bash" else None
        if path is None:
            return super().call(c, timeout_s)
        try:
            files = read_tree(self.workdir)
        except (InputError, RepoError) as e:
            return Observation(f"exit code: 1\n[stderr]\nbrowse_index: {e}", c.id, c.name)
        return Observation(clip("exit code: 0\n[stdout]\n" + render_index(files, path),
                                self.max_output_chars), c.id, c.name)
