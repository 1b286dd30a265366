"""`rossjax swe-pool --config=configs/propel_swe.py:pool [--workdir=DIR] [--config.x=y]`: the base
generator's SWE bug pool (rossjax/train/propel/swe_pool.py): `episodes_per_repo` generator
episodes per repository, each final diff verified as a bug; writes episodes.jsonl, pool.jsonl (the
verified bugs, what `rossjax label-corpus --config=configs/propel_swe.py:label` reads) and
report.json (kept, invalid with reasons) into WORKDIR/swe_pool, and prints the label-corpus step."""

from __future__ import annotations


def main(argv=None) -> int:
    from rossjax.cli.flags import command_config, repo_config
    from rossjax.train.propel import swe_pool

    c, workdir, _ = command_config(list(argv or []), "swe-pool", "configs/propel_swe.py:pool",
                                   default_config=repo_config("propel_swe.py") + ":pool",
                                   needs_workdir=False)
    r = swe_pool.run(c, workdir)
    print(f"rossjax swe-pool: {r['episodes']} episodes over {len(r['repos'])} repositories "
          f"({r['generator']['kind']} generator), {r['kept']} verified bugs, "
          f"{len(r['invalid'])} invalid, {len(r['undecided'])} undecided "
          f"({r['seconds']} s) -> {r['output']}/pool.jsonl")
    for repo, n in r["per_repo"].items():
        print(f"  {repo}: {n['kept']} of {n['episodes']} kept")
    if r["reasons"]:
        print("  invalid by reason: " + ", ".join(f"{k} {v}" for k, v in r["reasons"].items()))
    for rid, why in list(r["invalid"].items())[:5]:
        print(f"  invalid {rid}: {why[:160]}")
    if len(r["invalid"]) > 5:
        print(f"  ... {len(r['invalid']) - 5} more in {r['output']}/report.json")
    if r["next"]:
        print(f"next: {r['next']}")
    else:
        print("  no verified bug: nothing for label-corpus to label")
    return 0
