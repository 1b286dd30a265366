"""Route fingerprints: labelling, features against a slow reference, determinism, invariances."""

import os
import subprocess
import sys

import numpy as np
import pytest

from rossjax.bench.select import family_routes, render_step, synth_traces
from rossjax.curate import fingerprint as exported_fingerprint
from rossjax.routes.fingerprint import (
    N_BIGRAM_BUCKETS,
    N_STATS,
    N_TRIGRAM_BUCKETS,
    _features,
    fingerprint,
    get_vocab,
    route_steps,
    trace_text,
)

MATH = ("Let x be the number of apples.\n\nCompute 3 + 4 = 7.\n\nWait, that is wrong: it is 3 + 5.\n\n"
        "Check: 8 - 5 = 3, indeed.\n\n<tool_call>{\"name\": \"python\", \"arguments\": {}}</tool_call>\n\n"
        "Therefore the answer is \\boxed{8}.")


def labels(text, domain="math"):
    v = get_vocab(domain)
    return [v.labels[i] for i in route_steps(text, v)[0]]


def test_exported_from_package():
    assert exported_fingerprint is fingerprint


def test_step_labels_math():
    assert labels(MATH) == ["setup", "compute", "backtrack", "verify", "tool", "conclude"]
    # single paragraph -> lines; single line -> sentences
    assert labels("Let n be 5.\nSo n + 1 = 6.\nThe answer is 6.") == ["setup", "compute", "conclude"]
    assert labels("Suppose x is odd. Case 1: x = 1. Perhaps it works. Hmm.") == [
        "setup", "case_split", "hypothesize", "other"]
    # cues right at the start, after a consumed trailing space, after a line break; \boxed, digits
    assert labels("Let us check.") == ["verify"]
    assert labels("Wait\nlet x be 2\n\\boxed{3}") == ["backtrack", "setup", "conclude"]
    assert labels("x\n2 + 3 = 5") == ["other", "compute"]
    assert labels("Thought: look up\nAction: search\nObservation: ok") == ["other", "tool", "other"]
    # a record's own step annotations are used as given
    assert labels(["Substitute y = 2x.", "no cue here", "We verify it."]) == [
        "substitute", "other", "verify"]


def test_step_labels_code_and_puzzle():
    code = ("My plan: parse then sum.\n\nRead the file utils.py first.\n\nImplement def f(x): return x.\n\n"
            "Run pytest on it.\n\nFix the off-by-one bug.\n\nHere is the final code.")
    assert labels(code, "code") == ["plan", "read", "write", "run", "debug", "conclude"]
    puzzle = "Move the disk to peg C.\n\nCheck the rules hold.\n\nDead end, undo.\n\nSolved."
    assert labels(puzzle, "puzzle") == ["move", "verify", "backtrack", "conclude"]


def test_shape_dtype_and_seed():
    texts = [MATH, "Let a be 1.\n\nThe answer is 1."]
    f = fingerprint(texts)
    assert f.shape == (2, 64) and f.dtype == np.float32
    np.testing.assert_array_equal(f, fingerprint(texts))
    assert fingerprint(texts, dim=16).shape == (2, 16)
    assert not np.allclose(f, fingerprint(texts, seed=1))
    assert fingerprint([]).shape == (0, 64)


def test_identical_in_a_fresh_process_with_another_hash_seed(tmp_path):
    code = ("import sys, numpy as np; from rossjax.routes.fingerprint import fingerprint; "
            f"np.save(sys.argv[1], fingerprint([{MATH!r}, 'Check it. Done.'], 'math', 64, 3))")
    out = tmp_path / "f.npy"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, env=env)
    np.testing.assert_array_equal(np.load(out), fingerprint([MATH, "Check it. Done."], "math", 64, 3))


def test_golden_vector():
    # Pins the projection (PCG64 stream), the vocabulary and the feature layout: any change to
    # them changes every stored fingerprint and must be deliberate.
    f = fingerprint([MATH], "math", 64, 0)[0]
    np.testing.assert_allclose(f[:4], GOLDEN, rtol=0, atol=1e-5)


GOLDEN = np.array([-0.0784257, -0.0641998, 0.0964419, -0.1293978], np.float32)


