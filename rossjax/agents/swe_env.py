"""`rossjax grpo`'s SWE generator environment: the bash env over a repository of the RL split,
judged as rossjax.agents.swe.write_bug judges an episode (configs/propel_swe.py).

    env = make_env("rossjax.agents.swe_env:SweBugEnv")
    env.reset({"id": "swe-intervals", "repo": "intervals", "prompt": ...})

A task names a repository (a folder, or one shipped in data/swe/: rossjax.verify.swe.repo_dir).
Its clean baseline (the suite's outcomes on the clean tree) is computed once per repository and
process, as every candidate of every step is judged against the same one. When the policy
answers without a tool call, the final scratch copy is diffed against the clean tree and
verified with verify.swe.verify_bug (applies, tests unchanged, suite runs, >= 1 clean-passing
test fails); `browse_index [PATH]` answers with the copy's entity index
(agents/swe_tools.py); the patch rides on the verdict (BugVerdict.patch: the env runs in a worker
process) to the run's history row and the SIL solver. `rl_tasks` writes the task rows of the RL split (repo-disjoint: agents.swe.repo_splits).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rossjax.agents.swe import GENERATOR_PROMPT, repo_splits
from rossjax.agents.swe_tools import IndexedBashEnv
from rossjax.errors import InputError
from rossjax.verify.repo import RepoError, read_tree, unified_diff
from rossjax.verify.swe import Baseline, baseline, repo_dir, verify_bug
from rossjax.verify.verdict import Verdict

_BASELINES: dict[tuple, Baseline] = {}  # (resolved folder, timeout) -> clean baseline


def clean_baseline(repo: str, timeout_s: float = 30.0) -> Baseline:
    """The repository's clean baseline, computed once per process."""
    path = os.path.realpath(repo_dir(repo))
    key = (path, float(timeout_s))
    if key not in _BASELINES:
        _BASELINES[key] = baseline(path, timeout_s=timeout_s)
    return _BASELINES[key]


class BugVerdict(Verdict):
    """The generator's verdict with its patch (`patch`: the diff, or None), so the patch reaches
    the run's history row and the SIL solver from the env's worker process (it pickles)."""


def with_patch(v: Verdict, patch: str | None) -> BugVerdict:
    out = BugVerdict(*v)
    out.patch = patch
    return out


@dataclass
class SweBugEnv(IndexedBashEnv):
    name: str = "swe_bug"
    suite_timeout_s: float = 30.0

    def reset(self, task: dict) -> list[dict]:
        if not isinstance(task, dict) or not isinstance(task.get("repo"), str):
            raise InputError(f"swe task {task.get('id', '') if isinstance(task, dict) else ''!r}: "
                             f"field 'repo' must name a repository, got {task!r:.120}")
        self.base = clean_baseline(task["repo"], self.suite_timeout_s)
        self.patch = None
        prompt = task.get("prompt") or GENERATOR_PROMPT.format(name=self.base.name)
        return super().reset({**task, "prompt": prompt, "repo": repo_dir(task["repo"])})

    def finish(self, final_text: str) -> Verdict:
        try:
            after = read_tree(self.workdir)
        except (InputError, RepoError) as e:
            return with_patch(Verdict(False, f"forbidden_change: {str(e).split(': ', 1)[-1]}"),
                              None)
        self.patch = unified_diff(self.base.files, after) or None
        if not self.patch:
            return with_patch(Verdict(False, "no_change: the patch changes no file"), None)
        return with_patch(verify_bug(self.base, self.patch, timeout_s=self.suite_timeout_s),
                          self.patch)


def rl_tasks(repos, fractions=(0.6, 0.2, 0.2), seed: int = 0, split: str = "rl") -> list[dict]:
    """One generator task per repository of `split` (agents.swe.repo_splits over `repos`)."""
    assignment = repo_splits(repos, fractions, seed)
    name = {r: os.path.basename(repo_dir(r).rstrip("/")) for r in assignment}
    return [{"id": f"swe-{name[r]}", "repo": r, "domain": "swe",
             "prompt": GENERATOR_PROMPT.format(name=name[r])}
            for r in sorted(assignment) if assignment[r] == split]
