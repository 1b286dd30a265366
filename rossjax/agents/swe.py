"""PROPEL's SWE domain on the agent layer: the bug-writing generator's episode, K solver trials
over the buggy repository, utility label rows, and repo-disjoint splits.

    base = baseline("data/swe/textkit")                   # rossjax.verify.swe
    row, patch = write_bug(base, policy, rid="g0")        # a bash episode; verdict: verify_bug
    trials, rows = solver_trials(base, patch, policy, k=3)
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
policy endpoint failed) are null and count neither way.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile

from rossjax.agents.bash import BashEnv
from rossjax.agents.rollout import PolicyError, run_episode
from rossjax.errors import InputError
from rossjax.verify.repo import read_tree, unified_diff, write_tree
from rossjax.verify.swe import Baseline, apply_patch, check_fix, verify_bug
from rossjax.verify.verdict import Verdict

GENERATOR_PROMPT = (
    "You are in the repository {name}. Introduce one subtle bug into its source code so that "
    "at least one existing test fails while the test suite still runs. Edit only existing "
    "non-test .py files (never the tests or the configuration). You may run "
    "`python -m pytest -q`. Reply without a tool call when the bug is in place.")
SOLVER_PROMPT = (
    "The test suite of the repository {name} fails. Find and fix the bug in the source code "
    "without editing any test or configuration file; `python -m pytest -q` runs the suite. "
    "Reply without a tool call when the suite passes.")
SPLITS = ("probe", "rl", "eval")


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
    env = BashEnv(grader=grader, **episode.pop("env", {}))
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
                  suite_timeout_s: float = 30.0, **episode) -> tuple[list, list]:
    """K solver episodes over the buggy repository: ([True | False | None] * k, their rows).
    The patch is applied once; a patch that does not apply is refused (verify it first)."""
    if k < 1:
        raise InputError(f"solver trials: k must be >= 1, got {k}")
    buggy, why = apply_patch(base.files, patch)
    if buggy is None:
        raise InputError(f"solver trials for {rid}: {why}")
    env_kw = episode.pop("env", {})
    trials, rows = [], []
    with _tree(buggy) as src:
        for j in range(k):
            env = BashEnv(grader=lambda wd, t: check_fix(base, buggy, wd,
                                                         timeout_s=suite_timeout_s), **env_kw)
            task = {"id": f"{rid}/solve{j}", "prompt": SOLVER_PROMPT.format(name=base.name),
                    "repo": src}
            try:
                row = run_episode(env, task, policy, f"{rid}/solve{j}", **episode)
            except PolicyError as e:  # the endpoint failed: this trial cannot be judged
                trials.append(None)
                rows.append({"id": f"{rid}/solve{j}", "error": str(e)[:300]})
                continue
            finally:
                env.close()
            row["task"]["repo"] = base.name
            trials.append(row["verifier"]["passed"])
            rows.append(row)
    return trials, rows


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
