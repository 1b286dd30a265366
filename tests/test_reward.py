"""Probe rewards: compositions against obvious references; a real probe read from the frozen
reference model scores rendered candidates exactly as extract + probe.score do; the PROPEL config
runs end to end (probe reward behind the validity gate, LoRA, KL)."""

import json
import os

import jax
import numpy as np
import pytest

from rossjax import models
from rossjax.probes import heads, reward
from rossjax.probes.activations import extract


def test_compositions():
    s = np.array([0.9, 0.1, 0.6, 0.3])
    valid = np.array([1, 0, 1, 0])
    np.testing.assert_array_equal(reward.probe_only(s), s)
    np.testing.assert_allclose(reward.hard_gate(s, valid), [0.9, -0.2, 0.6, -0.2])
    np.testing.assert_allclose(reward.hard_gate(s, valid, invalid_reward=-1.0), [0.9, -1, 0.6, -1])
    v = np.array([1.0, 0.5, 0.0, 0.25])
    np.testing.assert_allclose(reward.soft_gate(s, v), [a * b for a, b in zip(s, v)])
    with pytest.raises(ValueError):
        reward.soft_gate(s, v + 1)
    e = [s, np.array([0.5, 0.5, 0.7, 0.1]), np.array([1.0, 0.0, 0.65, 0.2])]
    np.testing.assert_allclose(reward.wco(e), [min(x[i] for x in e) for i in range(4)])
    aux = np.array([0.2, 0.0, 0.9, 0.0])
    want = [min(s[i], aux[i]) if valid[i] else s[i] for i in range(4)]
    np.testing.assert_allclose(reward.adversarial(s, aux, valid), want)
    tot = reward.combine({"a": s, "b": v}, {"a": 0.5, "b": 2.0})
    np.testing.assert_allclose(tot, 0.5 * s + 2.0 * v)
    assert np.isnan(reward.combine({"a": np.array([np.nan])}, {"a": 1.0})[0])
    with pytest.raises(ValueError):
        reward.gate("hard_gate", s, None)


def _texts(n, seed=0):
    rng = np.random.default_rng(seed)
    out, y = [], []
    for _ in range(n):
        k = int(rng.integers(0, 2))
        body = "".join(rng.choice(list("abcdefgh"), 12))
        out.append(body[:6] + ("z" if k else "y") * 12 + body[6:])
        y.append(k)
    return out, np.asarray(y)


def test_probe_reward_reads_frozen_reference(tmp_path):
    from rossjax.probes.heads import save_probe

    cfg = models.get_preset("tiny_qwen2", dtype="float32")
    ref = models.init_params(cfg, jax.random.PRNGKey(0))
    enc = lambda t: [ord(c) for c in t]
    texts, y = _texts(96)
    x = extract(cfg, ref, [enc(t) for t in texts], (1,), "mean")[:, 0]
    probe = heads.train_probe(x[:64], y[:64], x[64:], y[64:], heads.TrainConfig(max_epochs=30))
    man = {"head": "linear", "layer": 1, "pooling": "mean", "turn_pooling": "mean", "turns": False,
           "temperature": probe.temperature, "dropout": probe.dropout}
    save_probe(str(tmp_path / "p"), probe, man)
    scorer = reward.ProbeScorer.load(str(tmp_path / "p"))
    records = [{"messages": [{"role": "assistant", "content": t}]} for t in texts[64:]]
    render = lambda r: (enc(r["messages"][-1]["content"]), None)
    pr = reward.ProbeReward(cfg, ref, [scorer], render)
    got = pr(records)
    want = probe.score(x[64:], calibrated=False)  # Math/AZR: raw scores (SWE: calibrated)
    np.testing.assert_allclose(got["probe"], want, rtol=1e-5, atol=1e-6)
    # the probe reads a token-visible property: clearly better than chance on held-out rows
    acc = np.mean((got["probe"] >= 0.5) == y[64:])
    assert acc >= 0.8, acc
    # a second probe (worst case) and an auxiliary probe compose as documented
    flipped = reward.ProbeScorer(heads.Probe("linear", jax.tree.map(lambda a: -a, probe.params),
                                             probe.mean, probe.std, probe.temperature), man)
    both = reward.ProbeReward(cfg, ref, [scorer, flipped], render, auxiliary=flipped)
    out = both(records, valid=np.ones(len(records)))
    np.testing.assert_allclose(out["probe"], np.minimum(want, 1 - want), atol=1e-5)
    np.testing.assert_allclose(out["probe_reward"], np.minimum(out["probe"], out["probe_aux"]))


@pytest.mark.slow
def test_propel_runlocal_end_to_end(tmp_path, capsys):
    from rossjax import cli

    work = str(tmp_path / "w")
    rc = cli.main(["grpo", "--config=configs/propel_azr.py:runlocal", f"--workdir={work}",
                   "--config.grpo.steps=2", "--config.grpo.max_new_tokens=16"])
    assert rc == 0
    # the banner names the probe that pays the reward
    assert "probe reward from bootstrap (linear, layer" in capsys.readouterr().err
    rows = [json.loads(x) for x in open(os.path.join(work, "history.jsonl"))]
    assert len(rows) == 2 * 16
    for r in rows:  # hard gate: invalid tasks get exactly -0.2, valid ones the probe score
        v = r["rewards"]["validity"]
        assert r["reward"] == pytest.approx(-0.2 if v == 0 else r["rewards"]["probe_score"])
        # the verdict is the reward's (issue 29: GRPO -> ROSS with any reward), with the
        # validity gate's own evidence after it
        assert r["verifier"]["name"] == "grpo_reward"
        assert r["verifier"]["passed"] == (r["reward"] >= 0.5)  # reward.success_threshold
        assert "induction_task_valid" in r["verifier"]["evidence"]
    m = [json.loads(x) for x in open(os.path.join(work, "metrics.jsonl"))]
    assert m[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # LoRA starts as the reference
