"""PROPEL's repository filter for the SWE setting (`rossjax swe-repos --candidates=FOLDER`): every
subfolder of FOLDER is a candidate repository, and four stages in order keep or drop it, each
drop with its reason:

  1. exclusions  no sandbox run: a tree rossjax cannot copy (a link, a binary or special file),
                 a name in `exclude`, no importable package, no test file, third-party
                 dependencies (pyproject's [project] dependencies or a requirements*.txt: the
                 suite runs on the stdlib and pytest alone), over `max_files` / `max_kb`;
  2. preflight   the clean suite runs green in the sandbox (verify.swe.baseline: collected,
                 finished within `suite_timeout_s`, every test PASSED);
  3. ranking     tests per entity (agents/swe_tools.entity_index: tests / functions, classes
                 and methods of the non-test code): under `min_tests_per_entity` is dropped,
                 the rest ranked best first and cut to `max_repos` (0: no cut);
  4. yield       a programmatic bug-writing stand-in (NOT the generator): up to `yield_trials`
                 seeded single-token mutations of the source (a comparison, an arithmetic
                 operator, a constant), each judged by verify.swe.verify_bug; a repository
                 where under `min_yield` of them make a valid bug is dropped (its tests do not
                 catch plain mistakes).

    report = filter_repos("candidates/", cfg.repos)   # {"stages": [...], "selected": [...], ...}
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib

from rossjax.agents.swe_tools import count_tests, entity_index
from rossjax.errors import InputError
from rossjax.verify.repo import RepoError, read_tree, unified_diff

STAGES = ("exclusions", "preflight", "ranking", "yield")
# single-token mutations the yield stand-in tries (the pattern, its replacement)
_MUTATIONS = ((r"<=", "<"), (r"(?<![<>=!])<(?![<=])", "<="), (r">=", ">"),
              (r"(?<![<>=!-])>(?![>=])", ">="), (r"==", "!="), (r"!=", "=="),
              (r"(?<=\s)\+(?=\s)", "-"), (r"(?<=\s)-(?=\s)", "+"), (r"\b1\b", "2"),
              (r"\b0\b", "1"), (r"\band\b", "or"), (r"\bor\b", "and"))


def _dependencies(files: dict) -> list[str]:
    deps = []
    if "pyproject.toml" in files:
        try:
            proj = tomllib.loads(files["pyproject.toml"]).get("project") or {}
        except tomllib.TOMLDecodeError as e:
            raise InputError(f"pyproject.toml does not parse ({e})") from None
        deps += [str(d) for d in proj.get("dependencies") or []]
    for rel, text in files.items():
        if re.fullmatch(r"requirements[\w.-]*\.txt", rel):
            deps += [ln.strip() for ln in text.splitlines()
                     if ln.strip() and not ln.strip().startswith("#")]
    return deps


def exclusion(name: str, path: str, files: dict | None, why_unreadable: str, r) -> str | None:
    """Stage 1's reason to drop a candidate, or None."""
    from rossjax.verify.swe import is_test_path, package_modules

    if files is None:
        return f"the tree cannot be copied: {why_unreadable}"
    if name in tuple(r.exclude):
        return "listed in config.repos.exclude"
    if not package_modules(files):
        return "no importable package (no non-test .py module at its top level)"
    if not any(is_test_path(p) and p.endswith(".py") for p in files):
        return "no test file (tests/*.py, test_*.py)"
    try:
        deps = _dependencies(files)
    except InputError as e:
        return str(e)
    if deps:
        return (f"needs third-party packages ({', '.join(deps[:3])}); the suite runs on the "
                "stdlib and pytest only")
    if len(files) > r.max_files:
        return f"{len(files)} files, over max_files {r.max_files}"
    kb = sum(len(t.encode()) for t in files.values()) / 1024
    if kb > r.max_kb:
        return f"{kb:.0f} KB of text, over max_kb {r.max_kb}"
    return None


