"""docs/deviations.md, cell by cell. tests/test_deviations.py checks that each row names a path or
`rossjax.x.y` name that resolves; this file is stricter about everything else a row names, so a
renamed field, variant or function cannot leave a row describing code that is gone:

- the tables parse: every row has as many cells as its header, none of them empty;
- every backticked name in a row resolves (`resolve` says how, kind by kind), except in the
  paper's and peers' columns, which use their names:
  a config field or code name (`grpo.is_low`, `default_clusters`) occurs in rossjax/ or
  configs/, each dotted part of it too; a module-qualified name (`math_task.topic`,
  `verify.pool.Worker`, `rossjax.agents.swe_env:SweBugEnv`) is defined in that module; the
  value a field is set to (`method = "lexical"`) occurs in the source; a config variant
  (`:runlocal`, `configs/mixture.py:public_baseline`) is defined by a config; a file
  (`reconstruct/cues.py`) exists; `rossjax CMD ...` names a registered command; any other
  backticked text (a marker such as `<tool_call>`) occurs verbatim in the source.

The source is read as text, no rossjax import: the check is fast and jax-free.
"""

from __future__ import annotations

import functools
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "deviations.md")
RUN = re.compile(r"(?<!\\)\|")  # a cell boundary (\| is a pipe inside a cell)
CHAIN = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
WORD = re.compile(r"[A-Za-z_]\w*")


def cells(line: str) -> list[str]:
    return [c.strip() for c in RUN.split(line.strip())[1:-1]]


def rows() -> list[tuple[str, int, list[str], list[str]]]:
    """(section, line number, header cells, cells) of every body row of every table."""
    out, section, header = [], "", None
    for n, line in enumerate(open(DOC, encoding="utf-8"), start=1):
        if line.startswith("## "):
            section, header = line[3:].strip(), None
        elif not line.startswith("|"):
            header = None  # a table ends at the first line that is not a row
        elif header is None:
            header = cells(line)
        elif not all(re.fullmatch(r":?-+:?", c) for c in cells(line)):
            out.append((section, n, header, cells(line)))
    return out


def ticked(cell: str) -> list[str]:
    """The backticked texts of a cell; a ```lang fence word is text, not a code span."""
    return re.findall(r"`([^`]+)`", re.sub(r"`{3,}(\w*)", r"\1", cell))


# -- the source, read once ------------------------------------------------------------------

@functools.cache
def sources() -> dict[str, str]:
    """Repository-relative path -> text of every .py file under rossjax/ and configs/."""
    out = {}
    for top in ("rossjax", "configs"):
        for d, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if name.endswith(".py"):
                    p = os.path.join(d, name)
                    out[os.path.relpath(p, ROOT)] = open(p, encoding="utf-8").read()
    return out


@functools.cache
def all_text() -> str:
    return "\n".join(sources().values())


@functools.cache
def words() -> frozenset[str]:
    return frozenset(WORD.findall(all_text()))


@functools.cache
def config_sections() -> frozenset[str]:
    """Top-level config fields (`grpo`, `reward`, `leak`, ...): the first part of a field path
    (`config.x` names the root itself)."""
    text = "\n".join(t for p, t in sources().items()
                     if p.startswith(("configs/", "rossjax/configs/")))
    return frozenset(re.findall(r"\bc\.(\w+)\s*=", text)) | frozenset(
        re.findall(r"^\s*(\w+)=ml_collections\.ConfigDict", text, re.M)) | {"config"}


@functools.cache
def commands() -> frozenset[str]:
    text = sources()["rossjax/cli/__init__.py"]
    block = text[text.index("COMMANDS = {"):]
    return frozenset(re.findall(r'^\s*"([\w-]+)":', block[:block.index("}")], re.M))


