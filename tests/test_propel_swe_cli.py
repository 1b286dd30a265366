"""PROPEL's SWE setting from the command line (issue 39 items 1-2): the generator prompt of App. 18
(its instructions, the THOUGHT + one bash block format, browse_index), `rossjax label-corpus
--config=configs/propel_swe.py:label` on a scripted solver (solve rates, utility only in (0, 1),
the drop rule, the printed next steps parse) and `rossjax swe-repos` (a drop per stage with its
reason). Each sandboxed suite run costs ~1 s here: the pools and candidates are a few repos."""

import json
import os
import shlex
import shutil

import pytest

from rossjax.agents import ToolCall
from rossjax.agents.rollout import PolicyError
from rossjax.agents.swe import GENERATOR_PROMPT
from rossjax.agents.swe_env import clean_baseline
from rossjax.agents.swe_label import _Reverter
from rossjax.agents.swe_tools import IndexedBashEnv, bash_block, entity_index
from rossjax.cli import main, parse_config
from rossjax.configs import propel_swe
from rossjax.errors import ConfigError
from rossjax.verify.repo import read_tree, unified_diff

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data", "swe")


def test_generator_prompt_carries_the_papers_instructions():
    p = GENERATOR_PROMPT.format(name="gridops")
    for part in ("gridops", "off-by-one", "Subtle and plausible", "Hard to spot", "at least one "
                 "existing test must now fail", "Never edit, add, delete or rename a test file",
                 "`browse_index`", "THOUGHT:", "exactly one fenced ```bash block",
                 "no bash block: that ends the episode", "python -m pytest -q"):
        assert part in p, part
    tasks = [json.loads(x) for x in open(os.path.join(DATA, "rl_tasks.jsonl"))]
    assert tasks and all(t["prompt"] == GENERATOR_PROMPT.format(name=t["repo"]) for t in tasks)
    c = propel_swe.get_config()
    assert c.agent.style == "rossjax.agents.swe_tools:bash_block"
    # the turn format: one block runs, none is the answer, two run nothing and say so
    calls, errs = bash_block("THOUGHT: look.\n```bash\nbrowse_index\n```", 4)
    assert calls == [ToolCall("bash", {"command": "browse_index"}, "call_4")] and not errs
    assert bash_block("THOUGHT: done, a test fails now.", 0) == ([], [])
    calls, errs = bash_block("```bash\nls\n```\n```bash\npwd\n```", 0)
    assert calls == [] and "exactly one block" in errs[0]


def test_browse_index_lists_entities_and_the_tests_that_use_them():
    files = read_tree(os.path.join(DATA, "gridops"))
    by = {e.name: e for e in entity_index(files)}
    assert set(by) == {"shape", "identity", "transpose", "matmul", "trace", "determinant"}
    assert by["determinant"].tests == tuple(sorted(
        f"tests/test_matrix.py::{t}" for t in ("test_determinant_small", "test_determinant_three",
                                               "test_determinant_rejects_non_square")))
    env = IndexedBashEnv()
    try:
        env.reset({"prompt": "x", "repo": os.path.join(DATA, "gridops")})
        obs, done, _ = env.step([ToolCall("bash", {"command": "browse_index gridops/"}, "c0")])
    finally:
        env.close()
    assert not done and obs[0].content.startswith("exit code: 0")
    assert "def determinant  lines 42-56  tests 3" in obs[0].content


def _bug(repo, rel, old, new):
    base = clean_baseline(repo)
    files = dict(base.files)
    assert old in files[rel]
    files[rel] = files[rel].replace(old, new, 1)
    return unified_diff(base.files, files)


class ScriptedSolver:
    """Per-task scripted episodes: F reverts the bug, . answers at once, E is an endpoint
    failure (an undecided trial). Episodes run one at a time (workers 1), in trial order."""

    per_task = True
    SCRIPT = {"half": "F.F", "easy": "FFF", "flaky": "EEF"}

    def __call__(self, base, patch, rid):
        fix, script, n = _Reverter(base, patch, rid, 1.0, 0).fix, self.SCRIPT[rid], [0]

        def policy(messages, tools):
            if messages[-1]["role"] != "user":
                return {"content": "done", "tool_calls": []}
            move, n[0] = script[n[0]], n[0] + 1
            if move == "E":
                raise PolicyError("scripted endpoint failure")
            if move == ".":
                return {"content": "done", "tool_calls": []}
            return {"content": "THOUGHT: revert", "tool_calls": [{
                "id": "c0", "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": fix})}}]}
        return policy


SCRIPTED = ScriptedSolver()


