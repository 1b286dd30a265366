"""PROPEL's SWE bug pools and held-out evaluation, agent side (no jax): which repositories, the
bug-writing stand-in, and what is read off a bug's patch (its files, its kind, its changed lines).

    repos = split_repos("probe")                # the shipped repositories of one split
    policy = MUTATION_STANDIN(base, j)          # a per-episode stand-in generator (NOT a model)
    row, patch = write_bug(base, policy, rid)   # agents.swe: one episode, verified (verify_bug)
    edited_files(patch), bug_topic(patch), changed_text(patch)
    summarize(records)                          # kept / invalid (with reasons) / undecided

`MUTATION_STANDIN` is a scripted generator that writes App. 18's turn format (a THOUGHT, then one
```bash block; the same command as a structured call, which the HTTP driver reads): turn 1 `browse_index`, turn 2 a python heredoc that writes episode j's seeded
single-token mutation (agents.swe_repos.mutations: a comparison, an operator, a constant), turn
3 a THOUGHT without a block (the end). Some mutations no test catches: those episodes are
invalid (`no_failing_test`), as a model's misses are. It stands in for the base generator
offline, where a random model writes no command at all; its bugs say nothing about any model.
"""

from __future__ import annotations

import collections
import json
import re

from rossjax.errors import InputError

_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)
# a bug's kind, by the first rule whose token set differs between removed and added lines
_TOPICS = (("comparison", r"<=|>=|==|!=|<|>"), ("boolean", r"\b(?:and|or|not|True|False)\b"),
           ("arithmetic", r"//|\*\*|[-+*/%]"), ("constant", r"\b\d+(?:\.\d+)?\b|'[^']*'|\"[^\"]*\""),
           ("indexing", r"[\[\]:]"), ("call", r"\w+\s*\(|,"))


def split_repos(split: str, repos=(), fractions=(0.6, 0.2, 0.2), seed: int = 0) -> list[str]:
    """`repos` when given, else the shipped repositories (data/swe/) of `split` (probe | rl |
    eval, agents.swe.repo_splits: whole repositories per split)."""
    from rossjax.agents.swe import SPLITS, repo_splits

    if repos:
        return list(repos)
    if split not in SPLITS:
        raise InputError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    names = shipped_repos()
    return sorted(r for r, s in repo_splits(names, tuple(fractions), seed).items() if s == split)


def shipped_repos() -> list[str]:
    import importlib.resources

    root = importlib.resources.files("rossjax") / "data" / "swe"
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def edited_files(patch: str | None) -> list[str]:
    return sorted(set(_DIFF_FILE.findall(patch or "")))


def _changed(patch: str, sign: str) -> list[str]:
    return [ln[1:] for ln in (patch or "").splitlines()
            if ln.startswith(sign) and not ln.startswith(sign * 3)]


def changed_text(patch: str | None) -> str:
    """The bug as text for Self-BLEU / Distinct: its removed then added lines (no headers, which
    every patch of a file shares)."""
    return "\n".join(["-" + x for x in _changed(patch, "-")] + ["+" + x for x in _changed(patch, "+")])


def bug_topic(patch: str | None) -> str:
    """The kind of change (a rule, not a classifier): the first of comparison, boolean,
    arithmetic, constant, indexing, call whose tokens differ between removed and added lines;
    else other."""
    old, new = "\n".join(_changed(patch, "-")), "\n".join(_changed(patch, "+"))
    for name, pat in _TOPICS:
        if collections.Counter(re.findall(pat, old)) != collections.Counter(re.findall(pat, new)):
            return name
    return "other"


def verdict_of(rec: dict) -> dict:
    """{passed, evidence} of a generator record: write_bug's row (`verifier`) or a GRPO-style
    engine record (`agent.verdict`)."""
    v = (rec.get("agent") or {}).get("verdict") or rec.get("verifier") or {}
    return {"passed": v.get("passed"), "evidence": str(v.get("evidence") or "no verdict")}


