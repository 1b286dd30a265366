"""`rossjax review --config=configs/review.py --workdir=DIR`: annotate rollouts with a reviewer
LLM (rossjax.review.run), then print where the annotated rollouts are and how to curate them."""

from __future__ import annotations

import os

from rossjax.cli.flags import command_config, repo_config


def summary(report: dict, workdir: str) -> list[str]:
    b, r = report["buckets"], report["reasons"]
    why = ", ".join(f"{k} {n}" for k, n in sorted({**r["withheld"], **r["invalid"]}.items(),
                                                  key=lambda kv: -kv[1])[:4])
    q = report["requests"]
    outs = [os.path.join(workdir, o["path"]) for o in report["outputs"]]
    first = outs[0] if outs else ""
    return [
        f"rossjax review: {report['input_rows']} rows: {b['kept']} kept "
        f"({report['kept_by']['reviewed']} reviewed, {report['kept_by']['passed_through']} passed "
        f"through), {b['withheld']} withheld, {b['invalid']} invalid ({why or 'no reasons'})",
        f"reviewer {report['reviewer']['model']} at {report['reviewer']['url']}: "
        f"{q['requests']} HTTP requests ({q['retries']} retries), {q['cache_hits']} answers from "
        f"the cache, answers per row {report['attempts'] or '{}'}",
        "stages: " + ("; ".join(
            f"{name} {st['requests']} requests {st['prompt_tokens'] + st['completion_tokens']} "
            f"tokens" + (f" withheld {sum(st['withheld'].values())}" if st["withheld"] else "")
            for name, st in report.get("stages", {}).items()) or "none asked"),
        (f"annotated rollouts: {first}" + (f" (+{len(outs) - 1} more shards)" if len(outs) > 1
                                           else "")
         + f"; report {os.path.join(workdir, 'report.json')}; next: rossjax curate "
           f"--config=configs/curate.py --config.input={first} "
           f"--config.output={os.path.join(workdir, 'curated')}") if outs
        else f"no rows kept; report {os.path.join(workdir, 'report.json')}",
    ]


def classify(cfg, workdir: str) -> int:
    """`--config.classify=True`: label a sample of the excluded spans (rossjax.review.classify)."""
    from rossjax.review.classify import OUT_DIR, run as classify_run

    rep = classify_run(cfg, workdir)
    print(f"rossjax review --config.classify: {rep['rows']['read']} rows read, "
          f"{rep['rows'].get('with_excluded', 0)} with excluded content; "
          f"{rep['requests']['requests']} HTTP requests")
    for d, s in rep["domains"].items():
        top = ", ".join(f"{c} {n}" for c, n in sorted(s["counts"].items(), key=lambda kv: -kv[1])
                        if n)
        print(f"  {d}: {s['labelled']} of {s['sampled']} sampled spans labelled "
              f"({s['spans_total']} excluded spans in {s['rows_with_excluded']} rows): {top or '-'}")
    print(f"report {os.path.join(workdir, OUT_DIR, 'report.json')}")
    return 0


def main(argv=None) -> int:
    import sys

    from rossjax.review.run import check_kept, nothing_asked, run

    cfg, workdir, _ = command_config(list(argv or []), "review", "configs/review.py",
                                     default_config=repo_config("review.py"))
    if cfg.get("classify"):
        return classify(cfg, workdir)
    report = run(cfg, workdir)
    for line in summary(report, workdir):
        print(line)
    if nothing_asked(report) and report["buckets"]["kept"]:  # kept none: check_kept says it
        print(f"rossjax review: {nothing_asked(report)}", file=sys.stderr)
    check_kept(report, cfg, workdir)  # kept nothing: one sentence why, exit 2
    return 0
