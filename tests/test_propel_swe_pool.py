"""PROPEL's SWE bug pool and held-out evaluation from the command line (issue 39 item 1):
`rossjax swe-pool` on scripted generators (verified bugs kept with their turn spans, invalid ones
listed with reasons, the printed label-corpus step parses), the evaluation's metrics on
constructed cases (identical bugs: Self-BLEU-3 1, top-file rate 1) and `rossjax swe-eval` end
to end on a scripted generator and solver. Each sandboxed suite run costs ~1 s here."""

import json
import os
import shlex

import pytest
from test_propel_swe_cli import ScriptedSolver as CliScriptedSolver

from rossjax.agents.swe_label import read_pool
from rossjax.agents.swe_pool import _Mutator, bug_topic, changed_text, edited_files
from rossjax.cli import main, parse_config
from rossjax.configs import propel_swe
from rossjax.errors import ConfigError
from rossjax.train.propel.eval_generator import distinct_n
from rossjax.train.propel.swe_eval import metrics


def _idle(messages, tools):
    return {"content": "THOUGHT: nothing to change.", "tool_calls": []}


class ScriptedGenerator:
    """Episode j: MOVES[j] is a mutation index of agents.swe_pool's stand-in, or None (answers at
    once: the tree is unchanged)."""

    per_episode = True
    MOVES = (1, None, 0)

    def __call__(self, base, j):
        move = self.MOVES[j % len(self.MOVES)]
        return _idle if move is None else _Mutator(base, move, 0)


class SameBug:
    """Every episode writes the stand-in's first mutation: identical bugs."""

    per_episode = True

    def __call__(self, base, j):
        return _Mutator(base, 0, 0)


class ScriptedSolver(CliScriptedSolver):
    """Per bug: F reverts the bug, . answers at once (test_propel_swe_cli's solver)."""

    SCRIPT = {"textkit-0": "F.", "textkit-1": "FF"}


SCRIPTED_GENERATOR, SAME_BUG, SCRIPTED_SOLVER = ScriptedGenerator(), SameBug(), ScriptedSolver()


