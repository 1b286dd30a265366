"""Target exclusion rate as defined: token-weighted over response content (content, reasoning,
tool calls), the end-of-turn marker excluded; overall and per RL step of origin."""

import copy

import numpy as np
import pytest

from rossjax.curate.ledger import Report
from rossjax.curate.masks import compile_rollout
from rossjax.templates import render_chat
from rossjax.tokenizers import load_tokenizer

QWEN = load_tokenizer("qwen")

ROW = {
    "id": "m1", "task": {"id": "t1", "domain": "math"}, "source": {"run": "rl", "step": 3},
    "verifier": {"name": "math", "passed": True},
    "messages": [
        {"role": "user", "content": "What is 3*4?"},
        {"role": "assistant", "reasoning": "Hmm, 3+4=7? No.\nActually 3*4 = 12.",
         "content": "The answer is \\boxed{12}."}],
    "annotation": {"status": "accept",
                   "keep": [{"message": 1, "start": "Actually", "end": "\\boxed{12}."}]},
}


def _by_hand(row):
    """(content tokens, unsupervised content tokens) by plain loops over characters."""
    ex = compile_rollout(row, QWEN)
    r = render_chat(row["messages"], "chatml", QWEN)
    content_chars = set()
    for p in r.parts:
        if p.eligible and p.kind != "end":
            content_chars.update(range(p.start, p.end))
    ids, starts, ends = QWEN.encode_arrays(r.text)
    content = [any(c in content_chars for c in range(s, e)) for s, e in zip(starts, ends)]
    excluded = sum(1 for t, c in enumerate(content) if c and not ex.loss_mask[t])
    return ex, sum(content), excluded


def test_ter_is_over_response_content_without_the_end_marker():
    ex, content, excluded = _by_hand(ROW)
    assert (ex.n_content, ex.n_excluded_content) == (content, excluded)
    assert 0 < excluded < content < ex.n_eligible  # the marker is eligible but not content
    rep = Report()
    rep.add("kept", example=ex)
    assert rep.ter == pytest.approx(excluded / content)
    # the eligible-token rate (end marker counted, and supervised after a kept span) differs
    assert rep.ter != pytest.approx(ex.n_excluded_eligible / ex.n_eligible)
    # token-weighted over rows: a second, fully kept row changes the rate by its token count
    full = copy.deepcopy(ROW)
    full["annotation"] = {"status": "accept"}
    ex2 = compile_rollout(full, QWEN)
    rep.add("kept", example=ex2)
    assert ex2.n_excluded_content == 0
    assert rep.ter == pytest.approx(excluded / (content + ex2.n_content))


def test_ter_by_rl_step_of_origin_and_merge():
    rows, hand = [], []
    for step, keep in ((1, True), (1, False), (2, True), (7, False)):
        r = copy.deepcopy(ROW)
        r["source"]["step"] = step
        if not keep:
            r["annotation"] = {"status": "accept"}
        rows.append(compile_rollout(r, QWEN))
        hand.append(_by_hand(r)[1:])  # (content, excluded) counted by plain loops
    a, b = Report(), Report()
    for i, ex in enumerate(rows):
        (a if i % 2 else b).add("kept", example=ex)
    rep = b.merge(a).to_dict()
    by = rep["ter_by_step"]
    assert list(by) == ["1", "2", "7"]
    c1 = hand[0][0] + hand[1][0]
    assert by["1"] == {"content": c1, "excluded": hand[0][1] + hand[1][1],
                       "ter": pytest.approx((hand[0][1] + hand[1][1]) / c1)}
    assert by["2"] == {"content": hand[2][0], "excluded": hand[2][1],
                       "ter": pytest.approx(hand[2][1] / hand[2][0])}
    assert by["7"]["ter"] == 0.0 and by["2"]["ter"] > 0
    total = sum(e for _, e in hand) / sum(c for c, _ in hand)
    assert rep["ter"] == pytest.approx(total, rel=1e-12)
    # rows without a step of origin: no per-step table
    r = copy.deepcopy(ROW)
    r.pop("source")
    plain = Report()
    plain.add("kept", example=compile_rollout(r, QWEN))
    assert plain.to_dict()["ter_by_step"] == {} and plain.ter > 0


def test_eligible_mode_excludes_nothing():
    ex = compile_rollout(ROW, QWEN, mask_mode="eligible")
    assert ex.n_excluded_content == 0 and np.array_equal(ex.loss_mask, ex.eligible_mask)
