"""Smoke test of `rossjax bench curate` at tiny sizes (the real benchmark is not a test)."""

import numpy as np

from rossjax.bench.curate import main, peer_compile, synth_record
from rossjax.curate.masks import compile_rollout
from rossjax.tokenizers import load_tokenizer


def test_synthetic_rollouts_compile_like_the_peer():
    tok = load_tokenizer("qwen")
    for i in range(10):  # 6 keep-mode (reasoning + content anchors), 4 exclude-mode (tool calls)
        rec = synth_record(i, target_tokens=400)
        ex = compile_rollout(rec, tok)
        assert ex.status == "kept", ex.detail
        assert 0 < ex.n_supervised < ex.n_eligible
        np.testing.assert_array_equal(ex.loss_mask, peer_compile(rec, tok))


def test_bench_main_tiny(capsys):
    assert main(["--n", "8", "--tokens", "300", "--workers", "1", "--peer_n", "3",
                 "--verify_n", "0", "--code_n", "0"]) == 0
    out = capsys.readouterr().out
    assert "rollouts/s" in out and "identical masks: True" in out and "'kept': 8" in out
