"""README's Evidence section says what the repros' report.md files say, in their words: each
experiment's table uses report.md's column and row names, every claim line (`- **shown**: ...`
or `- **NOT shown**: ...`) is the one the repro's own `claims()` writes from that table's numbers,
and a table whose full run's report is committed (docs/evidence/<name>.md) equals it cell for
cell, with every one of the report's claim lines and no other; README names which reports are
committed, so a table without one is never passed off as checked."""

from __future__ import annotations

import os
import re
import types

import numpy as np
import pytest

from rossjax.repro import EXPERIMENTS, propel, report, retrogen, ross, routes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
EVIDENCE = os.path.join(ROOT, "docs", "evidence")
# the bold lead of each experiment's paragraph in README's Evidence section
LEADS = {"ross": "**ROSS** —", "routes": "**Route-diverse selection** —", "propel": "**PROPEL** —",
         "retrogen": "**RetroGen** —"}
SEEDS = 3  # README's tables are from 3-seed full runs


def evidence_section() -> str:
    text = open(README, encoding="utf-8").read()
    start = text.index("\n## Evidence\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def readme_table(name: str) -> tuple[list[str], list[list[str]]]:
    sec = evidence_section()
    return report.read_table(sec[sec.index(LEADS[name]):].splitlines())


def _ms(cell: str) -> dict:
    """A `mean ± std` (or a bare mean) cell back into a {mean, std, n} summary."""
    m = re.fullmatch(r"(-?[\d.]+)(?: ± ([\d.]+))?", cell)
    assert m, cell
    return {"mean": float(m[1]), "std": float(m[2] or 0.0), "n": SEEDS if m[2] else 1}


def _columns(name: str) -> dict:
    headers, rows = readme_table(name)
    return {r[0]: dict(zip(headers, r)) for r in rows}


def claims_from_readme(name: str) -> list[str]:
    """The claim lines the repro's claims() writes from the numbers of README's table. ROSS's
    second claim reads the pairs-right column: where README leaves it out, only its first is
    recomputed."""
    cols = _columns(name)
    if name == "ross":
        key = {v: k for k, v in ross.NAMES.items()}
        pairs = "pairs right" if "pairs right" in readme_table(name)[0] else "accuracy"
        s = {key[r]: {"sampled_imitation": _ms(c["imitation T=1"]),
                      "greedy_accuracy": _ms(c["accuracy"]),
                      "greedy_pairs_correct": _ms(c[pairs])} for r, c in cols.items()}
        lines = [report.claim_line(c) for c in ross.claims({"summary": s})]
        return lines if pairs == "pairs right" else lines[:1]
    if name == "routes":
        s = {m: {"coverage": _ms(c["coverage@8"]), "families_produced": _ms(c["families produced"])}
             for m, c in cols.items() if m != "warm-up (start)"}
        return [report.claim_line(c) for c in routes.claims({"summary": s})]
    if name == "retrogen":  # rows without a trained model ("-") have no summary
        s = {a: {"evidence": _ms(c["evidence found"]), "right": _ms(c["answer right"])}
             for a, c in cols.items() if c["evidence found"] != "-"}
        return [report.claim_line(c) for c in retrogen.claims({"summary": s})]
    return [report.claim_line(c) for c in propel.claims(_propel_res(cols, readme_block(name)))]


# PROPEL's optional columns (older tables lack them): summary key per report column
PROPEL_EXTRA = {"top-family share": "top_share", "GRPO s": "grpo_seconds",
                "solver trials (RL)": "solver_trials"}


def _propel_res(cols: dict, text: str) -> dict:
    """propel.claims' input from a PROPEL table: every arm's row (the comparison arms' too),
    its optional columns where present ("-": an arm without a GRPO run), and the probe's one-off
    label cost from the prose of `text` ("labels cost N solver trials"), never a claim line."""
    key = {v: k for k, v in propel.names({}).items()}
    s = {}
    for a, c in cols.items():
        s[key[a]] = {"utility": _ms(c["utility"]), "validity": _ms(c["validity"]),
                     "self_bleu3": _ms(c["Self-BLEU-3"]), "distinct3": _ms(c["Distinct-3"])}
        s[key[a]].update({k: _ms(c[col].replace(",", "")) for col, k in PROPEL_EXTRA.items()
                          if c.get(col, "-") != "-"})
    prose = "\n".join(x for x in text.splitlines() if x not in claim_lines(text))
    m = re.search(r"labels\s+cost\s+([\d,]+)\s+solver\s+trials", prose)
    return {"summary": s, "pool_trials": int(m[1].replace(",", "")) if m else 0}


def readme_block(name: str) -> str:
    """README's Evidence paragraphs of one experiment: from its lead to the next one's."""
    sec = evidence_section()
    block = sec[sec.index(LEADS[name]):]
    nxt = [block.index(v, 1) for v in LEADS.values() if v in block[1:]]
    return block[:min(nxt)] if nxt else block


def claim_lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.startswith(("- **shown**", "- **NOT shown**"))]


def committed_reports() -> list[str]:
    """The experiments whose full-run report.md is committed as docs/evidence/<name>.md."""
    return [n for n in EXPERIMENTS if os.path.exists(os.path.join(EVIDENCE, f"{n}.md"))]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_evidence_claim_line_is_what_the_repro_writes_from_the_table(name):
    written = claim_lines(readme_block(name))
    want = claims_from_readme(name)
    assert all(c in written for c in want), (want, written)
    if len(want) > 1 or name != "ross":  # no claim line written by hand (ROSS's second is
        assert written == want           # report.md's alone where README has no pairs column)


