"""Generator/policy evaluation metrics against hand-computed values, and both CLI modes."""

import json
import math

import pytest

from rossjax.train.propel import eval_generator as ev


def test_metrics():
    assert ev.distinct_n(["a b c d", "a b c e"]) == pytest.approx(3 / 4)
    assert ev.self_bleu(["a b c d", "a b c d"]) == pytest.approx(1.0)
    assert ev.self_bleu(["a b c d", "w x y z"]) == 0.0
    # 1-gram 3/4, 2-gram 2/3, 3-gram 1/2; equal lengths: no brevity penalty
    assert ev.bleu("a b c x".split(), ["a b c d".split()]) == pytest.approx(
        math.exp((math.log(3 / 4) + math.log(2 / 3) + math.log(1 / 2)) / 3))
    assert ev.pass_at_k(8, 0, 1) == 0 and ev.pass_at_k(8, 8, 4) == 1
    assert ev.pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))
    assert ev.utility_rate([1, 3, 4, 2, 0], [True, True, True, False, True], 8, 1 / 8, 3 / 8) == 0.4
    assert ev.top_topic_rate(["a", "b", "a", "a"]) == 0.75
    assert ev.topic("def f(s):\n    return s[::-1]") == "string"
    assert ev.topic("def f(x):\n    return x * 2") == "arithmetic"


def _count(seq, gram):
    n = len(gram)
    return sum(1 for i in range(len(seq) - n + 1) if tuple(seq[i:i + n]) == gram)


def slow_self_bleu3(texts):
    """Self-BLEU-3 from the definition, one n-gram occurrence at a time, with Montahaei et al.'s
    smoothing (NLTK method1: a zero match count becomes 0.1; no unigram match scores 0)."""
    toks = [t.split() for t in texts]
    scores = []
    for i, hyp in enumerate(toks):
        refs = toks[:i] + toks[i + 1:]
        logp = 0.0
        for n in (1, 2, 3):
            grams = [tuple(hyp[j:j + n]) for j in range(len(hyp) - n + 1)]
            clipped = 0
            for g in set(grams):
                clipped += min(_count(hyp, g), max(_count(r, g) for r in refs))
            if clipped == 0 and n == 1:
                logp = None
                break
            logp += math.log((clipped or 0.1) / max(1, len(grams))) / 3
        if logp is None:
            scores.append(0.0)
            continue
        closest = sorted(refs, key=lambda r: (abs(len(r) - len(hyp)), len(r)))[0]
        bp = 1.0 if len(hyp) > len(closest) else math.exp(1 - len(closest) / len(hyp))
        scores.append(bp * math.exp(logp))
    return sum(scores) / len(scores)


def test_diversity_and_pass_at_k_against_slow_references():
    import itertools
    import random

    rng = random.Random(0)
    words = "def f x return + * 1 2 s sorted".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(9)]
    assert ev.self_bleu(texts) == pytest.approx(slow_self_bleu3(texts), rel=1e-9)
    grams = [tuple(t.split()[j:j + 3]) for t in texts for j in range(len(t.split()) - 2)]
    assert ev.distinct_n(texts) == pytest.approx(len(set(grams)) / len(grams))
    # pass@k: the share of k-subsets of the n samples that hold a correct one
    for n, c, k in [(6, 2, 1), (6, 2, 3), (7, 1, 4), (5, 0, 2), (5, 4, 2)]:
        subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
        assert ev.pass_at_k(n, c, k) == pytest.approx(sum(any(x) for x in subsets) / len(subsets))


def test_bad_config_sentences():
    from rossjax import cli

    for over, says in [("--config.solver.kind=foo", "config.solver.kind"),
                       ("--config.mode=poli", "config.mode"), ("--config.k=0", "config.k"),
                       ("--config.lo=0.5", "config.lo")]:
        c = cli.parse_config(["--config=configs/eval_generator.py:runlocal", over, "--config.hi=0.4"])[0]
        with pytest.raises(ValueError, match=says):
            ev.check_config(c)


@pytest.mark.slow
def test_cli_runlocal(tmp_path):
    from rossjax import cli

    rc = cli.main(["eval-generator", "--config=configs/eval_generator.py:runlocal",
                   f"--workdir={tmp_path}", "--config.num_tasks=4", "--config.max_new_tokens=16"])
    assert rc == 0
    out = json.load(open(tmp_path / "eval_generator.json"))
    assert out["tasks"] == 4 and 0 <= out["validity_rate"] <= 1 and "self_bleu3" in out
    rc = cli.main(["eval-generator", "--config=configs/eval_generator.py:runlocal", "--config.mode=policy",
                   f"--workdir={tmp_path}", "--config.num_tasks=2", "--config.k=4",
                   "--config.ks=(1,4)", "--config.max_new_tokens=8", "--config.workers=0"])
    assert rc == 0
    out = json.load(open(tmp_path / "eval_generator.json"))
    assert out["pass@1"] == 0.0 and out["coverage"] == 0.0  # a random tiny model never adds


def test_generator_mode_with_programmatic_solvers(tmp_path, monkeypatch):
    import importlib.util
    import os

    from rossjax.train.propel.eval_generator import evaluate_generator

    path = os.path.join(os.path.dirname(__file__), "..", "configs", "eval_generator.py")
    spec = importlib.util.spec_from_file_location("eval_generator_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    get_config = mod.get_config

    texts = ["```python\ndef f(x):\n    return x * 3 + 1\n```\n```inputs\n1\n2\n```\n"
             "```message\nlinear\n```",
             "```python\ndef f(s):\n    return s[::-1]\n```\n```inputs\n'ab'\n'xyz'\n```\n"
             "```message\nstrings\n```",
             "no task here"]
    monkeypatch.setattr(ev, "_sample", lambda *a, **k: texts)
    c = get_config("runlocal")
    c.workdir, c.k, c.lo, c.hi = str(tmp_path), 2, 1.0, 1.0
    c.induction.n_inputs, c.induction.n_visible = 2, 1   # one pair shown, one hidden
    out = evaluate_generator(c)
    assert out["validity_rate"] == pytest.approx(2 / 3)
    assert out["solve_counts"] == [2, 2, 0] and out["utility_rate"] == pytest.approx(2 / 3)
    c.solver.kind = "identity"
    out = evaluate_generator(c)
    assert out["solve_counts"] == [0, 0, 0] and out["utility_rate"] == 0.0
    assert out["top_topic_rate"] == 0.5
