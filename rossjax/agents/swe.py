"""PROPEL's SWE domain on the agent layer: the bug-writing generator's episode, K solver trials
over the buggy repository, utility label rows, and repo-disjoint splits.

    base = baseline("data/swe/textkit")                   # rossjax.verify.swe
    row, patch = write_bug(base, policy, rid="g0")        # a bash episode; verdict: verify_bug
    trials, rows = solver_trials(base, patch, policy, k=3)
    [(trials, rows), ...] = solver_trials_many([(base, patch, "g0"), ...], policy, workers=2)
    label = label_row("g0", base, trials)                 # {"id", "trials", "group": repo}

Every episode is the `bash` environment over a scratch copy (the clean repository for the
generator, the clean one with the bug applied for a solver). The generator's patch is the
unified diff from the clean tree to its final scratch copy; a solver trial passes when its final
copy passes the clean suite without touching a test (verify.swe.check_fix). Both verdicts run
the clean tests under pytest in the sandbox's checker process with the episode's package behind
proxies (verify.swe.run_suite), so nothing an episode writes into the package can forge them;
the agent's own `python -m pytest` inside its shell is for its information only. Label rows are read
by rossjax.probes.labels.read_label_file; U_S for K = 3 is the open band (0 < solved < 3),
`utility_labels(..., band="open")`. Trials that could not be judged (the sandbox failed, the
policy endpoint failed) are null and count neither way. Solver episodes run `workers` at a
time in threads (the sandbox does the work in its own processes; a thread mostly waits on the
endpoint or on them), each with its own env and scratch copy, results in trial order.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import shutil
import tempfile

from rossjax.agents import env as env_lib
from rossjax.agents.bash import BashEnv
from rossjax.agents.rollout import PolicyError, run_episode
from rossjax.agents.swe_tools import IndexedBashEnv
from rossjax.errors import InputError
from rossjax.verify.repo import read_tree, unified_diff, write_tree
from rossjax.verify.swe import Baseline, apply_patch, check_fix, verify_bug
from rossjax.verify.verdict import Verdict

# PROPEL's SWE generator prompt (App. 18), in rossjax's words: the task, what makes a bug hard
# but fair (the hardness guidance), the rules a valid bug keeps, the tools (the shell and
# browse_index) and the turn format (a THOUGHT, then exactly one ```bash block; no block = done).
GENERATOR_PROMPT = """\
You are a software engineer at the root of the Python repository {name}, in a shell. Your job \
is to plant one bug in its source code that a capable engineer, given only the failing tests, \
would need real effort to locate and fix.

## What a good bug looks like
- Subtle and plausible: an honest mistake a developer could make and a reviewer could miss, \
e.g. an off-by-one or boundary slip, a wrong comparison or operator, a swapped argument, a \
wrong default, a missing or wrong case in a branch, a value updated in the wrong order.
- Small: a few lines in one place (or two closely related places), in code the tests exercise.
- Hard to spot: nothing in the change or its failures should point at the faulty line. No \
comment, name or message that hints at it; no raise, assert or exit added; no function or \
file emptied; no syntax error, import error or crash when the package loads.
- Fair: at least one existing test must now fail, while the rest of the suite still runs; a \
bug that breaks every test at once is too easy to find.

## Rules
- Change only existing non-test .py files. Never edit, add, delete or rename a test file, a \
conftest.py, pyproject.toml or any other configuration, and add or delete no file.
- The suite must still be collected and finish: no hang, no collection error.

## Tools
- `browse_index` (or `browse_index PATH`) lists the repository's modules, each function, class \
and method with its line range, and the tests that use it: a quick map of where tests bite.
- Any other shell command: read files (cat, sed -n, grep), edit them (sed -i, python), and run \
the suite with `python -m pytest -q` to check that your bug fails at least one test.

