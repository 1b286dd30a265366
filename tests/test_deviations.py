"""Every row of docs/deviations.md names code that exists, so a row cannot outlive what it
describes: each row names at least one path or symbol that resolves, every repository path it
names exists, and every `rossjax.x.y` name it gives resolves to a module or a name defined in one.
Names are resolved in the source text (no imports: the check stays fast and jax-free)."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "deviations.md")
# repository paths a row may name (a trailing `:variant`, `{a,b}` or glob is not part of the path)
PATH = re.compile(r"(?<![\w/.])((?:rossjax|configs|tests|data|docs|launch)/[\w./-]*\w)")
DOTTED = re.compile(r"\brossjax(?:\.\w+)+")
TICKED = re.compile(r"`([^`]+)`")
IDENT = re.compile(r"[A-Za-z_]\w*")


def rows() -> list[tuple[str, str]]:
    """(section, row text) of every table row below a table header."""
    out, section = [], ""
    for line in open(DOC, encoding="utf-8"):
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("| ") and not line.startswith(("| element", "| ---")):
            out.append((section, line.strip()))
    return out


def _source_files() -> list[str]:
    files = []
    for top in ("rossjax", "configs"):
        for d, _, names in os.walk(os.path.join(ROOT, top)):
            files += [os.path.join(d, n) for n in names if n.endswith(".py")]
    return files


_SOURCE = None


def source_text() -> str:
    global _SOURCE
    if _SOURCE is None:
        _SOURCE = "\n".join(open(f, encoding="utf-8").read() for f in _source_files())
    return _SOURCE


def path_exists(p: str) -> bool:
    p = p.rstrip(".")
    return os.path.exists(os.path.join(ROOT, p)) or os.path.exists(os.path.join(ROOT, p + ".py"))


def dotted_resolves(name: str) -> bool:
    """rossjax.a.b(.c): the longest module prefix is a file or package, and what follows it is
    defined there (def, class, assignment or import)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        base = os.path.join(ROOT, *parts[:k])
        mod = base + ".py" if os.path.isfile(base + ".py") else os.path.join(base, "__init__.py")
        if os.path.isfile(mod):
            rest = parts[k:]
            if not rest:
                return True
            text = open(mod, encoding="utf-8").read()
            return bool(re.search(rf"(?m)^\s*(?:def |class |async def )?{rest[0]}\b|"
                                  rf"import .*\b{rest[0]}\b", text))
    return False


def field_resolves(token: str) -> bool:
    """A backticked config field or code name (`grpo.is_low`, `default_clusters`): its last
    identifier is assigned, defined or used as a key somewhere in rossjax/ or configs/."""
    idents = IDENT.findall(token.split("=")[0].split("(")[0])
    if not idents:
        return False
    leaf = idents[-1]
    if len(leaf) < 3:
        return False
    return re.search(rf"\b{re.escape(leaf)}\b", source_text()) is not None


def check_row(text: str) -> list[str]:
    """Problems of one row: stale paths or names, or nothing that resolves."""
    problems, found = [], 0
    for p in PATH.findall(text):
        if "{" in p or "*" in p:
            continue
        if path_exists(p):
            found += 1
        else:
            problems.append(f"path {p} does not exist")
    for d in DOTTED.findall(text):
        if dotted_resolves(d):
            found += 1
        else:
            problems.append(f"{d} does not resolve")
    if not found:
        found += any(field_resolves(t) for t in TICKED.findall(text))
    if not found:
        problems.append("names no path or symbol that resolves")
    return problems


def test_every_deviation_row_names_code_that_exists():
    bad = []
    for section, text in rows():
        for p in check_row(text):
            bad.append(f"[{section}] {text[:70]}...: {p}")
    assert len(rows()) > 40
    assert not bad, "\n".join(bad)


def test_the_check_catches_a_stale_row():
    assert check_row("| x | y | `rossjax/review/no_such.py` | z |") == [
        "path rossjax/review/no_such.py does not exist", "names no path or symbol that resolves"]
    assert check_row("| x | y | `rossjax.review.checks.no_such_name` | z |")[0].endswith(
        "does not resolve")
    assert check_row("| x | y | plain words only | z |") == [
        "names no path or symbol that resolves"]
    assert check_row("| x | y | `rossjax.review.checks.check_audit` | z |") == []
    assert check_row("| x | y | `grpo.is_low` | z |") == []
