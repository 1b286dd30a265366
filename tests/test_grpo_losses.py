"""GRPO losses against loop-by-loop NumPy references (the slow obvious way)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rossjax.train.losses import grpo_loss  # the re-export the issue names
from rossjax.train.rl import grpo_losses as gl


def ref_loss(logp, old, ref, adv, mask, eps_low, eps_high, beta, agg, weights=None):
    B, T = logp.shape
    per = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            if mask[b, t] == 0:
                continue
            rho = math.exp(logp[b, t] - old[b, t])
            a = adv[b]
            surr = -min(rho * a, min(max(rho, 1 - eps_low), 1 + eps_high) * a)
            if weights is not None:
                surr *= weights[b, t]
            d = ref[b, t] - logp[b, t]
            per[b, t] = surr + beta * (math.exp(d) - d - 1)
    if agg == "token_mean":
        n = sum(mask[b, t] for b in range(B) for t in range(T))
        return sum(per[b, t] * mask[b, t] for b in range(B) for t in range(T)) / max(n, 1)
    if agg == "seq_mean_token_mean":
        rows = []
        for b in range(B):
            n = sum(mask[b])
            if n > 0:
                rows.append(sum(per[b, t] * mask[b, t] for t in range(T)) / n)
        return sum(rows) / max(len(rows), 1)
    total = sum(per[b, t] * mask[b, t] for b in range(B) for t in range(T))
    return total / (B * T)


def _inputs(seed=0, B=6, T=7):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 0.5, (B, T))
    logp = old + rng.normal(0, 0.4, (B, T))  # ratios well outside [0.8, 1.2] for many tokens
    ref = old + rng.normal(0, 0.3, (B, T))
    adv = rng.normal(0, 1, B)
    mask = (rng.random((B, T)) < 0.7).astype(np.float64)
    mask[2] = 0  # a row with zero mask
    mask[4, :3] = 1
    # padding holds garbage that must not leak
    logp = np.where(mask > 0, logp, 50.0)
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("agg", gl.AGGREGATIONS)
@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.2, 0.28), (1e9, 1e9)])
@pytest.mark.parametrize("beta", [0.0, 0.05, 1.0])
def test_grpo_loss_matches_reference(agg, eps, beta):
    logp, old, ref, adv, mask = _inputs()
    loss, m = grpo_loss(logp, old, ref, adv, mask, eps_low=eps[0], eps_high=eps[1], beta=beta,
                        agg=agg)
    want = ref_loss(logp, old, ref, adv, mask, eps[0], eps[1], beta, agg)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
    assert np.isfinite(float(m["kl"]))


def test_grpo_loss_is_weights_and_metrics():
    logp, old, ref, adv, mask = _inputs(seed=3)
    w = np.random.default_rng(1).uniform(0, 2, logp.shape)
    loss, m = grpo_loss(logp, old, ref, adv, mask, beta=0.1, is_weights=w)
    np.testing.assert_allclose(float(loss), ref_loss(logp, old, ref, adv, mask, 0.2, 0.2, 0.1,
                                                     "token_mean", w), rtol=1e-5)
    # clip fractions: loop reference
    low = high = n = 0
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t]:
                rho = math.exp(logp[b, t] - old[b, t])
                n += 1
                low += rho < 0.8 and adv[b] < 0
                high += rho > 1.2 and adv[b] > 0
    np.testing.assert_allclose(float(m["clip_frac_low"]), low / n, rtol=1e-6)
    np.testing.assert_allclose(float(m["clip_frac_high"]), high / n, rtol=1e-6)
    assert low > 0 and high > 0


def test_grpo_loss_gradient_at_ratio_one():
    """At logp == old_logp and beta 0, d loss / d logp = -A per token / count (token_mean)."""
    logp, old, ref, adv, mask = _inputs(seed=5)
    g = jax.grad(lambda lp: grpo_loss(lp, old, ref, adv, mask)[0])(jnp.asarray(old))
    want = -adv[:, None] * mask / mask.sum()
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-7)


def adv_ref(r, G, method, eps=1e-6):
    out = np.zeros(len(r))
    for s in range(0, len(r), G):
        grp = r[s:s + G]
        ok = [x for x in grp if not math.isnan(x)]
        for j, x in enumerate(grp):
            if math.isnan(x):
                continue
            mean = sum(ok) / len(ok)
            if method == "mean":
                out[s + j] = x - mean
            elif method == "grpo":
                std = math.sqrt(sum((y - mean) ** 2 for y in ok) / len(ok))
                out[s + j] = (x - mean) / (std + eps)
            else:
                others = list(ok)
                others.remove(x)
                out[s + j] = x - sum(others) / len(others) if others else 0.0
    return out


@pytest.mark.parametrize("method", gl.ADVANTAGES)
def test_advantages_match_reference(method):
    rng = np.random.default_rng(0)
    G = 4
    r = rng.normal(size=5 * G)
    r[1] = np.nan
    r[8:12] = [np.nan, np.nan, 0.5, np.nan]  # one scorable member
    r[12:16] = 1.0  # zero variance
    got = np.asarray(gl.group_advantages(r, G, method))
    np.testing.assert_allclose(got, adv_ref(r, G, method), rtol=1e-5, atol=1e-6)
    assert got[1] == 0 and np.all(got[12:16] == 0) and got[10] == 0
    # [n, G] input keeps its shape
    assert np.asarray(gl.group_advantages(r.reshape(5, G), G, method)).shape == (5, G)


@pytest.mark.parametrize("mode", gl.IS_MODES)
@pytest.mark.parametrize("how", gl.IS_HOW)
def test_importance_weights(mode, how):
    rng = np.random.default_rng(2)
    B, T = 5, 6
    samp = rng.normal(-2, 0.5, (B, T))
    train = samp + rng.normal(0, 0.3, (B, T))
    mask = (rng.random((B, T)) < 0.8).astype(float)
    lo, hi = 0.8, 1.25
    w, _ = gl.importance_weights(train, samp, mask, mode=mode, how=how, low=lo, high=hi)
    want = np.zeros((B, T))
    for b in range(B):
        seq = sum((train[b, t] - samp[b, t]) for t in range(T) if mask[b, t])
        for t in range(T):
            if not mask[b, t]:
                continue
            x = math.exp(seq if mode == "sequence" else train[b, t] - samp[b, t])
            want[b, t] = min(max(x, lo), hi) if how == "truncate" else float(lo <= x <= hi)
    np.testing.assert_allclose(np.asarray(w), want, rtol=1e-5)


def test_bad_names():
    with pytest.raises(ValueError):
        gl.group_advantages(np.zeros(4), 2, "std")
    with pytest.raises(ValueError):
        grpo_loss(np.zeros((1, 2)), np.zeros((1, 2)), None, np.zeros(1), np.ones((1, 2)), agg="sum")


@pytest.mark.parametrize("agg", gl.AGGREGATIONS)
def test_equal_rewards_leave_only_the_kl_gradient(agg):
    """All rewards in every group equal -> advantages 0 -> the gradient is the KL term's alone."""
    logp, old, ref, _, mask = _inputs(seed=7)
    logp = np.where(mask > 0, logp, 0.0)
    r = np.repeat(np.random.default_rng(0).normal(size=3), 2)  # 3 groups of 2, equal inside
    adv = np.asarray(gl.group_advantages(r, 2, "grpo"))
    assert np.all(adv == 0)
    beta = 0.3
    g = jax.grad(lambda lp: grpo_loss(lp, old, ref, adv, mask, beta=beta, agg=agg)[0])(jnp.asarray(logp))

    # d/dlogp of beta * k3 = beta * (1 - e^(ref - logp)), times the token's aggregation weight
    B, T = mask.shape
    rows = [b for b in range(B) if mask[b].sum() > 0]
    want = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            if not mask[b, t]:
                continue
            if agg == "token_mean":
                weight = 1.0 / mask.sum()
            elif agg == "seq_mean_token_mean":
                weight = 1.0 / (mask[b].sum() * len(rows))
            else:
                weight = 1.0 / (B * T)
            want[b, t] = beta * (1.0 - math.exp(ref[b, t] - logp[b, t])) * weight
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-9)
    g0 = jax.grad(lambda lp: grpo_loss(lp, old, ref, adv, mask, beta=0.0, agg=agg)[0])(jnp.asarray(logp))
    assert float(jnp.abs(g0).max()) == 0.0


