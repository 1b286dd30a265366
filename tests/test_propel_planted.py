"""PROPEL's reward and evaluation on planted tasks: scripted completions stand in for sampling, so
the branches a random tiny model never reaches (valid tasks, the probe score behind the validity
gate, the auxiliary probe's minimum, solve counts inside the utility band, pass@k between 0 and 1)
run with non-trivial values, each checked against a hand computation from the definitions.

Hand references: the probe reads layer 0 (the embeddings), so its input is the mean of the
reference's embedding rows over the rendered prompt's tokens, computed here in float64 from the
weights we saved; the linear head is z = (x - mean) / std, logits = z K + b,
p = sigmoid((l1 - l0) / T). Validity is labelled by construction (each invalid task breaks one
rule of the AZR protocol). pass@k is counted over every k-subset of the K scripted answers.
"""

import itertools
import json
import os
import re

import jax
import numpy as np
import pytest

from rossjax import models
from rossjax.probes import heads


def _task(prog, inputs, msg):
    return ("```python\n" + prog + "\n```\n```inputs\n" + "\n".join(inputs) + "\n```\n```message\n"
            + msg + "\n```")


_TEN = [str(i) for i in range(10)]
# (completion, valid by construction); written in canonical form (induction_task.task_text), so
# the text the probe reads is the completion itself as a user turn.
VALID = [
    _task("def f(x):\n    return x * 3 + 1", _TEN, "linear"),
    _task("def f(s):\n    return s[::-1] + 'z'", [repr(c * (i + 1)) for i, c in enumerate("abcdefghij")],
          "reverse it"),
    _task("def f(xs):\n    return sorted(xs)[-1]", [str([i, 9 - i, 20 + i]) for i in range(10)], "largest"),
    _task("def f(x):\n    return x * x", _TEN, "square"),
    _task("def f(x):\n    return x - 4", _TEN, "shift"),
    _task("def f(x):\n    return 2 ** x", _TEN, "powers"),
    _task("def f(x):\n    return -x", _TEN, "negate"),
]
INVALID = [
    _task("def f(x):\n    return x + 1", _TEN[:9], "nine inputs"),          # 9 of 10 inputs
    _task("def f(x):\n    return x - 1", _TEN, ""),                         # no message
    _task("import os\ndef f(x):\n    return x + 2", _TEN, "banned import"),  # banned name
    _task("def f(x):\n    return 7", _TEN, "constant"),                     # outputs not distinct
    _task("def f(x):\n    return x +", _TEN, "syntax"),                     # does not parse
    "no blocks at all",
    _task("def g(x):\n    return x", _TEN, "no f"),                         # defines no f
    _task("def f(x):\n    return 10 // x", _TEN, "zero division"),          # an input raises
    _task("def f(x):\n    return x % 2 + x", _TEN, "parity"),                # f(1) == f(2)
]
# 4 groups of 4: all valid, mixed, all invalid, mixed (3 valid + 1 invalid).
PLANTED = [VALID[0], VALID[1], VALID[2], VALID[3],
           VALID[4], INVALID[0], VALID[5], INVALID[1],
           INVALID[2], INVALID[3], INVALID[4], INVALID[5],
           INVALID[6], VALID[6], INVALID[7], VALID[0]]
LABELS = [t in VALID for t in PLANTED]


def _linear_probe(rng, feats, temperature):
    """A linear head over features standardised on `feats` (so its scores spread over (0, 1))."""
    d = feats.shape[1]
    params = {"Dense_0": {"kernel": rng.normal(0, d ** -0.5, (d, 2)).astype(np.float32),
                          "bias": rng.normal(0, 0.3, (2,)).astype(np.float32)}}
    return heads.Probe("linear", params, feats.mean(0).astype(np.float32),
                       (feats.std(0) + 1e-3).astype(np.float32), temperature)


def _save(path, probe):
    heads.save_probe(path, probe, {"head": "linear", "layer": 0, "pooling": "mean",
                                   "turn_pooling": "mean", "turns": False,
                                   "temperature": probe.temperature, "dropout": probe.dropout})
    return path


def _hand_score(probe, emb, ids):
    """P(in band) of one rendered prompt, from the definitions in float64."""
    x = emb[np.asarray(ids)].astype(np.float64).mean(axis=0)
    z = (x - probe.mean.astype(np.float64)) / probe.std.astype(np.float64)
    k = probe.params["Dense_0"]["kernel"].astype(np.float64)
    b = probe.params["Dense_0"]["bias"].astype(np.float64)
    logit = z @ k + b
    return 1.0 / (1.0 + np.exp(-(logit[1] - logit[0]) / probe.temperature))


def test_planted_tasks_are_labelled_as_the_protocol_says():
    """The labels above are the protocol's (a wrong label would make the GRPO test vacuous)."""
    from rossjax.verify import induction_task as it

    for t in VALID + INVALID:
        v = it.check_task(it.parse_generated_task(t))
        assert bool(v.passed) == (t in VALID), (t, v)
    for t in VALID:  # canonical form: the probe reads exactly this text
        assert it.task_text(it.parse_generated_task(t)) == t


