"""rossjax.train.rl.distill: both reverse-KL losses and their gradients against a float64 loop,
the full-vocab one against torch, temperature, the teacher tokenizer check and row routing."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from rossjax.errors import ConfigError, InputError
from rossjax.tokenizers.base import Tokenizer
from rossjax.train.rl import distill

B, T, V = 2, 3, 5


def _batch(seed=0):
    r = np.random.default_rng(seed)
    s = r.normal(size=(B, T, V)) * 2.0
    t = r.normal(size=(B, T, V)) * 2.0
    y = r.integers(0, V, size=(B, T))
    mask = np.array([[1, 1, 0], [1, 1, 1]], np.float64)
    return s, t, y, mask


def _loop_logp(row, temp):
    z = [x / temp for x in row]
    m = max(z)
    lse = m + math.log(sum(math.exp(x - m) for x in z))
    return [x - lse for x in z]


def loop_loss(name, s, t, y, mask, temp):
    """token_mean of the per-token term, one position at a time, in float64."""
    total = 0.0
    for b in range(B):
        for i in range(T):
            if not mask[b, i]:
                continue
            ls, lt = _loop_logp(s[b, i], temp), _loop_logp(t[b, i], temp)
            if name == "reverse_kl_full":
                total += sum(math.exp(ls[v]) * (ls[v] - lt[v]) for v in range(V))
            else:
                total += ls[y[b, i]] - lt[y[b, i]]
    return total / mask.sum()


def loop_grad(name, s, t, y, mask, temp):
    """d loss / d student logits: the full KL's exact gradient; the sampled loss's score-function
    gradient k1 * d log pi_s(y) / d logits = k1 * (onehot(y) - pi_s) / T."""
    g = np.zeros_like(s)
    n = mask.sum()
    for b in range(B):
        for i in range(T):
            if not mask[b, i]:
                continue
            ls, lt = _loop_logp(s[b, i], temp), _loop_logp(t[b, i], temp)
            p = [math.exp(x) for x in ls]
            if name == "reverse_kl_full":
                kl = sum(p[v] * (ls[v] - lt[v]) for v in range(V))
                for u in range(V):
                    g[b, i, u] = p[u] * ((ls[u] - lt[u]) - kl) / temp / n
            else:
                k1 = ls[y[b, i]] - lt[y[b, i]]
                for u in range(V):
                    g[b, i, u] = k1 * ((u == y[b, i]) - p[u]) / temp / n
    return g


def _jax(name, s, t, y, mask, temp):
    with jax.enable_x64(True):
        f = lambda x: distill.distill_loss(name, x, t, y, mask, temperature=temp)[0]  # noqa: E731
        return float(f(s)), np.asarray(jax.grad(f)(s))


@pytest.mark.parametrize("name", ["reverse_kl_sampled", "reverse_kl_full"])
@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_loss_and_grad_match_float64_loop(name, temp):
    s, t, y, mask = _batch()
    loss, grad = _jax(name, s, t, y, mask, temp)
    assert abs(loss - loop_loss(name, s, t, y, mask, temp)) < 1e-6
    np.testing.assert_allclose(grad, loop_grad(name, s, t, y, mask, temp), atol=1e-6)
    assert np.all(grad[0, 2] == 0)  # padding carries no gradient


def test_token_form_is_the_logits_form():
    """The trainer's sampled loss from log-probs (distill.TOKEN_FORMS) has the value and the
    gradient of the registry's logits form (checked against the loop above)."""
    s, t, y, mask = _batch(3)
    with jax.enable_x64(True):
        def from_logp(x):
            lp = lambda z: jax.nn.log_softmax(z / 0.7, -1)  # noqa: E731
            take = lambda a: np.take_along_axis(a, y[..., None], -1)[..., 0]  # noqa: E731
            per = distill.TOKEN_FORMS["reverse_kl_sampled"](take(lp(x)), take(lp(t)))
            return (per * mask).sum() / mask.sum()
        v, g = float(from_logp(s)), np.asarray(jax.grad(from_logp)(s))
    v_ref, g_ref = _jax("reverse_kl_sampled", s, t, y, mask, 0.7)
    assert abs(v - v_ref) < 1e-12
    np.testing.assert_allclose(g, g_ref, atol=1e-12)


