"""`rossjax swe-repos --candidates=FOLDER [--workdir=DIR] [--config.repos.x=y]`: PROPEL's four-stage
repository filter (exclusions, preflight, tests-per-entity ranking, yield) over every subfolder
of FOLDER (rossjax/agents/swe_repos.py; settings: configs/propel_swe.py:repos). Writes
report.json (per stage what it kept and dropped, a reason per repository), report.txt and, with
at least 3 repositories kept, splits.json and rl_tasks.jsonl (the RL split's generator tasks)
into WORKDIR/swe_repos (./swe_repos without --workdir)."""

from __future__ import annotations

import json
import os


def _flags(fv):
    from absl import flags

    flags.DEFINE_string("candidates", None, "Folder whose subfolders are candidate repositories.",
                        flag_values=fv)


def main(argv=None) -> int:
    from rossjax.agents import swe_repos
    from rossjax.cli.flags import command_config, repo_config
    from rossjax.errors import UsageError

    c, workdir, fv = command_config(list(argv or []), "swe-repos", "configs/propel_swe.py:repos",
                                    default_config=repo_config("propel_swe.py") + ":repos",
                                    needs_workdir=False, extra_flags=_flags)
    if not fv.candidates:
        raise UsageError("rossjax swe-repos needs --candidates=FOLDER (a folder of repositories).")
    out = c.output or os.path.join(workdir or ".", "swe_repos")
    report = swe_repos.filter_repos(fv.candidates, c.repos)
    os.makedirs(out, exist_ok=True)
    text = swe_repos.render(report)
    kept = report["selected"]
    if len(kept) >= 3:
        from rossjax.agents.swe import repo_splits
        from rossjax.agents.swe_env import rl_tasks

        paths = [report["repos"][n]["path"] for n in kept]
        report["splits"] = repo_splits(paths, tuple(c.fractions), c.split_seed)
        with open(os.path.join(out, "splits.json"), "w") as f:
            json.dump(report["splits"], f, indent=1)
        with open(os.path.join(out, "rl_tasks.jsonl"), "w") as f:
            for t in rl_tasks(paths, tuple(c.fractions), c.split_seed):
                f.write(json.dumps(t) + "\n")
        report["next"] = (f"rossjax grpo --config=configs/propel_swe.py:runlocal "
                          f"--config.data.tasks={os.path.join(out, 'rl_tasks.jsonl')} "
                          f"--workdir={os.path.join(out, 'grpo_runlocal')}")
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, "report.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    print(f"rossjax swe-repos: {len(kept)} of {report['candidates']} kept -> {out}/report.json")
    if "next" in report:
        print(f"next: {report['next']}")
    else:
        print("  (fewer than 3 kept: no probe / RL / eval split is written)")
    return 0