def test_label_corpus_swe_keeps_judged_bugs_with_solve_rates(tmp_path, capsys):
    rows = [{"id": "half", "repo": "intervals",
             "patch": _bug("intervals", "intervals/ops.py", "start <= out[-1][1]",
                           "start < out[-1][1]")},
            {"id": "easy", "repo": "tally",
             "patch": _bug("tally", "tally/counts.py", "key=lambda kv: -kv[1]",
                           "key=lambda kv: kv[1]")},
            {"id": "flaky", "repo": "gridops",
             "patch": _bug("gridops", "gridops/matrix.py", "sign = -1 if j % 2 else 1",
                           "sign = 1")},
            {"id": "nofail", "repo": "tally",  # changes code no test reaches: invalid
             "patch": _bug("tally", "tally/counts.py", '"""The inverse', '"""Inverse')}]
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "lc"
    assert main(["label-corpus", "--config=configs/propel_swe.py:label,runlocal",
                 f"--config.pool={pool}", f"--config.output={out}",
                 "--config.solver.fn=test_propel_swe_cli:SCRIPTED"]) == 0
    labs = {r["id"]: r for r in map(json.loads, open(out / "labels.jsonl"))}
    assert sorted(labs) == ["easy", "half"]  # flaky: 1 judged trial < 2; nofail: invalid
    assert labs["half"]["trials"] == [True, False, True] and labs["half"]["utility"] == 1
    assert abs(labs["half"]["solve_rate"] - 2 / 3) < 1e-9 and labs["half"]["group"] == "intervals"
    assert labs["easy"]["trials"] == [True] * 3 and labs["easy"]["utility"] == 0
    assert all((0 < r["solve_rate"] < 1) == (r["utility"] == 1) for r in labs.values())
    rep = json.loads((out / "report.json").read_text())
    assert rep["dropped"] == {"flaky": "1 of 3 trials could be judged, fewer than min_valid 2"}
    assert rep["invalid"]["nofail"].startswith("no_failing_test")
    assert rep["solver"]["trials"] == 9 and rep["solver"]["undecided"] == 2
    inputs = [json.loads(x) for x in open(out / "inputs.jsonl")]
    assert [r["id"] for r in inputs] == ["half", "easy"]
    assert all(r["turn_spans"] == [[0, len(r["input_ids"])]] for r in inputs)
    printed = capsys.readouterr().out
    assert "kept 2 of 3 valid bugs" in printed
    nxt = [ln[len("next: "):] for ln in printed.splitlines() if ln.startswith("next: ")]
    assert [n.split()[1] for n in nxt] == ["extract", "probe-sweep"]
    for cmd in nxt:  # each parses as printed, with this run's paths
        args = shlex.split(cmd)[2:]
        cfg, _, rest = parse_config(args)
        assert not rest and str(out) in cmd
    assert cfg.domain == "swe" and cfg.band == "open" and cfg.stores == (str(out / "activations"),)


def test_label_config_refuses_a_non_agent_solver_and_no_reference(tmp_path):
    from rossjax.train.propel.label_corpus import check_config

    c = propel_swe.get_config("label")
    c.pool, c.solver.endpoint.model = "x.jsonl", "m"
    with pytest.raises(ConfigError, match="field 'reference' is empty"):
        check_config(c, str(tmp_path))
    c.reference, c.solver.kind, c.solver.path = "preset:tiny_qwen2", "model", "/m"
    with pytest.raises(ConfigError, match="agent policy"):
        check_config(c, str(tmp_path))
    assert (c.k, c.min_valid, c.solver.endpoint.temperature) == (3, 2, 0.6)


def test_swe_repos_drops_each_bad_candidate_with_its_reason(tmp_path, capsys):
    cand = tmp_path / "cand"
    shutil.copytree(os.path.join(DATA, "tally"), cand / "tally")
    (cand / "notests" / "notests").mkdir(parents=True)
    (cand / "notests" / "notests" / "__init__.py").write_text("def f():\n    return 1\n")
    shutil.copytree(os.path.join(DATA, "romans"), cand / "red")
    t = cand / "red" / "tests" / "test_numerals.py"
    t.write_text(t.read_text() + "\n\ndef test_wrong():\n    assert 1 == 2\n")
    shutil.copytree(os.path.join(DATA, "intervals"), cand / "deps")
    pp = cand / "deps" / "pyproject.toml"
    pp.write_text(pp.read_text().replace('requires-python = ">=3.9"',
                                         'requires-python = ">=3.9"\ndependencies = ["numpy"]'))
    shutil.copytree(os.path.join(DATA, "textkit"), cand / "sparse")
    (cand / "sparse" / "textkit" / "extra.py").write_text(
        "".join(f"def helper{i}(x):\n    return x + {i}\n\n\n" for i in range(12)))
    assert main(["swe-repos", f"--candidates={cand}", f"--workdir={tmp_path}",
                 "--config.repos.yield_trials=2"]) == 0
    rep = json.loads((tmp_path / "swe_repos" / "report.json").read_text())
    drops = {s["stage"]: s["dropped"] for s in rep["stages"]}
    assert drops["exclusions"] == {
        "notests": "no test file (tests/*.py, test_*.py)",
        "deps": "needs third-party packages (numpy); the suite runs on the stdlib and pytest only"}
    assert list(drops["preflight"]) == ["red"]
    assert "test_wrong is FAILED" in drops["preflight"]["red"]
    assert list(drops["ranking"]) == ["sparse"] and "under min_tests_per_entity 1" in \
        drops["ranking"]["sparse"]
    assert rep["selected"] == ["tally"] and rep["repos"]["tally"]["yield_tried"] == 2
    printed = capsys.readouterr().out
    assert "dropped red: the clean suite must pass whole" in printed
    assert "fewer than 3 kept" in printed
    assert not (tmp_path / "swe_repos" / "rl_tasks.jsonl").exists()