@pytest.mark.slow
def test_grpo_probe_reward_behind_the_validity_gate_on_planted_tasks(tmp_path, monkeypatch):
    """`rossjax grpo --config=configs/propel_azr.py:runlocal` with a scripted sampler: every
    valid task is paid min(probe, auxiliary probe), every invalid one exactly -0.2; the probe's
    score is logged for both and equals the hand computation."""
    from rossjax import cli, sample
    from rossjax.tokenizers import load_tokenizer
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    cfg = models.get_preset("tiny_qwen2", dtype="float32")
    params = models.init_params(cfg, jax.random.PRNGKey(3))
    base = str(tmp_path / "base")
    models.save_hf(cfg, params, base)
    emb = np.asarray(params["embed"]["embedding"])
    tok = load_tokenizer(write_ascii_tokenizer(str(tmp_path / "tok")))
    rendered = [tok.encode("<|im_start|>user\n" + t + "<|im_end|>\n<|im_start|>assistant\n")
                for t in PLANTED]
    feats = np.stack([emb[np.asarray(ids)].mean(0) for ids in rendered])
    rng = np.random.default_rng(2)  # a draw whose paid scores straddle 0.5 (asserted below)
    # Temperature 1: PROPEL's AZR reward reads raw (uncalibrated) scores, so a fitted temperature
    # would not enter the reward; with T = 1 raw and calibrated agree.
    probe, aux = _linear_probe(rng, feats, 1.0), _linear_probe(rng, feats, 1.0)
    p_path, a_path = _save(str(tmp_path / "probe"), probe), _save(str(tmp_path / "aux"), aux)

    calls = []

    def scripted(model_cfg, prm, prompts, max_new_tokens, *, num_samples=1, **kw):
        calls.append((len(prompts), num_samples, max_new_tokens))
        n = len(prompts) * num_samples
        assert n == len(PLANTED)
        toks = np.zeros((n, max_new_tokens), np.int32)
        lens = np.zeros(n, np.int32)
        for r, text in enumerate(PLANTED):
            ids = tok.encode(text) + [tok.eos_id]
            toks[r, :len(ids)], lens[r] = ids, len(ids)
        return sample.GenerationResult(toks, np.where(toks > 0, -1.0, 0.0).astype(np.float32),
                                       lens, ["stop"] * n)

    monkeypatch.setattr(sample, "generate", scripted)
    work = str(tmp_path / "run")
    rc = cli.main(["grpo", "--config=configs/propel_azr.py:runlocal", f"--workdir={work}",
                   "--config.grpo.steps=1", "--config.grpo.max_new_tokens=224",
                   "--config.reward.workers=0", f"--config.model.path={base}",
                   "--config.model.preset=", f"--config.reward.probe.path={p_path}",
                   f"--config.reward.probe.auxiliary={a_path}"])
    assert rc == 0
    assert calls == [(4, 4, 224)]
    rows = [json.loads(x) for x in open(os.path.join(work, "history.jsonl"))]
    assert [r["messages"][-1]["content"] for r in rows] == PLANTED

    got_valid = [r["rewards"]["validity"] for r in rows]
    assert got_valid == [1.0 if v else 0.0 for v in LABELS]
    want_reward = []
    for r, ids, valid in zip(rows, rendered, LABELS):
        s, s_aux = _hand_score(probe, emb, ids), _hand_score(aux, emb, ids)
        # float32 activations and head against float64: a few ulps of a probability
        assert r["rewards"]["probe_score"] == pytest.approx(s, abs=2e-6)
        want_reward.append(min(s, s_aux) if valid else -0.2)
        assert r["verifier"]["passed"] == (want_reward[-1] >= 0.5)
    np.testing.assert_allclose([r["reward"] for r in rows], want_reward, atol=2e-6)
    # Non-trivial: the paid scores spread inside (0, 1) on both sides of the success threshold,
    # and the auxiliary lowers some of them but not all.
    paid = [w for w, v in zip(want_reward, LABELS) if v]
    assert len(paid) == 8 and 1e-3 < min(paid) < 0.5 <= max(paid) < 1 - 1e-3 and np.std(paid) > 0.05
    lowered = [_hand_score(aux, emb, ids) < _hand_score(probe, emb, ids)
               for ids, valid in zip(rendered, LABELS) if valid]
    assert 0 < sum(lowered) < len(lowered)
    m = [json.loads(x) for x in open(os.path.join(work, "metrics.jsonl"))]
    assert m[-1]["step"] == 1
    assert m[-1]["reward_mean"] == pytest.approx(np.mean(want_reward), abs=2e-6)
    assert m[-1]["reward_validity_mean"] == pytest.approx(8 / 16)
    # group 3 is all invalid (-0.2 four times): the one group without a learning signal
    assert m[-1]["zero_var_group_frac"] == pytest.approx(1 / 4)
    groups = np.reshape(want_reward, (4, 4))
    mixed = np.mean([(g >= 0.5).any() and (g < 0.5).any() for g in groups])
    assert 0 < mixed and m[-1]["mixed_outcome_rate"] == pytest.approx(mixed)


