"""`rossjax inspect`: HTML and terminal views draw supervised, excluded and context tokens apart."""

import os

import numpy as np

from rossjax.cli.inspect import main
from rossjax.curate.masks import compile_rollout
from rossjax.curate.schema import iter_records
from rossjax.curate.view import render_html, render_terminal, token_classes, token_texts
from rossjax.tokenizers import load_tokenizer

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "data", "rollouts", "sample.jsonl")


def test_views_on_a_dict_example():
    tok = load_tokenizer("tekken")
    text = "ok 😀 <b>"
    ids = tok.encode(text)
    n = len(ids)
    ex = {"id": "x", "input_ids": np.array(ids, np.int32),
          "eligible_mask": np.array([0] + [1] * (n - 1), np.uint8),
          "loss_mask": np.array([0] + [1] * (n - 2) + [0], np.uint8), "provenance": {"run": "r"}}
    assert "".join(token_texts(ex, tok)) == text  # split emoji bytes are shown once, whole
    cls = token_classes(ex)
    assert cls[0] == "context" and cls[-1] == "excluded" and cls[1] == "supervised"
    page = render_html(ex, tok)
    assert page.count('class="tok ') == n and "&gt;" in page and "<b>" not in page and "😀" in page
    assert 'class="tok excluded"' in page and 'class="tok context"' in page
    plain = render_terminal(ex, tok, color=False)
    assert "[+" in plain and "[-" in plain and "TER" in plain
    assert "\x1b[1;32m" in render_terminal(ex, tok, color=True)


def test_inspect_main_on_rollout_file(tmp_path, capsys):
    out = tmp_path / "v.html"
    assert main([SAMPLE, "--id", "code-fib-s23-r0", "--out", str(out), "--no-color"]) == 0
    page = out.read_text(encoding="utf-8")
    term = capsys.readouterr().out
    assert "[-rm -rf /tmp/work-]" in term and "excluded" in page
    rec = next(r.record for r in iter_records(SAMPLE) if r.record and r.record["id"] == "code-fib-s23-r0")
    ex = compile_rollout(rec, load_tokenizer("qwen"))
    assert page.count('class="tok supervised"') == ex.n_supervised
    assert page.count('class="tok excluded"') == ex.n_excluded_eligible


def test_inspect_list_names_every_id_and_what_became_of_it(tmp_path, capsys):
    """`rossjax inspect DIR --list` (through the dispatcher): every input row of a curated dir,
    kept ones with their token counts, withheld and invalid ones with their reason; on a rollout
    file, each row's turns and verdict; without --id or --list, one sentence."""
    import json

    from rossjax import cli
    from rossjax.resources import config_path

    out = tmp_path / "c"
    assert cli.main(["curate", f"--config={config_path('curate.py')}", f"--config.input={SAMPLE}",
                     f"--config.output={out}", "--config.progress=False",
                     "--config.verify_workers=0"]) == 0
    capsys.readouterr()
    assert cli.main(["inspect", str(out), "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rep = json.load(open(out / "report.json"))
    b = rep["buckets"]
    assert lines[-1] == f"{b['kept']} kept, {b['withheld']} withheld, {b['invalid']} invalid"
    assert len(lines) - 1 == rep["input_rows"]
    kept = [x for x in lines if x.startswith("kept ")]
    assert len(kept) == b["kept"] and "supervised" in kept[0]
    assert any(x.startswith("withheld") and "verifier_failed" in x for x in lines)

    assert cli.main(["inspect", SAMPLE, "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("code-fib-s23-r0" in x and "turns" in x for x in lines)
    assert lines[-1].startswith("27 record, 3 invalid")
    assert cli.main(["inspect", str(out)]) == 2
    assert "give --id ID (one example) or --list" in capsys.readouterr().err
