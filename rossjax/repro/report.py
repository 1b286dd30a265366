"""results.json, report.md, PNG plots and the one-screen summary of a repro experiment.

Each experiment module provides `table(results) -> (headers, rows)`, `claims(results) -> [{claim,
holds, evidence}]` and `plot(results, folder) -> [png names]`; this module only lays them out.
A claim that does not hold is reported as such, with its numbers.
"""

from __future__ import annotations

import json
import os

import numpy as np


def summary(values) -> dict:
    """{mean, std (ddof 1; 0 for one value), n} of a list of per-seed numbers."""
    v = np.asarray(values, np.float64)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
            "n": int(len(v))}


def ms(x: dict, digits: int = 3) -> str:
    """'mean ± std' of a {mean, std, n} summary."""
    if x["n"] > 1:
        return f"{x['mean']:.{digits}f} ± {x['std']:.{digits}f}"
    return f"{x['mean']:.{digits}f}"


def markdown_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def text_table(headers, rows) -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "  ".join(c.ljust(w[i]) for i, c in enumerate(r))  # noqa: E731
    return "\n".join([line(cells[0]), "  ".join("-" * x for x in w)] + [line(r) for r in cells[1:]])


def write(folder: str, results: dict, module, command: str) -> str:
    """Write results.json, the plots and report.md; return the one-screen summary text."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "results.json.tmp"), "w") as f:
        json.dump(results, f, indent=1, default=float)
    os.replace(os.path.join(folder, "results.json.tmp"), os.path.join(folder, "results.json"))
    headers, rows = module.table(results)
    claims = module.claims(results)
    pngs = module.plot(results, folder)
    size = "quick" if results.get("quick") else "full"
    md = [f"# rossjax repro {results['experiment']} ({size} run, {results['seeds']} seed(s))", "",
          module.__doc__.strip().split("\n\n")[0], "", f"Regenerate: `{command}`", "",
          *([provenance_line(results["provenance"]), ""] if results.get("provenance") else []),
          markdown_table(headers, rows), "", "## Claims", ""]
    md += [claim_line(c) for c in claims]
    md += ["", "## Plots", ""] + [f"![{p}]({p})" for p in pngs]
    notes = module.notes(results) if hasattr(module, "notes") else []
    if notes:
        md += ["", "## Setup and notes", ""] + [f"- {n}" for n in notes]
    with open(os.path.join(folder, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    summary = [f"rossjax repro {results['experiment']} ({size}, {results['seeds']} seed(s)):",
               text_table(headers, rows)]
    summary += [f"  {'shown' if c['holds'] else 'NOT shown'}: {c['claim']} ({c['evidence']})"
                for c in claims]
    summary.append(f"  report: {os.path.join(folder, 'report.md')}")
    return "\n".join(summary)


def claim_line(c: dict) -> str:
    """A claim as report.md states it; README's Evidence quotes these lines verbatim."""
    return f"- **{'shown' if c['holds'] else 'NOT shown'}**: {c['claim']} — {c['evidence']}"


def read_table(lines) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the first markdown table in `lines` (cells stripped)."""
    cells = []
    for line in lines:
        if line.startswith("|"):
            cells.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif cells:
            break
    if not cells:
        return [], []
    return cells[0], [r for r in cells[2:]]


def read(md: str) -> dict:
    """The table and claim lines of a report.md (what README's Evidence must agree with)."""
    lines = md.splitlines()
    headers, rows = read_table(lines)
    return {"headers": headers, "rows": rows,
            "claims": [x for x in lines if x.startswith(("- **shown**", "- **NOT shown**"))]}


def table_differences(shown: tuple, report: dict) -> list[str]:
    """How a table (headers, rows) quoted from a report differs from it: every header must be
    one of the report's, the rows the report's in order, each quoted cell equal."""
    headers, rows = shown
    out = [f"column {h!r} is not in the report" for h in headers if h not in report["headers"]]
    if out:
        return out
    if [r[0] for r in rows] != [r[0] for r in report["rows"]]:
        return [f"rows {[r[0] for r in rows]} are not the report's {[r[0] for r in report['rows']]}"]
    col = [report["headers"].index(h) for h in headers]
    for r, want in zip(rows, report["rows"]):
        out += [f"{r[0]} / {h}: {v} where the report has {want[j]}"
                for h, v, j in zip(headers, r, col) if v != want[j]]
    return out


def provenance_line(p: dict) -> str:
    """One sentence: the code, jax and CPU threads a run's numbers came from (a rerun with the
    same ones and the same seeds gives the same numbers)."""
    code = f"rossjax {p.get('commit') or '(no git checkout)'}" + (
        " with local changes" if p.get("local_changes") else "")
    line = (f"Produced by {code}, jax {p.get('jax')} (jaxlib {p.get('jaxlib')}), "
            f"{p.get('devices')} device(s), {p.get('cpu_threads')} CPU thread(s)"
            + (f", XLA_FLAGS={p['xla_flags']}" if p.get("xla_flags") else "") + ".")
    if p.get("resumed_with"):
        line += " Resumed with: " + provenance_line(p["resumed_with"])[len("Produced by "):]
    return line


def bars(ax, names, summaries, title: str, ylabel: str = ""):
    """One bar per arm with its std as the error bar."""
    means = [s["mean"] for s in summaries]
    stds = [s["std"] for s in summaries]
    colors = ["#2b6cb0", "#dd6b20", "#718096", "#38a169", "#805ad5"][:len(names)]
    ax.bar(range(len(names)), means, yerr=stds, capsize=4, color=colors)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=15, fontsize=8)
    ax.set_title(title, fontsize=9)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(axis="y", labelsize=8)


def figure(n: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3.0))
    return fig, list(axes) if n > 1 else [axes]


def save(fig, folder: str, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(os.path.join(folder, name), dpi=90)
    plt.close(fig)
    return name