def _eval_config(tmp_path, mode):
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "configs", "eval_generator.py")
    spec = importlib.util.spec_from_file_location("eval_generator_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config("runlocal")
    c.workdir, c.mode = str(tmp_path), mode
    return c


def test_generator_utility_band_with_a_scripted_model_solver(tmp_path, monkeypatch):
    """A model solver whose K = 4 answers per task are scripted: task i gets i right on the hidden
    inputs. Wrong answers include one that is right on every *shown* pair (a lookup table), which
    must count as wrong. Band 1..3 of 4."""
    from rossjax.train.propel import eval_generator as ev, solvers
    from rossjax.verify import induction_task as it

    gen = [VALID[0], VALID[3], VALID[4], VALID[5], VALID[6], INVALID[2]]
    n_right = [0, 1, 2, 3, 4]
    monkeypatch.setattr(ev, "_sample", lambda *a, **k: gen)
    c = _eval_config(tmp_path, "generator")
    c.solver.kind, c.k, c.lo, c.hi = "model", 4, 0.25, 0.75
    by_hint = {it.parse_generated_task(t)["message"]: (it.parse_generated_task(t), n)
               for t, n in zip(gen, n_right)}
    asked = []

    def scripted(mc, params, tok, prompts_msgs, n, cfg, seed, template="chatml", sampling=None):
        out = []
        for m in prompts_msgs:
            hint = re.search(r"^Hint: (.*)$", m[0]["content"], re.M).group(1)
            task, right = by_hint[hint]
            asked.append(hint)
            solver_task = it.solver_task(task, it.protocol_from(cfg.induction), "x")
            good = f"```python\n{task['program']}\n```"
            wrong = [it.lookup_answer(solver_task), "```python\ndef f(x):\n    return x\n```",
                     "no code"]
            out += [good] * right + [wrong[j % 3] for j in range(n - right)]
        return out

    monkeypatch.setattr(solvers, "sample_texts", scripted)
    out = ev.evaluate_generator(c)
    assert sorted(asked) == sorted(by_hint)  # the invalid task is never shown to the solver
    assert out["solve_counts"] == [0, 1, 2, 3, 4, 0]
    assert out["validity_rate"] == pytest.approx(5 / 6)
    assert out["utility_rate"] == pytest.approx(3 / 6)  # solve counts 1, 2, 3 of 4 are in band
    c.lo = c.hi = 1.0
    assert ev.evaluate_generator(c)["utility_rate"] == pytest.approx(1 / 6)


def test_policy_pass_at_k_coverage_and_outcomes_with_scripted_answers(tmp_path, monkeypatch):
    """Policy mode on gen:arith: K = 5 scripted answers per task, c_i of them right (the math
    verifier judges them); pass@k, coverage and the mixed/all-pass/all-fail shares by hand."""
    from rossjax.train.propel import eval_generator as ev

    right = [0, 1, 2, 5, 3, 4]
    K = 5

    def scripted(mc, params, tok, prompts_msgs, n, cfg, seed, sampling=None):
        assert n == K and len(prompts_msgs) == len(right)
        out = []
        for m, c_i in zip(prompts_msgs, right):
            a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", m[-1]["content"]).groups())
            out += [f"The sum is \\boxed{{{a + b}}}."] * c_i
            out += [f"The sum is \\boxed{{{a + b + 1 + j}}}." for j in range(n - c_i)]
        return out

    monkeypatch.setattr(ev, "_sample", scripted)
    c = _eval_config(tmp_path, "policy")
    c.tasks, c.num_tasks, c.k, c.ks, c.workers = "gen:arith", len(right), K, (1, 2, 5), 0
    c.solver.preset = c.generator.preset
    out = ev.evaluate_policy(c)
    for k in (1, 2, 5):
        per_task = []
        for c_i in right:
            subsets = list(itertools.combinations([1] * c_i + [0] * (K - c_i), k))
            per_task.append(sum(any(s) for s in subsets) / len(subsets))
        assert out[f"pass@{k}"] == pytest.approx(np.mean(per_task), rel=1e-12), k
    assert out["pass@1"] == pytest.approx(15 / 30)   # (0 + 1 + 2 + 5 + 3 + 4) / (6 * 5)
    assert out["coverage"] == pytest.approx(5 / 6)
    o = out["outcomes"]
    assert o["counts"] == {"all_pass": 1, "all_fail": 1, "mixed": 4}
    assert o["mixed"] == pytest.approx(4 / 6) and o["samples_per_prompt"] == K
    assert out["undecided_samples"] == 0
