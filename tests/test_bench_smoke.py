"""`rossjax bench model` and `rossjax bench sft` run end to end at tiny sizes (no timing asserted):
the benchmarks users run must not rot between the sessions that measure with them."""

import os
import re

import pytest

from rossjax.bench import model as bench_model, sft as bench_sft


def test_bench_model_smoke(capsys):
    assert bench_model.main(["--preset", "tiny_qwen2", "--batch", "2", "--seq", "32", "--steps", "1",
                             "--warmup", "1", "--matmul", "128"]) == 0
    out = capsys.readouterr().out
    assert "rossjax train step" in out and "torch   train step" in out
    # same weights, same batch: both sides start from the same loss
    ours = float(re.search(r"rossjax train step:.*\(loss ([\d.]+)", out).group(1))
    theirs = float(re.search(r"torch   train step:.*loss ([\d.]+)", out).group(1))
    assert ours == pytest.approx(theirs, abs=1e-3)


@pytest.mark.slow
def test_bench_sft_smoke(capsys):
    # two micro-batches: the peer must report the whole step's loss, not its last share
    assert bench_sft.main(["--rows", "2", "--seq", "64", "--micro", "2", "--steps", "1",
                           "--skip_memory"]) == 0
    out = capsys.readouterr().out
    assert "MFU vs matmul" in out and "tokens/s" in out
    # The peer did the same work: same initial parameters and rows give the same first loss.
    ours, theirs = map(float, re.search(r"rossjax ([\d.]+), torch ([\d.]+)", out).groups())
    assert ours == pytest.approx(theirs, rel=1e-4)
    assert "ratio rossjax / torch:" in out
    assert "settings: rossjax remat" in out and "sameness checks passed" in out
    assert re.search(r"work per token .*FLOPs [\d.]+x, bytes [\d.]+x", out)


def test_bench_grpo_update_smoke(capsys):
    from rossjax.bench import grpo as bench_grpo

    assert bench_grpo.main(["--part", "update", "--preset", "tiny_qwen2", "--contexts", "2",
                            "--group", "2", "--new_tokens", "8", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    # Same weights, same rows: the two updates start from the same loss and gradient norm.
    m = re.search(r"rossjax loss (\S+) grad-norm (\S+) .*\| torch loss (\S+) grad-norm (\S+)", out)
    ours_loss, ours_norm, torch_loss, torch_norm = map(float, m.groups())
    assert ours_loss == pytest.approx(torch_loss, abs=1e-5)
    assert ours_norm == pytest.approx(torch_norm, rel=1e-4)
    assert re.search(r"ratio [\d.]+x wall, [\d.]+x CPU time", out)
    assert re.search(r"work per update .*FLOPs [\d.]+x, bytes [\d.]+x", out)
    assert "sameness checks passed" in out


@pytest.mark.skipif(not os.environ.get("ROSSJAX_TUNIX_PYTHON"),
                    reason="tunix lives in its own environment: set ROSSJAX_TUNIX_PYTHON")
def test_bench_grpo_tunix_smoke(capsys):
    from rossjax.bench import grpo as bench_grpo

    assert bench_grpo.main(["--peer", "tunix", "--preset", "tiny_qwen2", "--contexts", "2",
                            "--group", "2", "--new_tokens", "8", "--steps", "2"]) == 0
    assert re.search(r"tunix GRPOLearner\s+[\d.]+ s/step.*tunix 0\.", capsys.readouterr().out)


def test_bench_all_rejects_unknown_rows():
    from rossjax.bench import all as bench_all
    from rossjax.errors import UsageError

    with pytest.raises(UsageError, match="--only nope is not one of"):
        bench_all.main(["--quick", "--only", "sft,nope"])
