"""Probe splits never put copies of one task on both sides (issue 39 item 3): math and azr's
80/10/10 is drawn over whole groups, and label-corpus groups rows by their canonical task text."""

import ml_collections
import numpy as np
import pytest

from rossjax.probes import sweep
from rossjax.train.propel.label_corpus import task_group


def _cfg(domain, split=""):
    return ml_collections.ConfigDict({"domain": domain, "split": split, "split_seed": 0,
                                      "folds": 5, "fold": -1, "seeds": (0,)})


@pytest.mark.parametrize("domain", ["azr", "math"])
def test_domain_split_keeps_duplicates_on_one_side(domain):
    # 60 tasks, most written 2-6 times (a generator repeats itself)
    rng = np.random.default_rng(3)
    groups = [f"t{i}" for i in range(60) for _ in range(int(rng.integers(1, 7)))]
    c = _cfg(domain)
    assert sweep.split_kind(c) == "group_random" and "grouped 80/10/10" in sweep.split_description(c)
    tr, va, te = sweep._split(c, len(groups), groups, 0)
    sides = [{groups[i] for i in part} for part in (tr, va, te)]
    assert not sides[0] & sides[1] and not sides[0] & sides[2] and not sides[1] & sides[2]
    assert len(tr) + len(va) + len(te) == len(groups)
    assert abs(len(tr) / len(groups) - 0.8) < 0.06 and len(va) and len(te)
    # the paper's row-level split, asked for by name, does put copies on both sides here
    r = sweep._split(_cfg(domain, "random"), len(groups), groups, 0)
    assert {groups[i] for i in r[0]} & {groups[i] for i in r[2]}


def test_one_row_per_group_has_the_random_split_sizes():
    tr, va, te = sweep.group_random_split([f"r{i}" for i in range(80)], seed=1)
    assert (len(tr), len(va), len(te)) == (64, 8, 8)
    with pytest.raises(ValueError, match="at least 3 groups"):
        sweep.group_random_split(["a", "a", "b"])
    with pytest.raises(ValueError, match="empty"):
        sweep.group_random_split(["big"] * 50 + ["a", "b"], seed=0)


def test_label_corpus_groups_by_canonical_task_text():
    t = {"program": "def f(x):\n    return x + 1", "inputs": ["1", "2"], "message": "add one"}
    spaced = {**t, "program": "def f(x):\n    return x + 1\n\n", "message": "add  one"}
    other = {**t, "program": "def f(x):\n    return x + 2"}
    assert task_group(t, "") == task_group(spaced, "") != task_group(other, "")
    assert task_group({"problem": "What is 2+2?"}, "", "math") == task_group(
        {"problem": " What is 2+2? "}, "", "math")
    assert task_group(None, "garbled text") == task_group(None, "garbled   text")