@pytest.mark.parametrize("agg", gl.AGGREGATIONS)
@pytest.mark.parametrize("splits", [[2, 4], [1, 3, 5]])
def test_micro_batch_shares_add_up_to_the_batch(agg, splits):
    """Micro-batches normalized by the whole batch's `normalizers` sum to the whole-batch loss,
    gradient and metrics (exact gradient accumulation), for every aggregation; the row split
    puts the zero-mask row 2 alone or beside others."""
    logp, old, ref, adv, mask = _inputs(seed=11)
    logp = np.where(mask > 0, logp, 0.0)
    w = np.random.default_rng(4).uniform(0, 2, logp.shape)
    kw = dict(eps_low=0.2, eps_high=0.28, beta=0.1, agg=agg, max_len=9)

    def f(lp, rows, norm):
        return grpo_loss(lp, old[rows], ref[rows], adv[rows], mask[rows], is_weights=w[rows],
                         norm=norm, **kw)

    everything = np.arange(len(adv))
    (loss, m), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp), everything, None)
    norm = gl.normalizers(mask, agg, 9)
    loss_sum, g_sum, m_sum = 0.0, np.zeros_like(logp), {k: 0.0 for k in m}
    for rows in np.split(everything, splits):
        (l_k, m_k), g_k = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp[rows]), rows, norm)
        loss_sum += float(l_k)
        g_sum[rows] = np.asarray(g_k)
        for k in m:
            m_sum[k] += float(m_k[k])
    np.testing.assert_allclose(loss_sum, float(loss), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g_sum, np.asarray(g), rtol=1e-5, atol=1e-8)
    for k in m:
        np.testing.assert_allclose(m_sum[k], float(m[k]), rtol=1e-5, atol=1e-7, err_msg=k)
    # the slow reference agrees with the whole-batch value (max_len 9 for Dr. GRPO)
    want = ref_loss(logp, old, ref, adv, mask, 0.2, 0.28, 0.1, agg, w)
    if agg == "seq_mean_token_sum_norm":
        want *= logp.shape[1] / 9
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-7)
