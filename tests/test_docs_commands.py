"""Issue 42 item 4: every `rossjax ...` command README.md and docs/*.md show runs as written.

Each command block (```bash / ```sh / ```console / a plain fence, or an indented block) is
split into its `rossjax` / `python -m rossjax.cli` commands, and each is parsed by the command's
own parser without running it (rossjax.cli.flags._parse, or argparse for inspect, bench and
repro), so an unknown flag, a field the config lacks, a missing config file, a bad `:variant`
or a training config that names no model fails here. The curate / select / inspect / mix commands whose inputs ship with rossjax, and that
name no placeholder, also run for real (seconds each) in a scratch folder.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL_FENCES = ("bash", "sh", "console", "shell", "")
PREFIXES = (("rossjax",), ("python", "-m", "rossjax.cli"), ("python", "-m", "rossjax"))
TAKE_POSITIONALS = ("export",)  # rossjax export ... OUT_DIR
RUN = ("curate", "select", "inspect", "mix")  # seconds on the shipped data
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9_]{1,}\b")  # MODEL, DIR, ROLLOUT_ID, ...


def doc_files() -> list[str]:
    return [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def blocks(path: str):
    """(first line number, lines) of each shell fence and each indented block of `path`."""
    lines = open(path, encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            if m.group(1) in SHELL_FENCES:
                yield i + 2, lines[i + 1:j]
            i = j + 1
        elif lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            yield i + 1, [ln[4:] for ln in lines[i:j]]
            i = j
        else:
            i += 1


def commands(body: list[str]):
    """The argv (after the command's name) of each rossjax command in a block: `\\` lines
    joined, a console's `$ ` dropped, `# comments` and `...` elisions left out, `&&` and `;`
    split."""
    text = re.sub(r"\\\n", " ", "\n".join(body))
    for line in text.splitlines():
        line = line.strip().removeprefix("$ ")
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        cmd: list[str] = []
        for w in words + ["&&"]:
            if w in ("&&", ";", "|", "||"):
                for pre in PREFIXES:
                    if tuple(cmd[:len(pre)]) == pre and len(cmd) > len(pre):
                        yield [a for a in cmd[len(pre):] if a != "..."]
                        break
                cmd = []
            else:
                cmd.append(w)


def documented() -> list[tuple[str, list[str]]]:
    out = []
    for path in doc_files():
        for line, body in blocks(path):
            for argv in commands(body):
                out.append((f"{os.path.relpath(path, REPO)}:{line}", argv))
    return out


DOCUMENTED = documented()


class _Parsed(Exception):
    def __init__(self, cfg, rest):
        super().__init__("parsed")
        self.cfg, self.rest = cfg, rest


def _no_model(cfg) -> bool:
    """A training config that names no model stops before step 1 (issue 42: docs/data.md's)."""
    model = cfg.get("model") if cfg is not None else None
    return (model is not None and hasattr(model, "keys") and {"path", "preset"} <= set(model)
            and not model.path and not model.preset)


def dry_parse(argv, monkeypatch, capsys) -> str:
    """"" when rossjax's dispatcher and the command's parser accept argv, else what it said."""
    from rossjax import cli
    from rossjax.cli import flags

    real_parse, real_args = flags._parse, argparse.ArgumentParser.parse_args

    def parse_then_stop(*a, **k):
        cfg, _, rest = real_parse(*a, **k)
        raise _Parsed(cfg, rest)

    def args_then_stop(self, args=None, namespace=None):
        real_args(self, args, namespace)
        raise _Parsed(None, [])

    monkeypatch.setattr(flags, "_parse", parse_then_stop)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", args_then_stop)
    try:
        code = cli.main(list(argv))
    except _Parsed as p:
        if p.rest and argv[0] not in TAKE_POSITIONALS:
            return f"unexpected arguments {p.rest}"
        if _no_model(p.cfg) and "--help" not in argv:
            return "config.model.path and config.model.preset are both empty"
        return ""
    except SystemExit as e:  # argparse's own error exit
        return f"exit {e.code}: {capsys.readouterr().err.strip()}"
    finally:
        monkeypatch.undo()
    return f"exit {code} before parsing: {capsys.readouterr().err.strip()[-400:]}"


@pytest.mark.parametrize("where,argv", DOCUMENTED, ids=[w for w, _ in DOCUMENTED])
def test_documented_command_parses(where, argv, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # the docs' relative paths (configs/..., data/...) are the repo's
    problem = dry_parse(argv, monkeypatch, capsys)
    assert not problem, f"{where}: rossjax {shlex.join(argv)}: {problem}"


def test_the_extractor_finds_the_documented_commands():
    """The blocks the issue named are found (a fence or indent change must not hide them)."""
    where = {w.split(":")[0] for w, _ in DOCUMENTED}
    assert {"README.md", "docs/data.md", "docs/agents.md", "docs/retrogen.md",
            "docs/review.md"} <= where
    names = {a[0] for _, a in DOCUMENTED}
    assert {"curate", "train", "grpo", "reconstruct", "review", "inspect"} <= names
    found = [a for w, a in DOCUMENTED if w.startswith("docs/data.md") and a[0] == "train"]
    assert found and "--config.recipe=sft" in found[0]


def test_the_parse_check_catches_a_broken_command(monkeypatch, capsys):
    """A mutation guard: each kind of mistake the check is for fails it."""
    monkeypatch.chdir(REPO)
    for argv in (["curate", "--config.recipee=sft"],
                 ["train", "--config=configs/ross_sft.py:nope", "--workdir=w"],
                 ["train", "--config=configs/no_such.py", "--workdir=w"],
                 ["train", "--config=configs/ross_sft.py", "--workdir=w", "stray"],
                 ["inspect", "DIR", "--no-such-flag"],
                 ["train", "--config=configs/ross_sft.py", "--workdir=w"],
                 ["no-such-command"]):
        assert dry_parse(argv, monkeypatch, capsys), argv
    assert dry_parse(["curate", "--config.recipe=sft"], monkeypatch, capsys) == ""


def _runnable(argv) -> bool:
    """A cheap command on shipped inputs: no placeholder anywhere, and every input it names
    (`--config.input=`, inspect's folder) exists relative to the repository."""
    if argv[0] not in RUN or any(PLACEHOLDER.search(a) for a in argv):
        return False
    inputs = [a.split("=", 1)[1] for a in argv if a.startswith("--config.input=")]
    if argv[0] == "inspect":
        inputs = [a for a in argv[1:2] if not a.startswith("-")]
    # a W/... or /tmp/... input is what an earlier command of the same doc wrote
    return all(glob.glob(os.path.join(REPO, p)) or p.startswith(("W/", "/tmp/")) for p in inputs)


RUNNABLE = [(w, a) for w, a in DOCUMENTED if _runnable(a)]


def _in_scratch(argv, scratch: str) -> list[str]:
    """Absolute /tmp paths moved into the scratch folder; the rest run relative to it, where
    configs/ and data/ link to the repository's."""
    return [f"{scratch}/{a[5:]}" if a.startswith("/tmp/") else a.replace("=/tmp/", f"={scratch}/")
            for a in argv]


def test_cheap_documented_commands_run(tmp_path, monkeypatch):
    """The documented curate / select / inspect / mix commands on shipped data run to exit 0,
    in document order (an inspect reads the curate before it), quietly."""
    from rossjax import cli

    assert {a[0] for _, a in RUNNABLE} >= {"curate", "inspect"}, RUNNABLE  # not vacuous
    for d in ("configs", "data"):
        os.symlink(os.path.join(REPO, d), tmp_path / d)
    monkeypatch.chdir(tmp_path)
    failed = []
    for where, argv in RUNNABLE:
        args = _in_scratch(argv, str(tmp_path))
        if args[0] == "curate":
            args.append("--config.progress=False")
        try:
            code = cli.main(args)
        except SystemExit as e:
            code = e.code
        if code != 0:
            failed.append(f"{where}: rossjax {shlex.join(argv)} (exit {code})")
    assert not failed, failed