def module_file(parts: list[str]) -> str | None:
    """The one source file that `parts` (a.b -> .../a/b.py or .../a/b/__init__.py) names."""
    tail = "/".join(parts)
    hits = [p for p in sources() if p.endswith((f"/{tail}.py", f"/{tail}/__init__.py"))
            or p in (f"{tail}.py", f"{tail}/__init__.py")]
    return hits[0] if len(hits) == 1 else None


def defined(name: str, text: str) -> bool:
    """`name` is defined in a module's text: def, class, assignment, import, a method or a
    dict key / keyword of that name."""
    n = re.escape(name)
    return re.search(rf"(?m)^\s*(?:async def |def |class )?{n}\b\s*[:=(]|"
                     rf"^\s*(?:async def |def |class ){n}\b|import .*\b{n}\b|"
                     rf"[\"']{n}[\"']\s*:|\b{n}=", text) is not None


def file_named(p: str) -> str | None:
    """A repository path, or the one file whose path ends with `p` (`reconstruct/cues.py`)."""
    if os.path.exists(os.path.join(ROOT, p)):
        return p
    hits = [s for s in sources() if s.endswith("/" + p)]
    return hits[0] if len(hits) == 1 else None


def variant_defined(name: str, text: str) -> bool:
    """A config variant (`runlocal`, `public_baseline`): a quoted string or a function of the
    config's text."""
    return re.search(rf"[\"']{re.escape(name)}[\"']|def {re.escape(name)}\b", text) is not None


def value_ok(value: str) -> str | None:
    """The value a field is set to: numbers, booleans, None and empty strings need nothing;
    a name or quoted name must occur in the source."""
    for v in re.findall(r"[\"']([^\"']*)[\"']|([A-Za-z_][\w:]*)", value):
        v = v[0] or v[1]
        v = v.split(":")[0]  # signal:NAME -> signal
        if not v or v in ("True", "False", "None", "NAME") or not WORD.fullmatch(v):
            continue
        if v not in words():
            return f"value {v!r} occurs nowhere in rossjax/ or configs/"
    return None


def resolve(token: str) -> str | None:
    """None when the backticked `token` names something that exists, else why not."""
    t = token.strip()
    if t.startswith("rossjax "):  # a command line
        cmd, *rest = t.split()[1:]
        if cmd not in commands():
            return f"rossjax {cmd} is not a registered command"
        for arg in rest:
            if arg.startswith(":"):
                why = resolve(arg)
            elif arg.startswith("--config."):
                why = resolve(arg[len("--config."):])
            else:
                why = None
            if why:
                return why
        return None
    if t.startswith(":"):  # :runlocal, :runlocal,math
        configs = "\n".join(s for p, s in sources().items() if p.startswith("configs/"))
        bad = [v for v in t[1:].split(",") if not variant_defined(v, configs)]
        return f"variant {', '.join(bad)} is defined by no config" if bad else None
    m = re.fullmatch(r"([\w./-]+\.py)(?::([\w,]+))?", t)
    if m:  # a file, maybe with its variants or a function of it
        p = file_named(m.group(1))
        if p is None:
            return f"no file {m.group(1)}"
        text = open(os.path.join(ROOT, p), encoding="utf-8").read()
        bad = [v for v in (m.group(2) or "").split(",") if v and not variant_defined(v, text)]
        return f"{p} defines no {', '.join(bad)}" if bad else None
    m = re.fullmatch(r"(rossjax(?:\.\w+)+):(\w+)", t)
    if m:  # module:function
        p = module_file(m.group(1).split(".")[1:])
        if p is None or not defined(m.group(2), sources()[p]):
            return f"{m.group(1)} defines no {m.group(2)}"
        return None
    m = CHAIN.match(t)
    if m is None or (m.end() < len(t) and t[m.end()] not in " =:([*"):
        # not a name: a marker or a literal the code writes (`<tool_call>`, `#### answer`)
        if not re.search(r"[A-Za-z]", t) or t in all_text():
            return None
        return f"{t!r} occurs nowhere in rossjax/ or configs/"
    parts, rest = m.group(0).split("."), t[m.end():].strip()
    if parts[0] == "rossjax":
        for k in range(len(parts) - 1, 0, -1):
            p = module_file(parts[1:k + 1])
            if p is not None:
                missing = [x for x in parts[k + 1:] if not defined(x, sources()[p])]
                if missing:
                    return f"{p} defines no {missing[0]}"
                break
        else:
            return f"{'.'.join(parts)} names no module"
    elif len(parts) > 1 and parts[0] not in config_sections():
        # module-qualified (`math_task.topic`, `verify.pool.Worker`), else a class attribute
        # (`Engine.extend`) or a record field (`verifier.passed`): every part occurs
        # (`compiled.memory_analysis`: the expression as the code writes it will do)
        for k in range(len(parts) - 1, 0, -1):
            p = module_file(parts[:k])
            if p is not None:
                if not defined(parts[k], sources()[p]) and m.group(0) not in all_text():
                    return f"{p} defines no {parts[k]}"
                break
    missing = [x for x in parts if x not in words()]
    if rest.startswith("*"):  # clip_frac_*: a prefix
        missing = [x for x in missing if not re.search(rf"\b{x}", all_text())]
    if missing:
        return f"{missing[0]} (of `{t}`) occurs nowhere in rossjax/ or configs/"
    if rest[:1] in ("=", ":") and not rest.startswith("::"):
        return value_ok(rest[1:])
    if rest.startswith("("):  # a call: its keyword values
        return value_ok(" ".join(re.findall(r"=\s*([\"']?[\w:]+[\"']?)", rest)))
    return None


