"""SWE solver trials in a bounded pool of threads (rossjax/agents/swe.py solver_trials_many):
the same trials and rows as one after another, in trial order; an endpoint failure is that
trial's None alone; the episodes really overlap, each over its own scratch copy."""

import json
import os
import threading
import time

import pytest
from review_server import Reviewer
from test_swe import DATA, FIX, bug_patch

from rossjax.agents import swe as aswe
from rossjax.agents.rollout import OpenAIPolicy, PolicyError
from rossjax.errors import InputError
from rossjax.verify import repo as rrepo, swe


@pytest.fixture(scope="module")
def tasks():
    """Two repositories with one bug each: textkit's the policy below fixes, intervals' not."""
    text = swe.baseline(os.path.join(DATA, "textkit"))
    iv = swe.baseline(os.path.join(DATA, "intervals"))
    files = dict(iv.files)
    files["intervals/ops.py"] = files["intervals/ops.py"].replace(
        "start <= out[-1][1]", "start < out[-1][1]")
    assert files != iv.files
    return [(text, bug_patch(text), "t0"), (iv, rrepo.unified_diff(iv.files, files), "t1")]


def _turn(messages) -> int:
    return sum(m["role"] == "assistant" for m in messages)


def _call(cmd: str, n: int) -> dict:
    return {"content": "", "tool_calls": [{"id": f"c{n}", "function": {
        "name": "bash", "arguments": json.dumps({"command": cmd})}}]}


def by_prompt(messages, tools):
    """Stateless, so any interleaving of episodes gives each the same turns: on textkit it
    runs the fix then answers, on intervals it lists a file then answers (no fix)."""
    prompt, turn = messages[1]["content"], _turn(messages)
    if turn == 0:
        return _call(FIX if "textkit" in prompt else "ls intervals", 1)
    return {"content": "done", "tool_calls": []}


def test_the_pool_gives_the_sequential_trials_and_rows(tasks):
    seq = aswe.solver_trials_many(tasks, by_prompt, k=2, workers=1, env={"step_timeout_s": 20})
    par = aswe.solver_trials_many(tasks, by_prompt, k=2, workers=3, env={"step_timeout_s": 20})
    assert [t for t, _ in seq] == [[True, True], [False, False]], seq
    assert par == seq  # trials and whole rows, task order and trial order
    assert [r["id"] for _, rows in par for r in rows] == [
        "t0/solve0", "t0/solve1", "t1/solve0", "t1/solve1"]
    assert par[1][1][0]["verifier"]["evidence"].startswith("tests_fail:")
    one = aswe.solver_trials(*tasks[0][:2], by_prompt, k=2, rid="t0", workers=2,
                             env={"step_timeout_s": 20})
    assert one == seq[0]


class FailsOnce:
    """The endpoint fails on the first request of all (whichever episode sends it)."""

    def __init__(self):
        self.lock, self.failed = threading.Lock(), False

    def __call__(self, messages, tools):
        with self.lock:
            first, self.failed = not self.failed, True
        if first:
            raise PolicyError("policy endpoint answered HTTP 503: b'busy'")
        return {"content": "done", "tool_calls": []}


def test_an_endpoint_failure_is_that_trials_none_only(tasks):
    trials, rows = aswe.solver_trials(*tasks[0][:2], FailsOnce(), k=3, rid="t0", workers=3)
    assert trials.count(None) == 1 and trials.count(False) == 2, trials
    bad = trials.index(None)
    assert rows[bad] == {"id": f"t0/solve{bad}",
                         "error": "policy endpoint answered HTTP 503: b'busy'"}
    assert [r["id"] for r in rows] == ["t0/solve0", "t0/solve1", "t0/solve2"]
    assert all(r["verifier"]["evidence"].startswith("tests_fail:")
               for j, r in enumerate(rows) if j != bad)
    seq, _ = aswe.solver_trials(*tasks[0][:2], FailsOnce(), k=2, rid="t0", workers=1)
    assert seq == [None, False]  # one after another: the first trial is the one that failed


def test_a_raise_other_than_the_endpoints_propagates(tasks):
    def broken(messages, tools):
        raise RuntimeError("policy bug")

    with pytest.raises(RuntimeError, match="policy bug"):
        aswe.solver_trials(*tasks[0][:2], broken, k=2, rid="t0", workers=2)


def test_trials_overlap_each_over_its_own_scratch_copy(tasks, monkeypatch):
    """A policy that sleeps 0.6 s on its first turn: three trials on three workers sleep at
    the same time; the grader of each sees a different scratch directory."""
    spans, dirs, lock = [], [], threading.Lock()
    fix = aswe.check_fix

    def spy(base, buggy, wd, **kw):
        with lock:
            dirs.append(wd)
        return fix(base, buggy, wd, **kw)

    def sleepy(messages, tools):
        t0 = time.monotonic()
        time.sleep(0.6)
        with lock:
            spans.append((t0, time.monotonic()))
        return {"content": "done", "tool_calls": []}

    monkeypatch.setattr(aswe, "check_fix", spy)
    trials, _ = aswe.solver_trials(*tasks[0][:2], sleepy, k=3, rid="t0", workers=3)
    assert trials == [False, False, False]
    assert max(s for s, _ in spans) < min(e for _, e in spans), spans  # all three at once
    assert len(set(dirs)) == 3 and not any(d.startswith(os.path.dirname(e) + os.sep)
                                           for d in dirs for e in dirs if d != e), dirs


@pytest.mark.parametrize("workers", [0, -1, aswe.MAX_WORKERS + 1, True, 2.0, "2"])
def test_bad_worker_counts_are_refused(tasks, workers):
    with pytest.raises(InputError, match="workers must be an integer from 1 to"):
        aswe.solver_trials(*tasks[0][:2], by_prompt, k=2, workers=workers)


def test_one_openai_policy_serves_concurrent_trials(tasks):
    """OpenAIPolicy keeps one connection per thread: three trials at once over one policy
    reach a slow endpoint on three kept-alive connections, and their requests overlap."""
    spans, lock = [], threading.Lock()

    def slow(body):
        t0 = time.monotonic()
        time.sleep(0.4)
        with lock:
            spans.append((t0, time.monotonic()))
        return "done"

    with Reviewer(default=lambda rid, body: slow) as srv:
        policy = OpenAIPolicy(srv.url, "m")
        trials, rows = aswe.solver_trials(*tasks[0][:2], policy, k=3, rid="t0", workers=3)
    assert trials == [False, False, False], rows
    assert len(srv.ports) == 3, srv.ports
    assert max(t0 for t0, _ in spans) < min(t1 for _, t1 in spans), spans