def slow_stats(ids, lens, verify_id, backtrack_id):
    n = len(ids)
    nv = sum(1 for i in ids if i == verify_id)
    nb = sum(1 for i in ids if i == backtrack_id)
    longest, run = 1, 1
    for a, b in zip(ids, ids[1:]):
        run = run + 1 if a == b else 1
        longest = max(longest, run)
    first = next((k / n for k, i in enumerate(ids) if i == verify_id), 1.0)
    ll = [np.log1p(x) for x in lens]
    mean = sum(ll) / n
    std = np.sqrt(max(sum((v - mean) ** 2 for v in ll) / n, 0))
    return np.array([np.log1p(n) / 4, np.log1p(nb) / 2, nb / n, np.log1p(nv) / 2, nv / n,
                     longest / n, np.log1p(longest) / 3, first, float(nv > 0),
                     (mean - 4.5) / 2, std / 2, (max(ll) - min(ll)) / 4])


def test_features_match_slow_reference():
    v = get_vocab("math")
    texts = [MATH, "Check. Check. Check. Let x be 1. Wait, no.", "Plain words only."]
    routes = [route_steps(t, v) for t in texts]
    feats = _features(routes, v)
    L = v.n_labels
    assert feats.shape[1] == L + N_BIGRAM_BUCKETS + N_TRIGRAM_BUCKETS + N_STATS
    for row, (ids, lens) in enumerate(routes):
        hist = np.bincount(ids, minlength=L) / len(ids)
        np.testing.assert_allclose(feats[row, :L], hist, atol=1e-12)
        bi = np.zeros(N_BIGRAM_BUCKETS)
        for a, b in zip(ids, ids[1:]):
            bi[v.bi_table[a, b]] += 1 / max(len(ids) - 1, 1)
        np.testing.assert_allclose(feats[row, L:L + N_BIGRAM_BUCKETS], bi, atol=1e-12)
        tri = np.zeros(N_TRIGRAM_BUCKETS)
        for a, b, c in zip(ids, ids[1:], ids[2:]):
            tri[v.tri_table[a, b, c]] += 1 / max(len(ids) - 2, 1)
        np.testing.assert_allclose(feats[row, L + N_BIGRAM_BUCKETS:-N_STATS], tri, atol=1e-12)
        np.testing.assert_allclose(feats[row, -N_STATS:] / 0.5,
                                   slow_stats(ids, lens, v.verify_id, v.backtrack_id), atol=1e-9)


def test_paraphrase_moves_less_than_reordering():
    routes = family_routes(30, seed=3)
    rng = np.random.Generator(np.random.PCG64(0))
    orig, para, reord = [], [], []
    for route in routes:
        steps = [render_step(lab, rng) for lab in route]
        orig.append("\n\n".join(steps))
        para.append("\n\n".join(render_step(lab, rng) for lab in route))   # new wording, same steps
        perm = rng.permutation(len(steps))
        reord.append("\n\n".join(steps[i] for i in perm))                  # same wording, new order
    fo, fp, fr = fingerprint(orig), fingerprint(para), fingerprint(reord)
    d_para = np.linalg.norm(fo - fp, axis=1)
    d_reord = np.linalg.norm(fo - fr, axis=1)
    assert d_para.mean() < 0.5 * d_reord.mean()
    assert (d_para < d_reord).mean() >= 0.9


def test_routes_signature_ignores_wording():
    texts, fam = synth_traces(40, family_routes(4, seed=1), seed=2, mutate=0)
    _, sig = fingerprint(texts, return_routes=True)
    for f in range(4):
        assert len(set(sig[fam == f])) == 1
    assert len(set(sig)) == len(set(fam))


@pytest.mark.parametrize("bad", [[""], ["   \n\t "], ["ok", []], ["ok", ["  ", ""]]])
def test_empty_traces_raise(bad):
    with pytest.raises(ValueError, match=r"texts\[\d\] is empty or only whitespace"):
        fingerprint(bad)


def test_other_bad_input():
    with pytest.raises(ValueError, match="unknown fingerprint domain"):
        fingerprint(["x"], domain="chemistry")
    with pytest.raises(ValueError, match="dim must be >= 1"):
        fingerprint(["x"], dim=0)
    with pytest.raises(ValueError, match="single string"):
        fingerprint("Let x be 1.")


def test_trace_text_from_record():
    rec = {"messages": [
        {"role": "user", "content": "Check this problem."},
        {"role": "assistant", "reasoning": "Let x be 2.", "content": "The answer is 2.",
         "tool_calls": [{"name": "python", "arguments": {"code": "print(2)"}}]}]}
    text = trace_text(rec)
    assert "Check this" not in text
    assert labels(text) == ["setup", "conclude", "tool"]
    assert trace_text({"steps": ["a", "b"], "messages": []}) == ["a", "b"]
