"""`rossjax swe-eval --config=configs/propel_swe.py:eval [--workdir=DIR] [--config.x=y]`: PROPEL's
held-out SWE evaluation of a bug generator (rossjax/train/propel/swe_eval.py): bugs per eval-split
repository, K = 3 solver episodes per verified bug; realized utility, validity, top-edited-file
rate, Self-BLEU-3, Distinct-3 and the collapse shares in WORKDIR/swe_eval/report.json (+ bugs.jsonl),
summarized on stdout."""

from __future__ import annotations


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config, repo_config
    from rossjax.train.propel import swe_eval

    c, workdir, _ = command_config(list(argv or []), "swe-eval", "configs/propel_swe.py:eval",
                                   default_config=repo_config("propel_swe.py") + ":eval",
                                   needs_workdir=False)
    for line in swe_eval.run(c, workdir)["summary"]:
        print(line)
    return 0