# columns in another project's words (the paper's, a peer's): their names need not be rossjax's
FOREIGN = ("paper", "peers")


def own_cells(header: list[str], row: list[str]) -> list[str]:
    return [c for h, c in zip(header, row) if h not in FOREIGN]


def test_every_table_row_has_its_header_cells_none_empty():
    bad = [f"line {n} [{section}]: {len(c)} cells, header has {len(h)}" if len(c) != len(h)
           else f"line {n} [{section}]: cell {c.index('') + 1} is empty"
           for section, n, h, c in rows() if len(c) != len(h) or "" in c]
    assert len(rows()) > 100
    assert not bad, "\n".join(bad)


def test_every_name_a_row_gives_resolves():
    bad = []
    for section, n, header, c in rows():
        for token in (t for cell in own_cells(header, c) for t in ticked(cell)):
            why = resolve(token)
            if why:
                bad.append(f"line {n} [{section}] `{token}`: {why}")
    assert not bad, "\n".join(bad)


def test_the_check_catches_stale_names():
    assert resolve("grpo.is_low") is None and resolve("grpo.no_such_field_x")
    assert resolve("grpo.kl = \"k3_unbiased\"") is None
    assert "value 'k9_nonexistent'" in resolve('grpo.kl = "k9_nonexistent"')
    assert resolve("math_task.topic") is None
    assert "defines no topik" in resolve("math_task.topik")
    assert resolve("rossjax.agents.swe_env:SweBugEnv") is None
    assert resolve("rossjax.agents.swe_env:NoSuchEnv")
    assert resolve("rossjax.verify.swe.may_change") is None
    assert resolve("rossjax.verify.swe.may_not_change")
    assert resolve("configs/mixture.py:public_baseline") is None
    assert "defines no private_baseline" in resolve("configs/mixture.py:private_baseline")
    assert resolve(":runlocal") is None and resolve(":walkremote")
    assert resolve("reconstruct/cues.py") is None and resolve("reconstruct/clues.py")
    assert resolve("rossjax extract --config.kind=grad_sketch") is None
    assert "not a registered command" in resolve("rossjax distil")
    assert resolve("<tool_call>") is None and resolve("<tool_cal>")
    assert cells(r"| a | b \| c | d |") == ["a", r"b \| c", "d"]