def test_swe_pool_keeps_verified_bugs_with_turn_spans_and_lists_invalid(tmp_path, capsys):
    from rossjax.tokenizers import load_tokenizer
    from rossjax.tokenizers.ascii import write_ascii_tokenizer
    from rossjax.train.propel.swe_label import probe_input

    out = tmp_path / "pool"
    assert main(["swe-pool", "--config=configs/propel_swe.py:pool,runlocal",
                 "--config.repos=('romans',)", f"--config.output={out}",
                 "--config.generator.workers=2",  # two episodes at once; rows in episode order
                 "--config.generator.fn=test_propel_swe_pool:SCRIPTED_GENERATOR"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["episodes"] == 3 and rep["kept"] == 1
    # romans' mutation 0 changes code no test reaches; episode 1 changes nothing
    assert rep["invalid"]["romans-1"] == "no_change: the patch changes no file"
    assert rep["invalid"]["romans-2"].startswith("no_failing_test")
    assert rep["reasons"] == {"no_change": 1, "no_failing_test": 1} and not rep["undecided"]
    assert rep["per_repo"] == {"romans": {"episodes": 3, "kept": 1}}
    assert rep["agent"]["style"] == "rossjax.agents.swe_tools:bash_block"
    assert [json.loads(x)["id"] for x in open(out / "episodes.jsonl")] == [
        "romans-0", "romans-1", "romans-2"]
    pool = [json.loads(x) for x in open(out / "pool.jsonl")]
    assert [r["id"] for r in pool] == ["romans-0"] and pool[0]["patch"].startswith("diff --git")
    assert edited_files(pool[0]["patch"]) == ["romans/numerals.py"]
    # what label-corpus reads: the record, whose exact ids give one span per generated turn
    [p] = read_pool(str(out / "pool.jsonl"))
    assert p["record"] is not None and p["patch"] == pool[0]["patch"]
    tok = load_tokenizer(write_ascii_tokenizer(str(tmp_path / "tok")))
    inp = probe_input(p, tok, "chatml")
    assert len(inp["turn_spans"]) == 3 and inp["input_ids"] == pool[0]["token_ids"]
    assert "browse_index" in tok.decode(inp["input_ids"][slice(*inp["turn_spans"][0])])
    printed = capsys.readouterr().out
    assert "1 verified bugs, 2 invalid" in printed and "no_failing_test 1" in printed
    [nxt] = [ln[len("next: "):] for ln in printed.splitlines() if ln.startswith("next: ")]
    assert nxt == rep["next"] and nxt.split()[1] == "label-corpus"
    cfg, _, rest = parse_config(shlex.split(nxt)[2:])  # it parses as printed, on this pool
    assert not rest and cfg.pool == str(out / "pool.jsonl") and cfg.tokenizer == "ascii"
    assert cfg.solver.fn == "rossjax.agents.swe_label:REVERTING_STANDIN"


def test_pool_and_eval_configs_carry_the_rl_runs_budgets_and_refuse_bad_settings(tmp_path):
    from rossjax.train.propel import swe_eval, swe_pool

    rl, pool, ev = (propel_swe.get_config(v) for v in (None, "pool", "eval"))
    assert (pool.agent.max_turns, pool.agent.max_tokens) == (35, 32768)
    assert pool.agent.max_new_tokens == rl.grpo.max_new_tokens
    assert pool.generator.temperature == rl.grpo.temperature and pool.split == "probe"
    assert ev.split == "eval" and ev.k == 3 and ev.min_valid == 2
    assert ev.solver.endpoint.temperature == 0.6 and ev.agent == pool.agent
    pool.generator.path = ""
    with pytest.raises(ConfigError, match="path and .preset are both empty"):
        swe_pool.check_config(pool)
    pool.generator.kind, pool.generator.fn = "fn", "m:f"
    pool.generator.style = "rossjax.agents.swe_tools:bash_block"
    with pytest.raises(ConfigError, match="HTTP driver"):
        swe_pool.check_config(pool)
    ev.generator.path = "/m"
    with pytest.raises(ConfigError, match="solver.endpoint.model is empty"):
        swe_eval.check_config(ev)


def test_eval_metrics_on_constructed_bugs():
    def bug(repo, rel, old, new, utility=None, valid=True):
        patch = (f"diff --git a/{rel} b/{rel}\n--- a/{rel}\n+++ b/{rel}\n@@ -1 +1 @@\n"
                 f"-{old}\n+{new}\n")
        return {"repo": repo, "patch": patch, "valid": valid, "utility": utility}

    same = [bug("r", "r/a.py", "    if lo <= hi:", "    if lo < hi:", u)
            for u in (1, 0, 1)]
    m = metrics(same)
    assert m["self_bleu3"] == pytest.approx(1.0) and m["top_file_rate"] == 1.0
    assert m["top_topic_rate"] == 1.0 and m["topics"] == {"comparison": 3}
    assert distinct_n([changed_text(same[0]["patch"])]) == 1.0  # no trigram repeats in one
    assert m["distinct3"] == pytest.approx(1 / 3)
    assert m["realized_utility"] == pytest.approx(2 / 3) and m["band_rate"] == pytest.approx(2 / 3)
    mixed = [bug("r", "r/a.py", "n = 1", "n = 2", 1), bug("r", "r/b.py", "y = a + b", "y = a - b", 0),
             bug("q", "q/c.py", "ok = a or b", "ok = a and b", None),  # not judged
             bug("q", "q/c.py", "z = 0", "z = 0", None, valid=False)]
    m = metrics(mixed)
    # r: top file 1 of 2; q: 1 of 1 (the invalid bug is not counted) -> 2 of 3
    assert m["top_file_rate"] == pytest.approx(2 / 3) and m["validity_rate"] == 0.75
    assert m["realized_utility"] == 0.25 and m["band_rate"] == 0.5 and m["judged"] == 2
    assert m["self_bleu3"] < 0.5 and m["distinct3"] == 1.0  # only r has 2 bugs
    assert [bug_topic(b["patch"]) for b in mixed[:3]] == ["constant", "arithmetic", "boolean"]
    assert m["collapse"] == {"top_file_rate": m["top_file_rate"],
                             "top_topic_rate": pytest.approx(1 / 3)}


def test_swe_eval_end_to_end_on_a_scripted_generator_and_solver(tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["swe-eval", "--config=configs/propel_swe.py:eval,runlocal",
                 "--config.bugs_per_repo=2", "--config.k=2", "--config.min_valid=2",
                 f"--config.output={out}",
                 "--config.generator.fn=test_propel_swe_pool:SAME_BUG",
                 "--config.solver.fn=test_propel_swe_pool:SCRIPTED_SOLVER"]) == 0
    rep = json.loads((out / "report.json").read_text())
    m = rep["metrics"]
    assert rep["repos"] == ["textkit"] and m["sampled"] == 2 and m["valid"] == 2
    assert m["realized_utility"] == 0.5 and m["band_rate"] == 0.5  # F. in band, FF not
    assert m["self_bleu3"] == pytest.approx(1.0) and m["top_file_rate"] == 1.0
    bugs = [json.loads(x) for x in open(out / "bugs.jsonl")]
    one = distinct_n([changed_text(bugs[0]["patch"])])
    assert m["distinct3"] == pytest.approx(one / 2) and m["top_topic_rate"] == 1.0
    assert rep["solver"]["trials"] == 4 and rep["solver"]["solved"] == 3
    assert [b["trials"] for b in bugs] == [[True, False], [True, True]]
    assert [b["utility"] for b in bugs] == [1, 0]
    printed = capsys.readouterr().out
    assert "realized utility 0.500" in printed and "Self-BLEU-3 1.000" in printed
    assert "top-edited-file rate 1.000" in printed and os.path.isfile(out / "report.json")
