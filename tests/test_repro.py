"""rossjax repro: the synthetic tasks, reviewer and graders (fast), and the routes quick run end
to end through the real command (slow), asserting the direction of its effect. PROPEL's quick
run is tests/test_repro_propel_quick.py's, ROSS's tests/test_repro_ross_sources.py's."""

import json
import os
import subprocess

import numpy as np
import pytest
from repro_quick import run_quick

from rossjax.curate import compile_rollout, fingerprint, load_tokenizer
from rossjax.repro import families, tasks

PAIRS = ((8, 7), (7, 4), (8, 2))


def test_grade_reads_recoveries_and_planted_errors():
    ok = tasks.grade(PAIRS, "a:8+7=5\nwait, a:8+7=15\nb:7+4=11\nc:8+2=10")
    assert ok["correct"] and ok["planted"] and ok["recovery"] and ok["wrong_step"]
    bad = tasks.grade(PAIRS, "a:8+7=15\nb:7+4=1\nc:8+2=10")
    assert not bad["correct"] and bad["planted"] and bad["pairs_correct"] == pytest.approx(2 / 3)
    assert not tasks.grade(PAIRS, "a:8+7=15\nb:7+4=11")["correct"]  # a pair left out
    assert not tasks.grade(PAIRS, "a:8+7=15\nb:7+4=11\nc:8+2=10\nhello")["correct"]
    clean = tasks.grade(PAIRS, tasks.clean_trace(PAIRS))
    assert clean["correct"] and not (clean["planted"] or clean["recovery"] or clean["wrong_step"])


def test_noisy_policy_reviewer_and_curate_mask_exclude_exactly_the_planted_lines(tmp_path):
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    tok = load_tokenizer(write_ascii_tokenizer(str(tmp_path / "tok")))
    rng = np.random.default_rng(0)
    seen = set()
    for i, p in enumerate(tasks.problem_split(3, [300], seed=1)[0]):
        text, planted, recovered, passed = tasks.noisy_trace(rng, p, 0.7, 0.8, 0.5)
        rec = tasks.rollout_record(i, p, text, planted, recovered, step=0, run="t")
        assert rec["verifier"]["passed"] == passed
        if not passed:
            assert "annotation" not in rec
            continue
        status = rec["annotation"]["status"]
        seen.add(status)
        ex = compile_rollout(rec, tok, template="chatml")
        if status == "drop":
            assert ex.reason == "annotation_drop"
            continue
        assert ex.status == "kept"
        # ASCII tokens are characters: the rendered text with unsupervised characters blanked.
        seen_text = "".join(tok.decode([t]) if m else "\0" * len(tok.decode([t]))
                            for t, m in zip(ex.input_ids.tolist(), ex.loss_mask.tolist()))
        pos = ex.text.index(text)
        for ln, line in enumerate(text.split("\n"), 1):
            got = seen_text[pos:pos + len(line) + 1]
            # A planted line and its line break are never supervised; every other line is,
            # character for character, with the break that ends it.
            want = line + "\n" if ln < len(text.split("\n")) else line + "<"
            assert got == ("\0" * len(want) if ln in planted else want)
            pos += len(line) + 1
    assert seen == {"accept", "revise", "drop"}


def test_route_families_are_recovered_and_fingerprinted_apart():
    texts = [families.trace(f, PAIRS) for f in families.FAMILIES]
    assert [families.family_of(t) for t in texts] == list(families.FAMILIES)
    assert all(families.correct(PAIRS, t) for t in texts)
    assert not families.correct(PAIRS, texts[0].replace("=15", "=5"))
    assert families.family_of("a:8+7=15\ncase b:7+4: 11\nc:8+2=10") is None  # mixed routes
    fps = np.asarray(fingerprint(texts, domain="math"))
    d = np.linalg.norm(fps[:, None] - fps[None], axis=-1)
    assert (d + np.eye(len(texts)) * 9 > 1.0).all()  # every pair of families is far apart


