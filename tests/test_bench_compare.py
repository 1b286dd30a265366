"""The benches' sameness checks and work counters (rossjax/bench/compare.py): pure functions,
so a mismatch is caught here without running a benchmark."""

import pytest

from rossjax.bench import compare


def test_close_passes_within_tolerance_and_names_a_mismatch():
    assert compare.close("first-step loss", 9.110655, 9.110656, rtol=1e-4) is None
    # the torch peer's old report: the last of 4 micro-batches' shares only
    msg = compare.close("first-step loss", 9.110655, 2.276527, rtol=1e-4)
    assert "first-step loss" in msg and "did not do the same work" in msg
    assert compare.close("loss", 0.0, 2e-6, rtol=0.0, atol=1e-5) is None
    assert compare.close("loss", 0.0, 2e-5, rtol=0.0, atol=1e-5)


def test_agreement_and_verdict(capsys):
    assert compare.at_least("greedy token agreement", 1.0, 0.95) is None
    bad = compare.at_least("greedy token agreement", 0.5, 0.95)
    assert "50.0%" in bad
    assert compare.verdict("bench x", [None, bad]) == 1
    assert "sameness check failed: greedy token agreement" in capsys.readouterr().err
    assert compare.verdict("bench x", [None]) == 0


def test_cpu_info_reads_model_and_flags(tmp_path, monkeypatch):
    from rossjax import hostheap

    monkeypatch.setattr(hostheap, "_applied", None)
    p = tmp_path / "cpuinfo"
    p.write_text("model name\t: Some EPYC\nflags\t\t: fpu sse avx2 fma avx512f\n"
                 "model name\t: Some EPYC\nflags\t\t: fpu\n")
    assert compare.cpu_info(str(p)) == ("Some EPYC", ["avx2", "fma", "avx512f"])
    assert compare.settings_line(a={"x": 1}, b={"y": "on"}) == (
        "settings: a x 1 | b y on | host heap default (both sides)")
    monkeypatch.setattr(hostheap, "_applied", "keep")
    assert compare.settings_line(peer_shares_heap=False, a={}, b={}).endswith(
        "| host heap keep (rossjax; the peer default)")


def test_work_counters_count_a_known_program():
    import jax
    import jax.numpy as jnp
    import torch

    x, w = jnp.ones((64, 128)), jnp.ones((128, 128))
    ours = compare.xla_work(jax.jit(lambda x, w: x @ w).lower(x, w).compile())
    assert ours["flops"] == pytest.approx(2 * 64 * 128 * 128, rel=0.01) and not ours["loops"]
    # a scan's body is counted once: flagged
    ws = jnp.ones((3, 128, 128))
    scan = jax.jit(lambda x, w: jax.lax.scan(lambda c, wi: (jnp.sin(c @ wi), None), x, w)[0])
    assert compare.xla_work(scan.lower(x, ws).compile())["loops"]

    q = torch.randn(2, 4, 16, 8, requires_grad=True)

    def step():
        o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        o.sum().backward()

    _, peer = compare.torch_work(step)
    # CPU attention counted: 2 matmuls forward, 4 backward, each 2 x b x h x s x s x d
    assert peer["flops"] == 6 * 2 * 2 * 4 * 16 * 16 * 8 and peer["bytes"] > 0
    line = compare.work_line("fwd", ours, {"flops": 2 * ours["flops"], "bytes": 1.0}, "torch")
    assert "FLOPs 2.00x" in line
