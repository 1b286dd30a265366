"""PROPEL's SWE domain, CPU half: the shipped repositories (data/swe/), the bug-writing verifier
(rossjax/verify/swe.py, one reason per failure; forgeries in tests/test_swe_forgery.py), tree
helpers (rossjax/verify/repo.py), and the agent layer's generator episode, K = 3 solver trials,
label rows and repo-disjoint splits (rossjax/agents/swe.py), with scripted policies."""

import json
import os

import pytest

from rossjax.agents import swe as aswe
from rossjax.errors import InputError
from rossjax.probes.labels import read_label_file, utility_labels
from rossjax.verify import repo as rrepo, swe
from rossjax.verify.base import verify_one

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "swe")
REPOS = ("intervals", "romans", "textkit")
GOOD_LINE = "    if len(text) <= width:\n"
BUG_LINE = "    if len(text) < width:\n"
CORE = "textkit/core.py"


@pytest.fixture(scope="module")
def base():
    return swe.baseline(os.path.join(DATA, "textkit"))


def edited(base, path, old, new):
    files = dict(base.files)
    assert old in files[path]
    files[path] = files[path].replace(old, new)
    return files


def bug_patch(base):
    return rrepo.unified_diff(base.files, edited(base, CORE, GOOD_LINE, BUG_LINE))


@pytest.mark.parametrize("name", REPOS)
def test_shipped_repositories_pass_whole(name):
    b = swe.baseline(os.path.join(DATA, name))
    assert b.name == name and len(b.tests) >= 8
    assert any(swe.may_change(p) for p in b.files) and any(swe.is_test_path(p) for p in b.files)


def test_a_real_bug_passes(base):
    v = swe.verify_bug(base, bug_patch(base))
    assert v.passed is True, v
    assert v.evidence == "1 of 10 tests now fail: tests/test_core.py::test_truncate_exact_width"


def _symlink_patch():
    return ("diff --git a/textkit/link.py b/textkit/link.py\nnew file mode 120000\n"
            "--- /dev/null\n+++ b/textkit/link.py\n@@ -0,0 +1 @@\n+/etc/passwd\n"
            "\\ No newline at end of file\n")


