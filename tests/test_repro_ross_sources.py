"""`rossjax repro ross`: the reviewer of a model's own rollouts, the sources' claims (fast), and
the quick run end to end (slow): ROSS's direction, and the Continued and MOPD arms each trained,
evaluated and their claims stated."""

import json

import numpy as np
import pytest
from repro_quick import run_quick

from rossjax.repro import ross, ross_sources, tasks

PAIRS = ((8, 7), (7, 4), (8, 2))


def test_review_text_finds_the_errors_the_noisy_policy_planted():
    # On the noisy policy's traces the reviewer that reads only the text agrees with the one
    # that knows where the errors were planted.
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(300):
        p = tasks.problem(rng, 3)
        text, planted, recovered, ok = tasks.noisy_trace(rng, p, 0.7, 0.6, 0.5)
        got = ross_sources.review_text(p, text)
        assert got == tasks.review(text, planted, recovered), text
        seen.add(got["status"])
    assert seen == {"accept", "revise", "drop"}
    # errors a model makes that the policy never planted: a wrong sum that is not a lost carry,
    # a recovery that is wrong again, a line of no known form
    assert ross_sources.review_text(PAIRS, "a:8+7=14\nwait, a:8+7=15\nb:7+4=11\nc:8+2=10")[
        "status"] == "revise"
    assert ross_sources.review_text(PAIRS, "a:8+7=5\nwait, a:8+7=16\nb:7+4=11")["status"] == "drop"
    assert ross_sources.review_text(PAIRS, "a:8+7=15\nok\nb:7+4=11")["status"] == "drop"


def test_reward_is_the_verifier_and_tasks_route_by_family(tmp_path):
    prompt = tasks.prompt_text(PAIRS)
    assert ross_sources.pairs_of(prompt) == PAIRS
    assert ross_sources.reward(prompt, "a:8+7=5\nwait, a:8+7=15\nb:7+4=11\nc:8+2=10", {}) == 1.0
    assert ross_sources.reward(prompt, "a:8+7=5\nb:7+4=11\nc:8+2=10", {}) == 0.0
    path = ross_sources.write_tasks(str(tmp_path / "t.jsonl"), [PAIRS, ((1, 2), (3, 4))])
    rows = [json.loads(x) for x in open(path)]
    assert [r["family"] for r in rows] == ["carry", "plain"]
    assert rows[0]["prompt"] == prompt and rows[0]["reference"] == "15 11 10"


def _arm(imitation, acc, std=0.0):
    m = lambda v: {"mean": v, "std": std, "n": 3}  # noqa: E731
    return {"sampled_imitation": m(imitation), "greedy_accuracy": m(acc),
            "greedy_pairs_correct": m(acc)}


def test_sources_claims_follow_the_numbers_and_need_both_arms():
    base = {"ross": _arm(0.0, 0.99), "ross_no_mask": _arm(0.4, 0.98), "positive_sft": _arm(0.4, 0.97)}
    assert len(ross.claims({"summary": base})) == 2  # README without the new rows: as before
    s = {**base, "ross_upstream": _arm(0.1, 0.98), "continued_rl": _arm(0.3, 0.99, 0.02),
         "mopd": _arm(0.2, 0.9), "ross_mopd": _arm(0.05, 0.9), "continued_mopd": _arm(0.05, 0.95)}
    c = ross.claims({"summary": s})
    assert [x["holds"] for x in c] == [True, True, True, True, False, False]
    assert c[2]["evidence"] == "upstream + ROSS 0.100, Continued RL 0.300 (upstream: positive SFT 0.400)"
    assert c[4]["claim"].startswith("MOPD source: ROSS relearning imitates")
    # accuracy within the mean std is "at least as accurate"; beyond it, not
    s["continued_rl"] = _arm(0.3, 0.985, 0.01)
    assert ross.claims({"summary": s})[3]["holds"] is True
    s["continued_rl"] = _arm(0.3, 1.0, 0.01)
    assert ross.claims({"summary": s})[3]["holds"] is False
    del s["continued_mopd"]
    assert len(ross.claims({"summary": s})) == 4
    # a run whose MOPD history had no row to relearn: both MOPD claims NOT shown, saying why
    s["continued_mopd"] = _arm(0.05, 0.95)
    del s["ross_mopd"]
    c = ross.claims({"summary": s})
    assert len(c) == 6 and [x["holds"] for x in c[4:]] == [False, False]
    assert all("not trained" in x["evidence"] for x in c[4:])
    assert c[4]["claim"].startswith("MOPD source: ROSS relearning imitates")


@pytest.mark.slow
def test_repro_ross_quick_direction_and_sources(tmp_path):
    res, stdout = run_quick("ross", tmp_path)
    s = res["summary"]
    assert "ROSS w/o mask" in stdout
    # The curated dirs differ exactly as the recipes say.
    c = res["curated"]
    assert c["ross"]["kept"] == c["ross_no_mask"]["kept"] < c["positive_sft"]["kept"]
    assert c["ross"]["ter"] > 0 and c["ross_no_mask"]["ter"] == 0
    # The effect: ROSS imitates the planted error least, and is at least as accurate (one seed:
    # no std to allow for).
    for other in ("ross_no_mask", "positive_sft"):
        assert s["ross"]["sampled_imitation"]["mean"] < s[other]["sampled_imitation"]["mean"]
        for k in ("greedy_accuracy", "greedy_pairs_correct"):
            assert s["ross"][k]["mean"] >= s[other][k]["mean"], (k, other)
    # The sources: every arm trained its steps and was evaluated on the held-out problems.
    z, runs = res["sources"], res["runs"]
    for a in ross_sources.ARMS:
        (r,) = runs[a]
        assert 0.0 <= r["greedy"]["accuracy"] <= 1.0 and r["sampled"]["length"] > 0, a
    assert runs["continued_rl"][0]["reward_mean"] is not None
    assert runs["mopd"][0]["kl"] is not None and runs["continued_mopd"][0]["kl"] is not None
    wd = tmp_path / "ross" / "sources" / "s0"
    steps = {"ross_upstream": z["extra"], "continued_rl": z["extra"], "mopd": z["mopd_steps"],
             "ross_mopd": z["extra"], "continued_mopd": z["mopd_steps"] + z["extra"]}
    for a, n in steps.items():
        last = [json.loads(x) for x in open(wd / a / "metrics.jsonl")][-1]
        assert last["step"] == n, (a, last)
    # MOPD's history carries the teachers' log-probs; ROSS relearned it with a mask
    row = json.loads(open(wd / "mopd" / "history.jsonl").readline())
    assert len(row["teacher_logprobs"]) == len(row["logprobs"]) and row["teacher"] in (
        "carry", "plain")
    assert c["ross_mopd_s0"]["kept"] > 0
    hist = res["sources_info"]["mopd_history"][0]
    assert hist["rows"] == z["mopd_steps"] * z["contexts"] * z["group"]
    # Every claim, the sources' four too, is stated shown or NOT shown.
    lines = [x for x in stdout.splitlines() if x.strip().startswith(("shown:", "NOT shown:"))]
    assert len(lines) == 6 and sum("source:" in x for x in lines) == 4, stdout
    report = (tmp_path / "ross" / "report.md").read_text()
    assert "Continued MOPD" in report and "ross_sources.png" in report
    # A rerun reuses every finished stage.
    res2, _ = run_quick("ross", tmp_path)
    assert res2["summary"] == s
