"""PROPEL's SWE generator trained with agentic GRPO (configs/propel_swe.py): the bash env over a
repository of the RL split (rossjax/agents/swe_env.py), the verdict as validity, the probe read
over the episode's agent turns.

A random tiny model writes no tool call, so `plant_bug` (a module:function tool-call parser) reads
every candidate's first turn as one bash call that plants a real bug (touching intervals are no
longer merged) and its second turn as the answer: the engine, the sandboxed shell, the verifier,
the probe reward and the records are the real ones. The reward is checked against a computation
of its own: per-turn activations from `activations.extract` on each turn's prefix, the
attention aggregate written out in numpy, the probe's temperature-calibrated score.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rossjax.agents import ToolCall
from rossjax.configs import propel_swe
from rossjax.errors import ConfigError
from rossjax.models import loading
from rossjax.probes import heads
from rossjax.probes.activations import extract
from rossjax.tokenizers import load_tokenizer
from rossjax.tokenizers.ascii import write_ascii_tokenizer
from rossjax.train.rl import grpo_config
from rossjax.train.rl.history import read_history

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
BUG = "sed -i 's/start <= out\\[-1\\]\\[1\\]/start < out[-1][1]/' intervals/ops.py"
LAYER, TEMPERATURE = 1, 2.5


def plant_bug(text, n0):
    """First turn: the bash call that plants the bug; later turns: the answer."""
    return ([ToolCall("bash", {"command": BUG}, f"call_{n0}")], []) if n0 == 0 else ([], [])


def _grpo(workdir, *args):
    env = {**os.environ, "PYTHONPATH": HERE + os.pathsep + ROOT, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "rossjax.cli", "grpo",
                           "--config=configs/propel_swe.py:runlocal", f"--workdir={workdir}",
                           "--config.grpo.steps=1", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _probe(path, cfg, params):
    """A linear probe on layer LAYER of the reference, with an SWE manifest (attention over
    turns, calibrated at TEMPERATURE), fitted to random labels of random ASCII rows."""
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(32, 127, 40)) for _ in range(48)]
    x = extract(cfg, params, rows, (LAYER,), "mean")[:, 0]
    y = rng.integers(0, 2, len(rows))
    p = heads.train_probe(x[:32], y[:32], x[32:], y[32:], heads.TrainConfig(max_epochs=5))
    p = heads.Probe("linear", p.params, p.mean, p.std, TEMPERATURE, p.dropout)
    heads.save_probe(path, p, {"head": "linear", "layer": LAYER, "pooling": "mean",
                               "turn_pooling": "attention", "turns": True, "domain": "swe",
                               "temperature": TEMPERATURE, "dropout": p.dropout})
    return p


def _expected(rec, cfg, params, probe, eos):
    """The reward of a valid episode, computed apart from rossjax.probes.turns / reward."""
    ids = rec["token_ids"]
    # each turn: its sampled tokens through its end-of-turn token (sampled, or closed by the
    # template when the turn ran out of tokens)
    spans = [(a, b if ids[b - 1] == eos else b + 1) for a, b in rec["agent"]["policy_spans"]]
    assert len(spans) == 2 and all(ids[e - 1] == eos for _, e in spans)
    got = [(t0, t1) for i, t0, t1 in rec["agent"]["message_spans"]
           if rec["messages"][i]["role"] == "assistant"]
    assert got == spans, (got, spans)
    v = np.stack([extract(cfg, params, [ids[:e]], (LAYER,), "mean", [[(s, e)]])[0, 0]
                  for s, e in spans]).astype(np.float64)                     # [T, d]
    logits = v @ v[-1] / np.sqrt(v.shape[-1])
    w = np.exp(logits - logits.max())
    x = ((w / w.sum())[:, None] * v).sum(0)[None].astype(np.float32)
    z = np.asarray(probe.logits(x), np.float64)[0]
    z = z - z.max()
    return float(np.exp(z[1] / TEMPERATURE) / np.exp(z / TEMPERATURE).sum()), probe.score(
        x, calibrated=False)[0]


@pytest.mark.slow  # ~90-120 s on 2 cores: a CLI run (compile, the clean suite, 8 shell turns)
def test_planted_bug_episode_gets_the_turn_aggregated_calibrated_probe_score(tmp_path):
    c = propel_swe.get_config("runlocal")
    tok = load_tokenizer(write_ascii_tokenizer(str(tmp_path / "tok")))
    c.model.vocab_size = tok.vocab_size
    cfg, params = loading.load_model(c.model.to_dict(), seed=c.train.seed)
    probe = _probe(str(tmp_path / "probe"), cfg, params)
    # a one-line prompt: the scripted parser ignores it, and the App. 18 prompt's ~3k ASCII
    # tokens would only make every forward of this test longer
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "swe-intervals", "repo": "intervals", "domain": "swe",
                                 "prompt": "Plant one bug in intervals."}) + "\n")
    out = _grpo(tmp_path / "run", "--config.agent.style=test_propel_swe:plant_bug",
                f"--config.data.tasks={tasks}", "--config.agent.max_tokens=2048",
                f"--config.reward.probe.path={tmp_path / 'probe'}",
                "--config.grpo.dynamic_sampling=False")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = list(read_history(str(tmp_path / "run" / "history.jsonl")))
    assert len(rows) == 4
    for rec in rows:
        assert rec["agent"]["turns"] == 2 and rec["agent"]["stop"] == "answered"
        assert rec["rewards"]["env"] == 1.0, rec["verifier"]
        assert "test_merge_touching_and_unsorted" in rec["verifier"]["evidence"]
        assert "-        if out and start <= out[-1][1]:" in rec["patch"]
        want, raw = _expected(rec, cfg, params, probe, tok.eos_id)
        assert abs(want - raw) > 1e-3  # the calibration changes the score (not read raw)
        assert 0.01 < want < 0.99     # a non-trivial value, not the -0.2 of an invalid bug
        np.testing.assert_allclose(rec["reward"], want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(rec["rewards"]["probe"], want, rtol=1e-4, atol=1e-5)
    assert len({round(r["reward"], 6) for r in rows}) > 1  # candidates differ: advantages != 0


def test_runlocal_config_and_bad_inputs():
    c = propel_swe.get_config("runlocal")
    grpo_config.check_config(c)
    assert c.reward.probe.validity == "env" and c.reward.probe.invalid_reward == -0.2
    assert c.grpo.dynamic_sampling and c.grpo.overlong_buffer > 0
    tasks = [json.loads(x) for x in open(c.data.tasks)]
    from rossjax.agents.swe_env import rl_tasks

    assert tasks == rl_tasks(["gridops", "intervals", "romans", "tally", "textkit"])  # RL split
    sil = propel_swe.get_config("runlocal,sil")
    grpo_config.check_config(sil)
    assert sil.reward.solver.k == 3 and sil.reward.solver.band == "open"
    bad = propel_swe.get_config("runlocal")
    bad.reward.probe.validity = "validity"
    with pytest.raises(ConfigError, match="config.reward.probe.validity"):
        grpo_config.check_config(bad)
    bad = propel_swe.get_config("runlocal,sil")
    bad.reward.solver.kind = "oracle"
    with pytest.raises(ConfigError, match="SWE solver is an agent policy"):
        grpo_config.check_config(bad)
    for w in (0, 5):
        bad = propel_swe.get_config("runlocal,sil")
        bad.reward.solver.workers = w
        with pytest.raises(ConfigError, match="config.reward.solver.workers is"):
            grpo_config.check_config(bad)
    bad = propel_swe.get_config("runlocal")
    bad.grpo.overlong_buffer = bad.agent.max_tokens
    with pytest.raises(ConfigError, match="agent.max_tokens"):
        grpo_config.check_config(bad)
    bad = propel_swe.get_config("runlocal")
    bad.reward.functions = ("probe", "env")
    bad.reward.weights = (1.0, 1.0)
    with pytest.raises(ConfigError, match="config.reward.functions"):
        grpo_config.check_config(bad)


class _AlternateFixer:
    """A solver policy that fixes the planted bug on every other episode (the rest answer at
    once), so K = 3 trials give 2 solved of 3: inside the open band."""

    FIX = "sed -i 's/start < out\\[-1\\]\\[1\\]/start <= out[-1][1]/' intervals/ops.py"

    def __init__(self):
        self.episodes = 0

    def __call__(self, messages, tools):
        if messages[-1]["role"] == "user":  # an episode's first turn
            self.episodes += 1
            if self.episodes % 2:
                return {"content": "", "tool_calls": [{"id": "c0", "type": "function", "function": {
                    "name": "bash", "arguments": json.dumps({"command": self.FIX})}}]}
        return {"content": "done", "tool_calls": []}


def test_swe_sil_pays_realized_utility_of_three_solver_episodes():
    from rossjax.agents.swe_env import clean_baseline
    from rossjax.train.propel.rewards import SweSolverReward
    from rossjax.verify.repo import unified_diff

    base = clean_baseline("intervals")
    files = dict(base.files)
    files["intervals/ops.py"] = files["intervals/ops.py"].replace(
        "start <= out[-1][1]", "start < out[-1][1]")
    patch = unified_diff(base.files, files)
    s = propel_swe.get_config("runlocal,sil").reward.solver
    assert s.workers == 2
    s.workers = 1  # _AlternateFixer counts episodes: their order must be the trials'
    policy = _AlternateFixer()
    sil = SweSolverReward(s, policy, max_turns=3)
    recs = [{"id": f"r{i}", "task": {"repo": "intervals"}, "patch": patch if i < 1 else None}
            for i in range(3)]
    out = sil(recs, np.asarray([1.0, 0.0, np.nan]))["solver"]
    assert sil.last_trials[0] == [True, False, True]  # episodes 1 and 3 fix it
    assert out[0] == 1.0 and out[1] == -0.2 and np.isnan(out[2])
    assert sil.counts() == {"solver_trials": 3, "solver_tasks": 1}
    # two workers over two candidates' 3 + 3 episodes: each candidate gets its own trials
    s.workers = 2
    recs = [{"id": "a", "task": {"repo": "intervals"}, "patch": patch},
            {"id": "b", "task": {"repo": "intervals"}, "patch": patch}]
    fixer = lambda m, t: (_AlternateFixer()(m, t) if m[-1]["role"] == "user"
                          else {"content": "done", "tool_calls": []})
    sil = SweSolverReward(s, fixer, max_turns=3)
    out = sil(recs, np.ones(2))["solver"]
    assert sil.last_trials == [[True] * 3, [True] * 3]
    assert out.tolist() == [0.0, 0.0]  # 3 of 3 solved each: outside the open band
    assert sil.counts() == {"solver_trials": 6, "solver_tasks": 2}
    with pytest.raises(ValueError, match="carries no patch"):
        sil([{"id": "x", "task": {"repo": "intervals"}}], np.ones(1))