def reason_kind(evidence: str) -> str:
    head = evidence.split(":", 1)[0].strip()
    return head if re.fullmatch(r"[a-z_]+", head) else "other"


def summarize(records: list[dict]) -> dict:
    """Counts of a pool: kept (valid bugs), invalid {id: reason}, undecided {id: reason} (the
    sandbox could not judge), reasons by kind, and per repository."""
    out = {"episodes": len(records), "kept": 0, "invalid": {}, "undecided": {},
           "reasons": collections.Counter(), "per_repo": {}}
    for rec in records:
        v, repo = verdict_of(rec), (rec.get("task") or {}).get("repo")
        per = out["per_repo"].setdefault(repo, {"episodes": 0, "kept": 0})
        per["episodes"] += 1
        if v["passed"] and rec.get("patch"):
            out["kept"] += 1
            per["kept"] += 1
        elif v["passed"] is None:
            out["undecided"][rec["id"]] = v["evidence"]
        else:
            out["invalid"][rec["id"]] = v["evidence"]
            out["reasons"][reason_kind(v["evidence"])] += 1
    out["reasons"] = dict(out["reasons"].most_common())
    return out


def is_kept(rec: dict) -> bool:
    return bool(verdict_of(rec)["passed"]) and bool(rec.get("patch"))


class _Mutator:
    """One episode of the stand-in (module doc)."""

    def __init__(self, base, j: int, seed: int):
        from rossjax.agents.swe_repos import mutations
        from rossjax.verify.swe import apply_patch

        muts = mutations(base.files, 10_000, seed)
        if not muts:
            raise InputError(f"mutation stand-in: repository {base.name} has no place a "
                             "single-token mutation applies")
        self.what, patch = muts[j % len(muts)]
        after, why = apply_patch(base.files, patch)
        if after is None:
            raise InputError(f"mutation stand-in: {why}")
        edits = []  # (file, line index, new line): the lines the mutation changed
        for rel in sorted(p for p, t in after.items() if base.files.get(p) != t):
            old, new = base.files[rel].splitlines(keepends=True), after[rel].splitlines(keepends=True)
            edits += [(rel, i, b) for i, (a, b) in enumerate(zip(old, new)) if a != b]
        self.cmd = ("python - <<'RJ_STANDIN_EOF'\nimport pathlib\n"
                    + "".join(f"p = pathlib.Path({rel!r})\nlines = p.read_text().splitlines(True)\n"
                              f"lines[{i}] = {line!r}\np.write_text(''.join(lines))\n"
                              for rel, i, line in edits) + "RJ_STANDIN_EOF")

    def __call__(self, messages, tools):
        turn = sum(m.get("role") == "assistant" for m in messages)
        if turn == 0:
            return _block("THOUGHT: map the modules and the tests that reach them.", "browse_index")
        if turn == 1:
            return _block(f"THOUGHT: change {self.what} (a seeded stand-in mutation).", self.cmd)
        return {"content": "THOUGHT: the change is in place (stand-in; no bash block ends the "
                           "episode).", "tool_calls": []}


def _block(thought: str, cmd: str) -> dict:
    """A reply in App. 18's format, its one command also as a structured call (the HTTP
    driver, agents.rollout, reads structured calls or hermes text, not bash blocks)."""
    return {"content": f"{thought}\n```bash\n{cmd}\n```",
            "tool_calls": [{"id": "c0", "type": "function", "function": {
                "name": "bash", "arguments": json.dumps({"command": cmd})}}]}


class MutationStandin:
    """A per-episode stand-in generator factory, `factory(base, j)` -> policy: NOT a model."""

    per_episode = True

    def __init__(self, seed: int = 0):
        self.seed = seed

    def __call__(self, base, j: int):
        return _Mutator(base, j, self.seed)


MUTATION_STANDIN = MutationStandin()
