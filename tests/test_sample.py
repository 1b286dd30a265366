"""KV-cache generation: greedy == transformers generate, logprobs == teacher-forced forward,
seeded sampling is reproducible, sharded == single device, stop tokens and filters."""

import jax
import numpy as np
import pytest
import torch
from hf_tiny import make_tiny_hf

from rossjax import sharding
from rossjax.models import forward, load_hf
from rossjax.sample import _filter_logits, generate

N_NEW = 10


def _make(family, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"sample_{family}")
    model = make_tiny_hf(family, path, seed=3)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    cfg, params = load_hf(path)
    rng = np.random.RandomState(0)
    prompts = [rng.randint(0, cfg.vocab_size, n).tolist() for n in (5, 17, 2)]
    return model, cfg, params, prompts


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "llama"])
def family(request, tmp_path_factory):
    return _make(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _make("qwen2", tmp_path_factory)


def _teacher_forced(cfg, params, prompts, new, temperature=1.0):
    """Log-probs of each row's generated tokens under logits / temperature, from one
    right-padded full forward pass."""
    rows = [list(p) + list(n) for p, n in zip(prompts, new)]
    width = max(map(len, rows))
    toks = np.zeros((len(rows), width), np.int32)
    seg = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        toks[i, :len(r)], seg[i, :len(r)] = r, 1
    logits = forward(cfg, params, toks, segment_ids=seg)[0] / temperature
    lp = np.asarray(jax.nn.log_softmax(logits, -1))
    return np.stack([lp[i, np.arange(len(p) - 1, len(p) - 1 + len(n)), np.asarray(n)]
                     for i, (p, n) in enumerate(zip(prompts, new))])


def test_greedy_matches_transformers_and_logprobs_match_forward(family):
    model, cfg, params, prompts = family
    res = generate(cfg, params, prompts, N_NEW)
    assert res.tokens.shape == (3, N_NEW) and res.finish_reason == ["length"] * 3
    for i, p in enumerate(prompts):
        with torch.no_grad():  # one prompt at a time, unpadded: no HF padding conventions involved
            ref = model.generate(torch.tensor([p]), max_new_tokens=N_NEW, do_sample=False)
        assert res.tokens[i].tolist() == ref[0, len(p):].tolist(), f"prompt {i}"
    np.testing.assert_allclose(res.logprobs, _teacher_forced(cfg, params, prompts, res.tokens),
                               atol=1e-4, rtol=0)


def test_sampling_is_seeded_and_logprobs_are_at_the_temperature(tiny):
    _, cfg, params, prompts = tiny
    kw = dict(temperature=1.3, top_k=50, top_p=0.95, num_samples=4)
    a = generate(cfg, params, prompts, N_NEW, seed=7, **kw)
    b = generate(cfg, params, prompts, N_NEW, seed=7, **kw)
    c = generate(cfg, params, prompts, N_NEW, seed=8, **kw)
    assert a.tokens.shape == (12, N_NEW)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert not np.array_equal(a.tokens, c.tokens)
    # copies of one prompt diverge (they share the prefill, not the random draws)
    assert len({tuple(r) for r in a.tokens[:4].tolist()}) > 1
    # the sampler's log-probs are those of logits / T (what GRPO's trainer scores), not T = 1
    rows = [p for p in prompts for _ in range(4)]
    np.testing.assert_allclose(a.logprobs, _teacher_forced(cfg, params, rows, a.tokens, 1.3),
                               atol=1e-4, rtol=0)
    assert np.abs(a.logprobs - _teacher_forced(cfg, params, rows, a.tokens)).max() > 1e-2


def test_stop_tokens_end_rows_and_filters_reduce_to_greedy(tiny):
    _, cfg, params, prompts = tiny
    greedy = generate(cfg, params, prompts, N_NEW)
    stop = int(greedy.tokens[0, 3])
    first = [int(np.argmax(r == stop)) if (r == stop).any() else None for r in greedy.tokens]
    res = generate(cfg, params, prompts, N_NEW, stop_ids=(stop,))
    for i in range(3):
        if first[i] is None:
            assert res.lengths[i] == N_NEW and res.finish_reason[i] == "length"
            continue
        n = first[i] + 1
        assert res.lengths[i] == n and res.finish_reason[i] == "stop"
        assert res.tokens[i, :n].tolist() == greedy.tokens[i, :n].tolist()
        assert (res.tokens[i, n:] == 0).all() and (res.logprobs[i, n:] == 0).all()
    # top_k=1 and a vanishing top_p both leave only the argmax
    for kw in (dict(top_k=1), dict(top_p=1e-6)):
        s = generate(cfg, params, prompts, N_NEW, temperature=0.8, seed=1, **kw)
        np.testing.assert_array_equal(s.tokens, greedy.tokens)


def test_filter_logits_reference():
    logits = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]], np.float32))
    out = np.asarray(_filter_logits(logits, 1.0, 0, 0.7))   # 0.5 + 0.2 reaches 0.7
    assert np.isfinite(out[0, :2]).all() and (out[0, 2:] < -1e30).all()
    out = np.asarray(_filter_logits(logits, 1.0, 3, 1.0))
    assert (out[0, :3] > -1e30).all() and (out[0, 3:] < -1e30).all()


@pytest.mark.slow
def test_sharded_equals_single_device(tiny):
    model, cfg, params, prompts = tiny
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    for kw in (dict(), dict(temperature=1.0, num_samples=4, seed=7)):
        one = generate(cfg, params, prompts, N_NEW, **kw)
        many = generate(cfg, params, prompts, N_NEW, mesh=mesh, **kw)
        np.testing.assert_array_equal(one.tokens, many.tokens)
        np.testing.assert_allclose(one.logprobs, many.logprobs, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(one.lengths, many.lengths)


def test_bad_prompts():
    from rossjax.models import get_preset
    cfg, params = get_preset("tiny_qwen2"), None  # rejected before any params are touched
    with pytest.raises(ValueError, match="row 1 is empty"):
        generate(cfg, params, [[1, 2], []], 4)
    with pytest.raises(ValueError, match="outside"):
        generate(cfg, params, [[1, 999]], 4)


def test_bench_sample_smoke(capsys):
    """The benchmark runs end to end at a tiny size (no timing asserted): both sides generate the
    same greedy tokens and the floor line is printed."""
    from rossjax.bench.sample import main

    assert main(["--preset", "tiny_qwen2", "--batch", "2", "--prompt_len", "8",
                 "--new_tokens", "4", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "greedy tokens agree on 100.0%" in out and "weight-streaming floor" in out


def test_bench_sample_with_stop_tokens_smoke(capsys):
    """--stops: rows end at different lengths on both sides and still agree token for token."""
    from rossjax.bench.sample import main

    assert main(["--preset", "tiny_qwen2", "--batch", "4", "--prompt_len", "8",
                 "--new_tokens", "8", "--repeats", "1", "--stops", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 stop tokens: rows generate" in out and "greedy tokens agree on 100.0%" in out