## Format of every reply
THOUGHT: your reasoning for this step.
Then exactly one fenced ```bash block holding one command; it runs and you see its output in \
the next turn. A reply with two or more blocks runs nothing. Each command runs in a fresh \
shell at the repository root (a cd does not persist). When the bug is in place and you have \
seen a test fail, reply with a THOUGHT and no bash block: that ends the episode.
"""
SOLVER_PROMPT = (
    "The test suite of the repository {name} fails. Find and fix the bug in the source code "
    "without editing any test or configuration file; `python -m pytest -q` runs the suite. "
    "Reply without a tool call when the suite passes.")
SPLITS = ("probe", "rl", "eval")
# Episodes at once at most: timed_step runs every tool step on this pool (agents/env.py), and a
# step waiting for a thread spends its own time limit.
MAX_WORKERS = env_lib._POOL._max_workers


class _BugGrader:
    """The generator's verdict: its final copy as a diff against the clean tree, verified."""

    def __init__(self, base: Baseline, timeout_s: float):
        self.base, self.timeout_s, self.patch = base, timeout_s, None

    def __call__(self, workdir: str, task: dict) -> Verdict:
        try:
            after = read_tree(workdir)
        except InputError as e:
            return Verdict(False, f"forbidden_change: {str(e).split(': ', 1)[-1]}")
        self.patch = unified_diff(self.base.files, after)
        if not self.patch:
            return Verdict(False, "no_change: the patch changes no file")
        return verify_bug(self.base, self.patch, timeout_s=self.timeout_s)


def write_bug(base: Baseline, policy, rid: str, *, suite_timeout_s: float = 30.0,
              **episode) -> tuple[dict, str | None]:
    """One generator episode: (its rollout row, with `patch` added; the patch or None)."""
    grader = _BugGrader(base, suite_timeout_s)
    env = IndexedBashEnv(grader=grader, **episode.pop("env", {}))
    with _tree(base.files) as src:
        task = {"id": rid, "prompt": GENERATOR_PROMPT.format(name=base.name), "repo": src}
        try:
            row = run_episode(env, task, policy, rid, **episode)
        finally:
            env.close()
    row["patch"] = grader.patch
    row["task"]["repo"] = base.name
    row["verifier"]["name"] = "swe"  # re-verifiable from the row: verify.get("swe")(row)
    return row, grader.patch


def solver_trials(base: Baseline, patch: str, policy, *, k: int = 3, rid: str = "task",
                  suite_timeout_s: float = 30.0, workers: int = 1, **episode) -> tuple[list, list]:
    """K solver episodes over the buggy repository: ([True | False | None] * k, their rows).
    The patch is applied once; a patch that does not apply is refused (verify it first).
    `workers` > 1 runs that many episodes at once (see solver_trials_many)."""
    return solver_trials_many([(base, patch, rid)], policy, k=k, suite_timeout_s=suite_timeout_s,
                              workers=workers, **episode)[0]


def solver_trials_many(tasks, policy, *, k: int = 3, suite_timeout_s: float = 30.0,
                       workers: int = 1, **episode) -> list[tuple[list, list]]:
    """`solver_trials` for each (base, patch, rid) of `tasks`: [(trials, rows)] in task order,
    trials in trial order. All len(tasks) * k episodes share one pool of `workers` threads
    (1: one after the other, task by task, as a loop would). Each episode has its own env and
    scratch copy; the buggy tree an episode copies from is written once per task and only read.
    With workers > 1 `policy` is called from several threads at once, so it must be
    thread-safe (OpenAIPolicy is: one connection per thread). A trial whose endpoint failed is
    None with an `error` row; any other raise propagates (in trial order) once the running
    episodes end, and those not started never start. Every patch is applied before any episode
    starts."""
    if k < 1:
        raise InputError(f"solver trials: k must be >= 1, got {k}")
    if isinstance(workers, bool) or not isinstance(workers, int) or not (
            1 <= workers <= MAX_WORKERS):
        raise InputError(f"solver trials: workers must be an integer from 1 to {MAX_WORKERS} "
                         f"(agents/env.py steps tools on {MAX_WORKERS} threads; more episodes at "
                         f"once would spend their step limits waiting), got {workers!r}")
    buggies = []
    for base, patch, rid in tasks:
        buggy, why = apply_patch(base.files, patch)
        if buggy is None:
            raise InputError(f"solver trials for {rid}: {why}")
        buggies.append(buggy)
    env_kw = episode.pop("env", {})
    with contextlib.ExitStack() as stack:
        srcs = [stack.enter_context(_tree(b)) for b in buggies]
        jobs = [(i, j) for i in range(len(buggies)) for j in range(k)]

        def trial(i: int, j: int):
            base, _, rid = tasks[i]
            return _solver_trial(base, buggies[i], srcs[i], policy, f"{rid}/solve{j}",
                                 suite_timeout_s, env_kw, episode)

        if workers == 1 or len(jobs) <= 1:
            done = [trial(i, j) for i, j in jobs]
        else:
            with cf.ThreadPoolExecutor(min(workers, len(jobs)),
                                       thread_name_prefix="rossjax-solver") as pool:
                futs = [pool.submit(trial, i, j) for i, j in jobs]
                try:
                    done = [f.result() for f in futs]  # the first raise, in trial order
                except BaseException:
                    for f in futs:
                        f.cancel()  # the ones not started; running episodes end by their limits
                    raise
    out = [([], []) for _ in buggies]
    for (i, _), (passed, row) in zip(jobs, done):
        out[i][0].append(passed)
        out[i][1].append(row)
    return out


def _solver_trial(base: Baseline, buggy: dict, src: str, policy, tid: str,
                  suite_timeout_s: float, env_kw: dict, episode: dict) -> tuple:
    """One solver episode in its own env (its own scratch copy of `src`): (passed, row)."""
    env = BashEnv(grader=lambda wd, t: check_fix(base, buggy, wd, timeout_s=suite_timeout_s),
                  **env_kw)
    task = {"id": tid, "prompt": SOLVER_PROMPT.format(name=base.name), "repo": src}
    try:
        row = run_episode(env, task, policy, tid, **episode)
    except PolicyError as e:  # the endpoint failed: this trial cannot be judged
        return None, {"id": tid, "error": str(e)[:300]}
    finally:
        env.close()
    row["task"]["repo"] = base.name
    return row["verifier"]["passed"], row


def label_row(task_id: str, base: Baseline, trials: list) -> dict:
    """A row of a label file (probes.labels.read_label_file); `group` is the repository, so
    grouped folds and the splits below never put one repository on two sides."""
    return {"id": task_id, "trials": list(trials), "group": base.name}


def repo_splits(repos, fractions=(0.6, 0.2, 0.2), seed: int = 0) -> dict[str, str]:
    """{repo: "probe" | "rl" | "eval"}: whole repositories per split (a repository's tasks never
    sit on two sides), ordered by a seeded hash, sizes by `fractions` rounded with each split of
    nonzero fraction given at least one repository."""
    repos = sorted(set(repos))
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not sum(fractions) > 0:
        raise InputError(f"repo_splits: fractions must be 3 non-negative numbers for "
                         f"{SPLITS}, got {fractions!r}")
    want = [f > 0 for f in fractions]
    if len(repos) < sum(want):
        raise InputError(f"repo_splits: {len(repos)} repositories cannot fill "
                         f"{sum(want)} disjoint splits")
    order = sorted(repos, key=lambda r: hashlib.sha256(f"{seed}:{r}".encode()).hexdigest())
    total = sum(fractions)
    sizes = [max(int(w), round(len(repos) * f / total)) for w, f in zip(want, fractions)]
    while sum(sizes) > len(repos):  # shrink the largest that can spare one
        i = max((i for i in range(3) if sizes[i] > int(want[i])), key=lambda i: sizes[i])
        sizes[i] -= 1
    sizes[max(range(3), key=lambda i: fractions[i])] += len(repos) - sum(sizes)
    out, at = {}, 0
    for name, n in zip(SPLITS, sizes):
        out.update({r: name for r in order[at:at + n]})
        at += n
    return out


def split_rows(rows: list[dict], assignment: dict[str, str], where: str = "rows") -> dict:
    """{split: rows} by each row's `group` (its repository); a row of an unassigned repository
    is refused with its index."""
    out = {s: [] for s in SPLITS}
    for i, row in enumerate(rows):
        g = row.get("group") if isinstance(row, dict) else None
        if g not in assignment:
            raise InputError(f"{where} row {i + 1}: group {g!r} is not a repository of the "
                             "splits")
        out[assignment[g]].append(row)
    return out


class _tree:
    """A temporary directory holding `files`, the source of an episode's scratch copies."""

    def __init__(self, files: dict):
        self.files, self.tmp = files, None

    def __enter__(self) -> str:
        self.tmp = tempfile.mkdtemp(prefix="rossjax-swe-src-")
        write_tree(self.files, self.tmp + "/repo")
        return self.tmp + "/repo"

    def __exit__(self, *exc):
        shutil.rmtree(self.tmp, ignore_errors=True)