def test_mutations_fail():
    """Forward KL, or the pathwise gradient of k1, would not match the loop."""
    s, t, y, mask = _batch()
    loss, grad = _jax("reverse_kl_full", s, t, y, mask, 1.0)
    forward = loop_loss("reverse_kl_full", t, s, y, mask, 1.0)  # KL(teacher || student)
    assert abs(loss - forward) > 1e-3
    _, g = _jax("reverse_kl_sampled", s, t, y, mask, 1.0)
    with jax.enable_x64(True):
        def pathwise(x):  # differentiating k1 directly: grad log pi_s(y), no k1 weight
            lps = jax.nn.log_softmax(x, -1)
            return (np.take_along_axis(lps, y[..., None], -1)[..., 0] * mask).sum() / mask.sum()
        wrong = np.asarray(jax.grad(pathwise)(s))
    assert np.abs(g - wrong).max() > 1e-3


def test_temperature_changes_result():
    s, t, y, mask = _batch(1)
    for name in ("reverse_kl_sampled", "reverse_kl_full"):
        assert abs(_jax(name, s, t, y, mask, 1.0)[0] - _jax(name, s, t, y, mask, 2.0)[0]) > 1e-3
    with pytest.raises(ConfigError, match="temperature"):
        distill.distill_loss("reverse_kl_full", s, t, y, mask, temperature=0.0)


def test_registry_names():
    assert {"reverse_kl_sampled", "reverse_kl_full"} <= set(distill.DISTILL_REGISTRY.names())
    with pytest.raises(ConfigError, match="config.distill.loss"):
        distill.DISTILL_REGISTRY.get("forward_kl")


def test_full_vocab_matches_torch():
    torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
    F = torch.nn.functional
    s, t, y, mask = _batch(2)
    temp = 0.8
    st = torch.tensor(s, dtype=torch.float32, requires_grad=True)
    ls = F.log_softmax(st / temp, -1)
    lt = F.log_softmax(torch.tensor(t, dtype=torch.float32) / temp, -1)
    # reverse KL(pi_s || pi_t) in kl_div's (input, target) convention: input = log pi_t,
    # target = log pi_s (log_target), summed over the vocabulary
    kl = F.kl_div(lt, ls, reduction="none", log_target=True).sum(-1)
    m = torch.tensor(mask, dtype=torch.float32)
    ref = (kl * m).sum() / m.sum()
    ref.backward()
    f = lambda x: distill.distill_loss(  # noqa: E731
        "reverse_kl_full", x, t.astype(np.float32), y, mask, temperature=temp)[0]
    x = s.astype(np.float32)
    assert abs(float(f(x)) - ref.item()) < 1e-5
    np.testing.assert_allclose(np.asarray(jax.grad(f)(x)), st.grad.numpy(), atol=1e-4)


def _tok(vocab, specials=None, name="t"):
    specials = specials if specials is not None else {"<eos>": len(vocab)}
    return Tokenizer(list(vocab) + [b""] * len(specials), specials, eos="<eos>", pad=None,
                     name=name)


def test_teacher_check():
    base = [bytes([i]) for i in range(8)]
    fp = distill.check_teacher("llama-tiny", _tok(base), "qwen-tiny", _tok(base))
    assert len(fp) == 64  # another architecture family with the same tokenizer is allowed
    with pytest.raises(ConfigError, match=r"teacher 'big'.*student 'small'.*10 tokens.*9"):
        distill.check_teacher("small", _tok(base), "big", _tok(base + [b"x"]))
    other = base[:3] + [b"zz"] + base[4:]
    with pytest.raises(ConfigError, match="token 3"):
        distill.check_teacher("small", _tok(base), "big", _tok(other))
    with pytest.raises(ConfigError, match="special tokens"):
        distill.check_teacher("small", _tok(base), "big", _tok(base, {"<end>": 8}))


def test_routing():
    rows = [{"domain": "math"}, {"domain": "code"}, {"domain": "math"}]
    routes = {"math": "teacher-m", "code": "teacher-c"}
    names = distill.route_rows(rows, routes)
    assert names == ["teacher-m", "teacher-c", "teacher-m"]
    assert distill.rows_by_teacher(names) == {"teacher-m": [0, 2], "teacher-c": [1]}
    with pytest.raises(InputError, match=r"tasks.jsonl row 1: field 'domain' = 'chem'"):
        distill.route_rows([rows[0], {"domain": "chem"}], routes, source="tasks.jsonl")
    with pytest.raises(InputError, match="row 0: field 'task' = None"):
        distill.route_rows(rows, routes, field="task")
    # a named default teacher takes the rows with no route (and only those)
    assert distill.route_rows([rows[0], {"domain": "chem"}, {}], routes, default="teacher-d") \
        == ["teacher-m", "teacher-d", "teacher-d"]