def test_readme_names_the_committed_reports_and_their_tables_match():
    committed = committed_reports()
    # a sentence ends at a period followed by a space or the line's end ("ross.md" does not)
    m = re.search(r"Committed\s+reports:\s+(.+?)\.(?:\s|$)", evidence_section(), re.S)
    assert m, "README's Evidence section must say which reports are committed"
    named = [] if m[1].strip() == "none yet" else re.findall(r"docs/evidence/(\w+)\.md", m[1])
    assert named == committed
    # every experiment in README's Evidence has its last full run's report committed (a new
    # one, or a deleted report, leaves a README table unchecked)
    missing = [n for n in EXPERIMENTS if n not in committed]
    assert committed == list(EXPERIMENTS), f"no docs/evidence/<name>.md for {missing}"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_a_committed_report_is_a_full_run_and_readme_quotes_it_exactly(name):
    """Once docs/evidence/<name>.md is committed, README's table for <name> is its table cell for
    cell (a subset of its columns, every row in its order) and README's claim lines for <name>
    are the report's claim lines, all of them, in its order."""
    assert name in committed_reports(), f"docs/evidence/{name}.md is not committed"
    with open(os.path.join(EVIDENCE, f"{name}.md"), encoding="utf-8") as f:
        text = f.read()
    assert text.startswith(f"# rossjax repro {name} (full run, {SEEDS} seed(s))\n"), text[:80]
    assert "with local changes" not in text  # its numbers come from a named commit
    rep = report.read(text)
    assert rep["rows"] and rep["claims"], name
    assert report.table_differences(readme_table(name), rep) == [], name
    assert claim_lines(readme_block(name)) == rep["claims"], name


def test_report_md_round_trips_and_differences_are_named(tmp_path):
    mod = types.ModuleType("fake", "A fake experiment.\n\nMore.")
    mod.table = lambda res: (["arm", "score", "n"], [["a", "0.500 ± 0.010", 3], ["b", "0.4", 3]])
    mod.claims = lambda res: [{"claim": "a beats b", "holds": True, "evidence": "a 0.500, b 0.4"},
                              {"claim": "b beats a", "holds": False, "evidence": "same"}]
    mod.plot = lambda res, folder: []
    report.write(str(tmp_path), {"experiment": "fake", "seeds": 3}, mod, "rossjax repro fake")
    rep = report.read((tmp_path / "report.md").read_text())
    assert rep["headers"] == ["arm", "score", "n"]
    assert rep["rows"] == [["a", "0.500 ± 0.010", "3"], ["b", "0.4", "3"]]
    assert rep["claims"] == ["- **shown**: a beats b — a 0.500, b 0.4",
                             "- **NOT shown**: b beats a — same"]
    quoted = (["arm", "score"], [["a", "0.500 ± 0.010"], ["b", "0.4"]])
    assert report.table_differences(quoted, rep) == []  # a subset of the columns is fine
    assert report.table_differences((["arm", "score"], [["a", "0.510 ± 0.010"], ["b", "0.4"]]),
                                    rep) == ["a / score: 0.510 ± 0.010 where the report has "
                                             "0.500 ± 0.010"]
    assert report.table_differences((["arm", "score (higher)"], quoted[1]), rep) == [
        "column 'score (higher)' is not in the report"]
    assert report.table_differences((["arm"], [["a"], ["c"]]), rep)[0].startswith("rows ['a', 'c']")


def test_propel_claims_are_recomputed_from_a_full_runs_report(tmp_path):
    """claims_from_readme's PROPEL reading (every arm, the top-family share, GRPO s and solver
    trials columns, the label cost in the notes) gives back every claim line a full run's
    report.md writes, on a fake 3-seed run of all arms written by the repro's own report."""
    from rossjax.repro import propel_compare as cmp

    rng = np.random.default_rng(0)
    arms = (*propel.ARMS, *cmp.FULL)
    grpo = [a for a in arms if a not in ("base", *cmp.UNTRAINED)]
    runs = {a: [{"seed": s, "utility": rng.uniform(0.05, 0.4), "validity": rng.uniform(0.5, 0.8),
                 "self_bleu3": rng.uniform(0.85, 0.95), "distinct3": rng.uniform(0.2, 0.3),
                 "families": {"other": int(rng.integers(1, 60)), "mul": int(rng.integers(1, 30))},
                 **({"grpo_seconds": rng.uniform(100, 400),
                     "solver_trials": 2000 + s if a == "sil" else 0} if a in grpo else {})}
                for s in range(SEEDS)] for a in arms}
    summary = {a: {**{k: propel._ms([r[k] for r in rs]) for k in ("utility", "validity",
                                                                 "self_bleu3", "distinct3")},
                   **cmp.summary(rs)} for a, rs in runs.items()}
    pool = {"utility": 0.1, "validity": 0.7, "n": 500}
    res = {"experiment": "propel", "quick": False, "seeds": SEEDS, "size": propel.SIZES["full"],
           "solver": propel.SOLVER, "k": propel.K, "band": [propel.LO, propel.HI],
           "corpus_mix": {"mul": 3000}, "pool": pool, "pool_trials": cmp.pool_trials(pool, propel.K),
           "probe": {"layer": 1, "val_balanced_accuracy": 0.6, "val_balanced_accuracy_std": 0.01,
                     "note": ""}, "runs": runs, "summary": summary}
    report.write(str(tmp_path), res, propel, "rossjax repro propel")
    text = (tmp_path / "report.md").read_text()
    rep = report.read(text)
    assert len(rep["rows"]) == len(arms) and len(rep["claims"]) == 8, rep
    cols = {r[0]: dict(zip(rep["headers"], r)) for r in rep["rows"]}
    got = [report.claim_line(c) for c in propel.claims(_propel_res(cols, text))]
    assert got == rep["claims"]