def mutations(files: dict, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Up to `n` (description, patch) single-token mutations of the non-test code, drawn in a
    seeded order over every place a mutation applies (one per source line at most)."""
    from rossjax.verify.swe import may_change

    sites = []
    for rel in sorted(p for p in files if may_change(p)):
        for ln, line in enumerate(files[rel].splitlines(keepends=True)):
            code = line.split("#", 1)[0]
            if not code.strip() or code.lstrip().startswith(("def ", "class ", "import ",
                                                              "from ", '"""', "'")):
                continue
            for pat, rep in _MUTATIONS:
                m = re.search(pat, code)
                if m:
                    sites.append((rel, ln, m.start(), m.end(), rep))
                    break
    sites.sort(key=lambda s: hashlib.sha256(f"{seed}:{s[0]}:{s[1]}".encode()).hexdigest())
    out = []
    for rel, ln, a, b, rep in sites[:n]:
        lines = files[rel].splitlines(keepends=True)
        lines[ln] = lines[ln][:a] + rep + lines[ln][b:]
        after = dict(files)
        after[rel] = "".join(lines)
        out.append((f"{rel}:{ln + 1} {files[rel].splitlines()[ln][a:b]!r} -> {rep!r}",
                    unified_diff(files, after)))
    return out


def filter_repos(folder: str, r) -> dict:
    """The four stages over every subfolder of `folder` (module doc): the report."""
    from rossjax.verify.swe import baseline, verify_bug

    if not os.path.isdir(folder):
        raise InputError(f"--candidates={folder}: not a directory")
    names = sorted(n for n in os.listdir(folder)
                   if os.path.isdir(os.path.join(folder, n)) and not n.startswith("."))
    if not names:
        raise InputError(f"--candidates={folder}: holds no candidate repository folder")
    info = {n: {"path": os.path.realpath(os.path.join(folder, n))} for n in names}
    stages, alive = [], list(names)

    def stage(name, judge):
        nonlocal alive
        dropped, kept = {}, []
        for n in alive:
            why = judge(n)
            if why:
                dropped[n] = why
                info[n].update(dropped_at=name, reason=why)
            else:
                kept.append(n)
        stages.append({"stage": name, "in": len(alive), "kept": kept, "dropped": dropped})
        alive = kept

    trees, bases = {}, {}

    def excl(n):
        try:
            trees[n], why = read_tree(info[n]["path"]), ""
        except (InputError, RepoError, OSError, UnicodeDecodeError) as e:
            trees[n], why = None, str(e).split(": ", 1)[-1]
        return exclusion(n, info[n]["path"], trees[n], why, r)

    def preflight(n):
        try:
            bases[n] = baseline(info[n]["path"], timeout_s=r.suite_timeout_s)
        except InputError as e:
            return str(e).split(": ", 1)[-1]
        info[n]["tests"] = len(bases[n].tests)
        return None

    stage("exclusions", excl)
    stage("preflight", preflight)

    def per_entity(n):
        ents = entity_index(trees[n])
        tests = count_tests(trees[n])
        tpe = tests / len(ents) if ents else 0.0
        info[n].update(entities=len(ents), tests_per_entity=round(tpe, 3),
                       entities_tested=sum(bool(e.tests) for e in ents))
        if not ents:
            return "no function, class or method in its non-test code"
        if tpe < r.min_tests_per_entity:
            return (f"{tpe:.2f} tests per entity ({tests} tests / {len(ents)} entities), under "
                    f"min_tests_per_entity {r.min_tests_per_entity:g}")
        return None

    stage("ranking", per_entity)
    alive.sort(key=lambda n: (-info[n]["tests_per_entity"], n))
    for i, n in enumerate(alive):
        info[n]["rank"] = i + 1
    if r.max_repos and len(alive) > r.max_repos:
        for n in alive[r.max_repos:]:
            why = f"ranked {info[n]['rank']} of {len(alive)} by tests per entity, past max_repos {r.max_repos}"
            stages[-1]["dropped"][n] = why
            info[n].update(dropped_at="ranking", reason=why)
        alive = alive[:r.max_repos]
        stages[-1]["kept"] = list(alive)

    def yield_(n):
        muts = mutations(trees[n], r.yield_trials, r.seed)
        ok = [d for d, p in muts if verify_bug(bases[n], p, timeout_s=r.suite_timeout_s).passed]
        info[n].update(yield_tried=len(muts), yield_valid=len(ok))
        info[n]["yield"] = round(len(ok) / len(muts), 3) if muts else 0.0
        if not muts:
            return "no place in its code where the stand-in's mutations apply"
        if len(ok) / len(muts) < r.min_yield:
            return (f"yield {len(ok)} of {len(muts)} stand-in mutations made a valid bug, under "
                    f"min_yield {r.min_yield:g}")
        return None

    stage("yield", yield_)
    return {"candidates": len(names), "folder": os.path.realpath(folder), "stages": stages,
            "selected": list(alive), "repos": info,
            "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in r.items()}}


def render(report: dict) -> str:
    """The report as text: per stage what it kept and dropped (with reasons), then the kept."""
    lines = [f"{report['candidates']} candidate repositories in {report['folder']}"]
    for s in report["stages"]:
        lines.append(f"stage {s['stage']}: {s['in']} in, {len(s['kept'])} kept, "
                     f"{len(s['dropped'])} dropped")
        lines += [f"  dropped {n}: {why}" for n, why in s["dropped"].items()]
    sel = report["selected"]
    lines.append(f"selected {len(sel)}: " + (", ".join(
        f"{n} ({report['repos'][n]['tests_per_entity']} tests/entity, yield "
        f"{report['repos'][n]['yield']})" for n in sel) if sel else "none"))
    return "\n".join(lines)