def test_stages_resume_and_refuse_a_run_of_other_sizes(tmp_path):
    from rossjax.errors import UsageError
    from rossjax.repro.stages import Stages

    calls = []
    st = Stages(str(tmp_path), key={"size": {"steps": 10}, "shape": (2, 3)})
    assert st.run("a", lambda: calls.append(1) or {"x": 1}) == {"x": 1}
    again = Stages(str(tmp_path), key={"size": {"steps": 10}, "shape": (2, 3)})
    assert again.run("a", lambda: calls.append(2) or {"x": 2}) == {"x": 1} and calls == [1]
    with pytest.raises(UsageError, match=r"other settings \(size: \{'steps': 10\} -> "):
        Stages(str(tmp_path), key={"size": {"steps": 20}, "shape": (2, 3)})


def test_repro_usage_errors():
    from rossjax.cli import main

    assert main(["repro", "nonsense", "--workdir", "/tmp/x"]) == 2
    assert main(["repro", "ross"]) == 2  # no --workdir


# The quick ROSS run (its direction, and the Continued and MOPD arms) is
# tests/test_repro_ross_sources.py's: one run of it in the suite.


@pytest.mark.slow
def test_repro_routes_quick_direction(tmp_path):
    # Not asserted here: diverse > random. At the quick size (1,500 / 300 rows, 100 steps; 150
    # before issue 46) the difference is inside the seed noise, as README's Evidence says; the
    # full run shows it.
    res, _ = run_quick("routes", tmp_path)
    s = res["summary"]
    assert s["similar"]["selected_families"]["mean"] < s["random"]["selected_families"]["mean"]
    assert s["similar"]["coverage"]["mean"] < s["random"]["coverage"]["mean"]


