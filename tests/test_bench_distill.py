"""`rossjax bench distill --peer trl` (rossjax/bench/distill.py) end to end at the tiniest size:
both sides run, the ratio and both sides' settings are printed, and the asserted sameness check
(first-step loss and gradient norm of rossjax's update loss against GKDTrainer's compute_loss on
the same parameters and rows) holds. TRL lives in its own environment (a benchmark extra): the
test runs where $ROSSJAX_TRL_PYTHON (or this python) has trl and datasets, and skips otherwise."""

import re

import pytest

from rossjax.bench import distill as bench_distill

TRL = bench_distill.trl_python()
needs_trl = pytest.mark.skipif(TRL is None, reason="TRL's environment is absent: set "
                               "ROSSJAX_TRL_PYTHON to a python with trl and datasets")
TINY = ["--preset", "tiny_qwen2", "--contexts", "2", "--group", "2", "--new_tokens", "8",
        "--steps", "2", "--check_rows", "2"]


# 17 s wall with a warm compile cache, ~50 s cold on a loaded 2-core box (34 s CPU): rossjax's
# trainer compiles its three programs (~15 s) and the TRL child imports torch + trl (~8 s), so
# it can pass the 20 s mark: slow. It costs nothing where TRL's environment is absent (the CI
# default: trl is no rossjax dependency).
@pytest.mark.slow
@needs_trl
def test_bench_distill_trl_smoke(capsys):
    assert bench_distill.main(TINY) == 0
    out = capsys.readouterr().out
    assert re.search(r"rossjax distill\s+[\d.]+ s/step", out)
    assert re.search(r"TRL GKDTrainer\s+[\d.]+ s/step.*trl \d", out)
    assert re.search(r"ratio [\d.]+x \(TRL s/step / rossjax s/step", out)
    assert "settings: rossjax remat none, micro-batches 1" in out and "| TRL gradient" in out
    m = re.search(r"rossjax (\S+), TRL (\S+); gradient norm rossjax (\S+), TRL (\S+) ", out)
    loss, peer_loss, norm, peer_norm = map(float, m.groups())
    assert loss == pytest.approx(peer_loss, rel=1e-4) and loss > 1e-4  # the models differ
    assert norm == pytest.approx(peer_norm, rel=1e-4) and norm > 1e-4
    assert "sameness checks passed" in out


def test_bench_distill_without_trl_says_how(monkeypatch, tmp_path):
    from rossjax.errors import UsageError

    monkeypatch.setattr(bench_distill, "trl_python", lambda given="": None)
    with pytest.raises(UsageError, match="needs TRL .*--trl_python"):
        bench_distill.main(TINY)
