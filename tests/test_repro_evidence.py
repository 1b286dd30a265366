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

import pytest

from rossjax.repro import EXPERIMENTS, propel, report, ross, routes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
EVIDENCE = os.path.join(ROOT, "docs", "evidence")
# the bold lead of each experiment's paragraph in README's Evidence section
LEADS = {"ross": "**ROSS** —", "routes": "**Route-diverse selection** —", "propel": "**PROPEL** —"}
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
    key = {v: k for k, v in propel.NAMES.items()}
    s = {key[a]: {"utility": _ms(c["utility"]), "validity": _ms(c["validity"]),
                  "self_bleu3": _ms(c["Self-BLEU-3"]), "distinct3": _ms(c["Distinct-3"])}
         for a, c in cols.items()}
    return [report.claim_line(c) for c in propel.claims({"summary": s})]


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