def test_probe_trains_on_fewer_rows_than_half_a_batch():
    # The repro propel run's probe sweep met this: 26 training rows, batch 64.
    from rossjax.probes import heads, metrics

    rng = np.random.default_rng(0)
    x = rng.normal(size=(26, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    probe = heads.train_probe(x, y, x, y, heads.TrainConfig(batch_size=64, max_epochs=3))
    scores = probe.score(x)
    assert scores.shape == (26,) and np.isfinite(scores).all()
    assert [h["epoch"] for h in probe.history] == [0, 1, 2]
    assert all(np.isfinite(h["loss"]) for h in probe.history)
    # it learned from the 26 rows (y = sign of x0), not from the padding copies alone
    assert metrics.balanced_accuracy(y, (scores >= 0.5).astype(int)) > 0.6


def _arm(**means):
    return {k: {"mean": v, "std": 0.0, "n": 1} for k, v in means.items()}


def test_claims_report_what_the_numbers_say():
    """Each experiment's claims turn false when the numbers they read say otherwise."""
    from rossjax.repro import propel, ross, routes

    base = _arm(utility=0.10, validity=0.60, distinct3=0.20, self_bleu3=0.95)
    good = {"base": base, "probe": _arm(utility=0.40, validity=0.62, distinct3=0.25, self_bleu3=0.90),
            "heuristic": _arm(utility=0.20, validity=0.55, distinct3=0.24, self_bleu3=0.91)}
    assert [c["holds"] for c in propel.claims({"summary": good})] == [True, True, True]
    for key, value in (("validity", 0.55), ("distinct3", 0.15), ("self_bleu3", 0.97)):
        worse = {**good, "probe": {**good["probe"], key: {"mean": value, "std": 0.0, "n": 1}}}
        assert [c["holds"] for c in propel.claims({"summary": worse})] == [True, True, False], key
    # with 3 seeds, a drop inside the arms' mean std is kept
    noisy = {**good, "probe": {**good["probe"], "validity": {"mean": 0.57, "std": 0.06, "n": 3}}}
    assert propel.claims({"summary": noisy})[2]["holds"]
    tie = {**good, "heuristic": _arm(utility=0.40, validity=0.6, distinct3=0.2, self_bleu3=0.9)}
    assert [c["holds"] for c in propel.claims({"summary": tie})][:2] == [True, False]

    def cov(d, r, s, fams=(6.0, 6.0, 1.0)):
        return {m: {"coverage": {"mean": c}, "families_produced": {"mean": f}}
                for m, c, f in zip(("diverse", "random", "similar"), (d, r, s), fams)}
    assert [c["holds"] for c in routes.claims({"summary": cov(2.2, 2.0, 1.0)})] == [True] * 3
    assert [c["holds"] for c in routes.claims({"summary": cov(1.9, 2.0, 1.0)})] == [False, True,
                                                                                    True]
    # the full run's 5.7 vs 6.0 families is reported, not hidden behind coverage
    fewer = routes.claims({"summary": cov(2.1, 2.0, 1.0, (5.7, 6.0, 1.0))})
    assert [c["holds"] for c in fewer] == [True, True, False]
    assert fewer[2]["evidence"] == "diverse 5.7, random 6.0, similar 1.0"

    def recipe(imitation, accuracy):
        return {"sampled_imitation": {"mean": imitation, "std": 0.0},
                "greedy_accuracy": {"mean": accuracy, "std": 0.0},
                "greedy_pairs_correct": {"mean": accuracy, "std": 0.0}}
    rs = {"ross": recipe(0.0, 0.95), "ross_no_mask": recipe(0.4, 0.95), "positive_sft": recipe(0.4, 0.9)}
    assert [c["holds"] for c in ross.claims({"summary": rs})] == [True, True]
    rs["positive_sft"] = recipe(0.4, 0.99)
    assert [c["holds"] for c in ross.claims({"summary": rs})] == [True, False]
    rs["ross_no_mask"] = recipe(0.0, 0.9)
    assert ross.claims({"summary": rs})[0]["holds"] is False


@pytest.mark.slow
def test_a_rerun_with_the_same_seed_gives_the_same_numbers(tmp_path):
    """The ROSS pipeline (rollouts -> curate -> train -> export -> greedy and sampled evaluation)
    twice from scratch in two folders with one seed: the same losses, bit-identical weights and
    the same graded completions. (Two `rossjax repro ross --quick` runs in fresh folders on one
    machine wrote the same summary; another CPU thread count or other code gives other numbers,
    as README's Evidence says.)"""
    from rossjax import cli
    from rossjax.repro import ross, stages, warmup

    stages.COMMAND = cli.main
    reserve = warmup.problems()[1]
    test_p, train_p = reserve[:16], reserve[16:16 + 200]
    tok_path, tok = stages.ascii_tokenizer(str(tmp_path / "tokenizer"))
    outs = []
    for run in ("a", "b"):
        root = tmp_path / run
        roll = str(root / "rollouts.jsonl")
        ross.make_rollouts(roll, train_p, 0, ross.POLICY, "repro-noisy-policy")
        kept = stages.curated_summary(stages.curate(roll, str(root / "curated"), tok_path))["kept"]
        init = stages.init_model(str(root / "init"), 0, **warmup.SHAPE)
        m = stages.train(str(root / "curated"), str(root / "run"), "ross", seed=0, steps=6,
                         init=init, rows=kept, **warmup.train_kw(finetune=False))
        ev = ross.evaluate(str(root / "run" / "hf"), tok, test_p, 2, seed=0)
        with open(root / "run" / "metrics.jsonl") as f:
            losses = [json.loads(x).get("loss") for x in f]
        with open(root / "run" / "hf" / "model.safetensors", "rb") as f:
            weights = f.read()
        outs.append((m["loss"], losses, weights, ev))
    (la, lsa, wa, eva), (lb, lsb, wb, evb) = outs
    assert lsa == lsb and la == lb and any(x is not None for x in lsa)
    assert wa == wb
    assert eva == evb and eva["sampled"]["length"] > 0


def test_report_names_the_code_and_threads_a_run_came_from(tmp_path):

    from rossjax.repro import _first_provenance
    from rossjax.repro.report import provenance_line

    p = _first_provenance(str(tmp_path))
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, cwd=os.path.dirname(__file__)).stdout.strip()
    assert p["commit"] == (head or None) and p["cpu_threads"] == len(os.sched_getaffinity(0))
    line = provenance_line(p)
    assert f"{p['cpu_threads']} CPU thread(s)" in line and "Resumed" not in line
    assert _first_provenance(str(tmp_path)) == p  # a resume with the same code: unchanged
    with open(tmp_path / "provenance.json", "w") as f:  # the run was started by other code
        json.dump({**p, "commit": "0123456789ab"}, f)
    again = _first_provenance(str(tmp_path))
    assert again["commit"] == "0123456789ab" and again["resumed_with"] == p
    assert provenance_line(again).startswith("Produced by rossjax 0123456789ab")
    assert f"Resumed with: rossjax {p['commit']}" in provenance_line(again)