CASES = {
    "empty": (lambda b: "", "invalid_patch: the patch is empty"),
    "garbage": (lambda b: "not a diff\n", "patch_does_not_apply: error: No valid patches"),
    "stale_hunk": (lambda b: bug_patch(b).replace("width:", "wdth:"),
                   "patch_does_not_apply: error: textkit/core.py: patch does not apply"),
    "test_edit": (lambda b: rrepo.unified_diff(b.files, edited(
        b, "tests/test_core.py", '== "hello-world"', '== "x"')),
        "forbidden_change: tests/test_core.py is a test file"),
    "config_edit": (lambda b: rrepo.unified_diff(b.files, edited(
        b, "pyproject.toml", 'testpaths = ["tests"]', 'testpaths = ["nothing"]')),
        "forbidden_change: pyproject.toml is not Python source"),
    "added_conftest": (lambda b: rrepo.unified_diff(b.files, {**b.files, "conftest.py": "x = 1\n"}),
                       "forbidden_change: conftest.py is added"),
    "deleted_file": (lambda b: rrepo.unified_diff(
        b.files, {k: v for k, v in b.files.items() if k != "textkit/__init__.py"}),
        "forbidden_change: textkit/__init__.py is deleted"),
    "symlink": (lambda b: _symlink_patch(), "forbidden_change:"),
    "comment_only": (lambda b: rrepo.unified_diff(b.files, edited(b, CORE, "import re\n",
                                                                  "import re  # re\n")),
                     "no_failing_test: all 10 tests still pass"),
    "import_crash": (lambda b: rrepo.unified_diff(b.files, edited(
        b, CORE, "import re\n", "import re\nraise SystemExit(3)\n")),
        "suite_broken: the package's process failed the checker's calls: the program exited"),
    "collection_error": (lambda b: rrepo.unified_diff(b.files, edited(
        b, "textkit/__init__.py", "slugify, title_case", "slugify, nope, title_case")),
        "suite_broken: pytest exited 2"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_bad_patch_has_one_reason(base, name):
    make, want = CASES[name]
    v = swe.verify_bug(base, make(base))
    assert v.passed is False and v.evidence.startswith(want), (name, v)


def test_a_hang_is_suite_broken(base):
    patch = rrepo.unified_diff(base.files, edited(base, CORE, "import re\n",
                                                  "import re\nimport time\ntime.sleep(60)\n"))
    v = swe.verify_bug(base, patch, timeout_s=2)
    assert v.passed is False and v.evidence.startswith("suite_broken: timeout"), v


def test_a_dropped_test_is_suite_broken(base):
    """A bug that tries to make pytest skip a test at import is not a failing test. pytest is
    not even importable in the package's process (it runs in the checker), so the import fails
    and the module's tests are not collected: `suite_broken`, never `FAILED`."""
    files = edited(base, CORE, "import re\n", "import re\nimport pytest\n"
                   "pytest.skip('gone', allow_module_level=True)\n")
    v = swe.verify_bug(base, rrepo.unified_diff(base.files, files))
    assert v.passed is False and v.evidence.startswith("suite_broken:"), v


def test_diff_round_trips(base):
    after = dict(base.files)
    after["textkit/extra.py"] = "x = 1"  # no newline at end
    after[CORE] = after[CORE].replace("import re\n", "")
    del after["textkit/__init__.py"]
    got, why = swe.apply_patch(base.files, rrepo.unified_diff(base.files, after))
    assert why is None and got == after
    assert rrepo.changed(base.files, after) == {
        CORE: "modified", "textkit/__init__.py": "deleted", "textkit/extra.py": "added"}


def test_patches_apply_as_git_apply_recount(base):
    """PROPEL applies a bug with `git apply --recount` (issue 39 item 6): wrong @@ line counts
    (a hand-edited diff) still apply, an empty file's deletion applies, and a patch with one
    stale hunk applies nothing (no half-applied bug)."""
    import re

    after = edited(base, CORE, "import re\n", "import re\n\n\nWIDTH = 3\n")
    good = rrepo.unified_diff(base.files, after)
    miscounted = re.sub(r"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@",
                        lambda m: f"@@ -{m[1]},{int(m[2]) + 7} +{m[3]},{int(m[4]) + 9} @@", good,
                        flags=re.M)
    assert miscounted != good
    got, why = swe.apply_patch(base.files, miscounted)
    assert why is None and got == after
    empty = {**base.files, "textkit/empty.py": ""}
    got, why = swe.apply_patch(empty, rrepo.unified_diff(empty, base.files))
    assert why is None and got == base.files
    two = {**after, "textkit/__init__.py": base.files["textkit/__init__.py"] + "# more\n"}
    stale = rrepo.unified_diff(base.files, two).replace(" __all__", " __al__")
    assert stale.count("__al__") == 1   # the core.py hunk still applies; the patch as a whole not
    got, why = swe.apply_patch(base.files, stale)
    assert got is None and why.startswith("patch_does_not_apply")


def test_trees_refuse_links_special_files_and_binary(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "ok.py").write_text("x = 1\n")
    assert rrepo.read_tree(str(tmp_path / "a")) == {"ok.py": "x = 1\n"}
    os.symlink("/etc/passwd", tmp_path / "a" / "link")
    with pytest.raises(rrepo.RepoError, match="link is a symlink"):
        rrepo.read_tree(str(tmp_path / "a"))
    with pytest.raises(rrepo.RepoError, match="symlink"):
        rrepo.copy_tree(str(tmp_path / "a"), str(tmp_path / "b"))
    os.remove(tmp_path / "a" / "link")
    os.mkfifo(tmp_path / "a" / "pipe")
    with pytest.raises(rrepo.RepoError, match="pipe is not a regular file"):
        rrepo.copy_tree(str(tmp_path / "a"), str(tmp_path / "c"))
    os.remove(tmp_path / "a" / "pipe")
    (tmp_path / "a" / "bin.dat").write_bytes(b"\xff\xfe")
    with pytest.raises(rrepo.RepoError, match="bin.dat is not UTF-8"):
        rrepo.read_tree(str(tmp_path / "a"))
    with pytest.raises(rrepo.RepoError, match="leaves the repository"):
        rrepo.write_tree({"../x.py": ""}, str(tmp_path / "d"))


def test_a_red_baseline_is_refused(tmp_path, base):
    rrepo.write_tree(edited(base, CORE, GOOD_LINE, BUG_LINE), str(tmp_path / "red"))
    with pytest.raises(InputError, match="clean suite must pass whole; tests/test_core.py::"
                                         "test_truncate_exact_width is FAILED"):
        swe.baseline(str(tmp_path / "red"))


class Script:
    """A policy that runs the given bash commands, one per turn, then answers."""

    def __init__(self, *commands):
        self.commands, self.turn = list(commands), 0

    def __call__(self, messages, tools):
        assert tools[0]["function"]["name"] == "bash"
        if self.turn < len(self.commands):
            cmd = self.commands[self.turn]
            self.turn += 1
            return {"content": "", "tool_calls": [{"id": f"c{self.turn}", "function": {
                "name": "bash", "arguments": json.dumps({"command": cmd})}}]}
        return {"content": "done", "tool_calls": []}


FIX = f"sed -i 's/{BUG_LINE.strip()}/{GOOD_LINE.strip()}/' {CORE}"
BREAK = f"sed -i 's/{GOOD_LINE.strip()}/{BUG_LINE.strip()}/' {CORE}"


def test_generator_episode_writes_a_verified_bug(base):
    row, patch = aswe.write_bug(base, Script("python -m pytest -q | tail -1", BREAK), rid="g0",
                                env={"step_timeout_s": 20})
    assert row["verifier"]["passed"] is True, row["verifier"]
    assert row["patch"] == patch and patch == bug_patch(base)
    assert row["task"]["repo"] == "textkit" and "passed" in row["messages"][3]["content"]
    assert verify_one(row) == swe.verify_bug(base, patch)  # the row alone re-verifies
    assert verify_one({**row, "patch": "junk\n"}).passed is False
    assert verify_one({**row, "task": {"repo": "../etc"}}).passed is None
    assert "neither a directory" in verify_one({**row, "task": {"repo": "nope"}}).evidence
    row, patch = aswe.write_bug(base, Script("sed -i 's/== \"hello-world\"/== \"x\"/' "
                                             "tests/test_core.py"), rid="g1")
    assert row["verifier"]["passed"] is False
    assert row["verifier"]["evidence"].startswith("forbidden_change: tests/test_core.py")


class Alternating:
    """Trial j uses policies[j % len(policies)] (solver_trials makes a fresh episode per trial)."""

    def __init__(self, *policies):
        self.policies, self.last, self.i = policies, None, -1

    def __call__(self, messages, tools):
        if len(messages) == 2:  # a new episode: system + user
            self.i += 1
        return self.policies[self.i % len(self.policies)](messages, tools)


def test_k3_solver_trials_and_utility(base, tmp_path):
    patch = bug_patch(base)
    cheat = ("sed -i 's/assert truncate(\"hello\", 5) == \"hello\"/assert True/' "
             "tests/test_core.py")
    policy = Alternating(Script(FIX), Script(), Script(cheat))
    trials, rows = aswe.solver_trials(base, patch, policy, k=3, rid="t0",
                                      env={"step_timeout_s": 20})
    assert trials == [True, False, False], [r["verifier"] for r in rows]
    assert rows[0]["verifier"]["evidence"] == "all 10 tests pass"
    assert rows[1]["verifier"]["evidence"].startswith("tests_fail: 1 of 10 still fail")
    assert rows[2]["verifier"]["evidence"].startswith("forbidden_change: tests/test_core.py")
    label = aswe.label_row("t0", base, trials)
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps(label) + "\n" + json.dumps(aswe.label_row("t1", base, [1, 1, 1]))
                    + "\n")
    got = read_label_file(str(path))
    lab = utility_labels([r["trials"] for r in got], band="open")
    assert lab.y.tolist() == [1, 0] and got[0]["group"] == "textkit"
    with pytest.raises(InputError, match="patch_does_not_apply"):
        aswe.solver_trials(base, "junk\n", policy, k=3)


def test_repo_disjoint_splits():
    a = aswe.repo_splits(REPOS, seed=0)
    assert sorted(a) == sorted(REPOS) and sorted(a.values()) == ["eval", "probe", "rl"]
    assert a == aswe.repo_splits(list(reversed(REPOS)), seed=0)
    many = aswe.repo_splits([f"r{i}" for i in range(10)], seed=1)
    assert sorted(list(many.values()).count(s) for s in aswe.SPLITS) == [2, 2, 6]
    assert set(aswe.repo_splits(["a", "b"], fractions=(1, 0, 0)).values()) == {"probe"}
    with pytest.raises(InputError, match="2 repositories cannot fill 3 disjoint splits"):
        aswe.repo_splits(["a", "b"])
    with pytest.raises(InputError, match="fractions"):
        aswe.repo_splits(REPOS, fractions=(1, -1, 1))
    rows = [{"id": "x", "group": r} for r in REPOS]
    parts = aswe.split_rows(rows, a)
    assert sum(len(v) for v in parts.values()) == 3
    with pytest.raises(InputError, match="row 1: group 'other'"):
        aswe.split_rows([{"id": "y", "group": "other"}], a)


def test_generator_row_compiles_with_one_span_per_agent_turn(base):
    """The generator's row is a rollout row curate compiles (exclude mode), one turn span per
    assistant turn: what the probe pools per agent turn."""
    from rossjax.curate import compile_rollout
    from rossjax.curate.schema import validate_record
    from rossjax.tokenizers import load_tokenizer

    row, _ = aswe.write_bug(base, Script("ls", BREAK), rid="g2")
    assert row["verifier"]["passed"] is True and validate_record(row) is None
    ex = compile_rollout(row, load_tokenizer("qwen"), template="chatml")
    assert ex.status == "kept", ex.detail
    assert len(ex.turn_spans) == 3  # two tool-calling turns and the final answer


def test_a_repository_whose_tests_need_objects_is_refused(tmp_path):
    """Only functions and plain values cross to the checker: a clean suite that needs an
    instance of the package's class cannot run, and the sentence says why."""
    rrepo.write_tree({"pt/__init__.py": "class P:\n    x = 1\n\n\ndef make():\n    return P()\n",
                      "tests/test_pt.py": "from pt import make\n\n\ndef test_make():\n"
                                          "    assert make().x == 1\n"}, str(tmp_path / "r"))
    with pytest.raises(InputError, match=r"clean suite does not run: the package's process "
                                         r"failed the checker's calls: refused: pt.make\(\) "
                                         r"returned a value of type pt.P"):
        swe.baseline(str(tmp_path / "r"))
