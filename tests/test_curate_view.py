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
