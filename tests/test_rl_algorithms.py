"""The RL algorithms the registries ship (GSPO, CISPO, the KL estimators, log-probs at the
sampling temperature) against slow NumPy/loop references written here, never with the function
under test; the same through micro-batch accumulation and the jitted step; and a user's own loss,
estimator and aggregation named as module:function in the config. DAPO: tests/test_grpo_dapo.py."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rossjax import models, sharding
from rossjax.errors import ConfigError
from rossjax.models import shardings as model_shardings
from rossjax.train import state as state_lib
from rossjax.train.registry import Registry
from rossjax.train.rl import advantages, grpo_losses as gl, grpo_step

POLICIES = ("ppo_clip", "gspo", "cispo")
KLS = ("k1", "k2", "k3", "k3_unbiased")


def _clamp(x, lo, hi):
    return min(max(x, lo), hi)


def slow_terms(lp, old, ref, adv, mask, policy, kl, eps_low, eps_high, frozen):
    """Per-token (policy term, KL) lists of lists, by the papers' formulas. `frozen` is the
    log-prob at which stop-gradient quantities (CISPO's weight) are evaluated."""
    B, T = len(lp), len(lp[0])
    pol = [[0.0] * T for _ in range(B)]
    kls = [[0.0] * T for _ in range(B)]
    for b in range(B):
        toks = [t for t in range(T) if mask[b][t]]
        if policy == "gspo" and toks:
            s = math.exp(sum(lp[b][t] - old[b][t] for t in toks) / len(toks))
            row = -min(s * adv[b], _clamp(s, 1 - eps_low, 1 + eps_high) * adv[b])
        for t in toks:
            if policy == "ppo_clip":
                rho = math.exp(lp[b][t] - old[b][t])
                pol[b][t] = -min(rho * adv[b], _clamp(rho, 1 - eps_low, 1 + eps_high) * adv[b])
            elif policy == "gspo":
                pol[b][t] = row
            else:  # cispo
                w = _clamp(math.exp(frozen[b][t] - old[b][t]), 1 - eps_low, 1 + eps_high)
                pol[b][t] = -w * adv[b] * lp[b][t]
            d = ref[b][t] - lp[b][t]
            k3 = math.exp(d) - d - 1
            kls[b][t] = {"k1": -d, "k2": 0.5 * d * d, "k3": k3,
                         "k3_unbiased": math.exp(lp[b][t] - old[b][t]) * k3}[kl]
    return pol, kls


def slow_aggregate(per, mask, agg, max_len=None):
    B, T = len(per), len(per[0])
    if agg == "token_mean":
        n = sum(mask[b][t] for b in range(B) for t in range(T))
        return sum(per[b][t] for b in range(B) for t in range(T) if mask[b][t]) / max(n, 1)
    if agg == "seq_mean_token_mean":
        rows = [sum(per[b][t] for t in range(T) if mask[b][t]) / sum(mask[b])
                for b in range(B) if sum(mask[b]) > 0]
        return sum(rows) / max(len(rows), 1)
    return sum(per[b][t] for b in range(B) for t in range(T) if mask[b][t]) / \
        (B * (T if max_len is None else max_len))


def slow_loss(lp, old, ref, adv, mask, *, policy, kl, agg, eps_low, eps_high, beta,
              w=None, max_len=None, frozen=None):
    lp = np.asarray(lp, np.float64).tolist()
    frozen = lp if frozen is None else np.asarray(frozen, np.float64).tolist()
    pol, kls = slow_terms(lp, old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(), policy,
                          kl, eps_low, eps_high, frozen)
    B, T = len(lp), len(lp[0])
    per = [[pol[b][t] * (1.0 if w is None else w[b, t]) + beta * kls[b][t] for t in range(T)]
           for b in range(B)]
    return slow_aggregate(per, mask.tolist(), agg, max_len)


def slow_grad(lp, old, ref, adv, mask, h=1e-6, **kw):
    """Central differences of slow_loss in float64 (stop-gradient parts held at lp)."""
    lp = np.asarray(lp, np.float64)
    g = np.zeros_like(lp)
    for b, t in zip(*np.nonzero(mask)):
        up, dn = lp.copy(), lp.copy()
        up[b, t] += h
        dn[b, t] -= h
        g[b, t] = (slow_loss(up, old, ref, adv, mask, frozen=lp, **kw)
                   - slow_loss(dn, old, ref, adv, mask, frozen=lp, **kw)) / (2 * h)
    return g


def _inputs(seed=0, B=6, T=7):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 0.5, (B, T))
    lp = old + rng.normal(0, 0.4, (B, T))   # ratios outside [0.8, 1.28] for many tokens
    ref = old + rng.normal(0, 0.3, (B, T))
    adv = rng.normal(0, 1, B)
    mask = (rng.random((B, T)) < 0.7).astype(np.float64)
    mask[2] = 0                              # a row with no token
    mask[4, :3] = 1
    # float32 inputs, as the trainer holds them: the reference then sees the same numbers
    f32 = lambda x: np.asarray(x, np.float32).astype(np.float64)
    return f32(lp), f32(old), f32(ref), f32(adv), mask


@pytest.mark.parametrize("agg", gl.AGGREGATIONS)
@pytest.mark.parametrize("kl", KLS)
@pytest.mark.parametrize("policy", POLICIES)
def test_loss_and_gradient_match_the_slow_formula(policy, kl, agg):
    lp, old, ref, adv, mask = _inputs(seed=1)
    w = np.random.default_rng(2).uniform(0, 2, lp.shape).astype(np.float32).astype(np.float64)
    kw = dict(policy=policy, kl=kl, agg=agg, eps_low=0.2, eps_high=0.28, beta=0.1, w=w)

    def f(x):
        return gl.grpo_loss(x, old, ref, adv, mask, eps_low=0.2, eps_high=0.28, beta=0.1, agg=agg,
                            is_weights=w, policy_loss=policy, kl=kl)

    (loss, m), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(lp, jnp.float32))
    np.testing.assert_allclose(float(loss), slow_loss(lp, old, ref, adv, mask, **kw), rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(np.asarray(g), slow_grad(lp, old, ref, adv, mask, **kw),
                               rtol=1e-4, atol=2e-7)
    # metrics: the KL estimator's token mean, the ratio the policy loss used
    pol, kls = slow_terms(lp.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(),
                          policy, kl, 0.2, 0.28, lp.tolist())
    n = mask.sum()
    np.testing.assert_allclose(float(m["kl"]), sum(map(sum, kls)) / n, rtol=1e-5, atol=1e-7)
    ratios = []
    for b in range(len(lp)):
        toks = [t for t in range(lp.shape[1]) if mask[b, t]]
        for t in toks:
            ratios.append(math.exp(sum(lp[b, u] - old[b, u] for u in toks) / len(toks))
                          if policy == "gspo" else math.exp(lp[b, t] - old[b, t]))
    np.testing.assert_allclose(float(m["ratio_mean"]), np.mean(ratios), rtol=1e-5)


@pytest.mark.parametrize("policy", POLICIES)
def test_clip_fractions_and_which_tokens_keep_a_gradient(policy):
    lp, old, ref, adv, mask = _inputs(seed=8)
    eps = 0.1 if policy == "gspo" else 0.2  # a sequence ratio is a geometric mean: nearer 1
    (_, m), g = jax.value_and_grad(lambda x: gl.grpo_loss(
        x, old, ref, adv, mask, eps_low=eps, eps_high=eps, policy_loss=policy), has_aux=True)(
        jnp.asarray(lp, jnp.float32))
    g = np.asarray(g)
    low = high = n = 0
    for b in range(len(lp)):
        toks = [t for t in range(lp.shape[1]) if mask[b, t]]
        for t in toks:
            n += 1
            r = (math.exp(sum(lp[b, u] - old[b, u] for u in toks) / len(toks))
                 if policy == "gspo" else math.exp(lp[b, t] - old[b, t]))
            if policy == "cispo":  # the weight is clipped whatever the advantage's sign
                low += r < 1 - eps
                high += r > 1 + eps
            else:                  # clipped where min() picks the flat branch
                low += r < 1 - eps and adv[b] < 0
                high += r > 1 + eps and adv[b] > 0
    assert low > 0 and high > 0
    np.testing.assert_allclose(float(m["clip_frac_low"]), low / n, rtol=1e-6)
    np.testing.assert_allclose(float(m["clip_frac_high"]), high / n, rtol=1e-6)
    # CISPO never drops a token (its weight is clipped, the gradient stays); PPO-clip drops
    # exactly the clipped ones; GSPO drops whole rows.
    live = (g != 0) & (mask > 0)
    if policy == "cispo":
        assert live.sum() == mask.sum()
    elif policy == "ppo_clip":
        assert mask.sum() - live.sum() == low + high
    else:
        for b in range(len(lp)):
            assert len(set(live[b][mask[b] > 0])) <= 1   # all of a row's tokens, or none


@pytest.mark.parametrize("policy", POLICIES)
def test_gradient_at_ratio_one_is_minus_the_advantage(policy):
    """On-policy (logp == old) every policy loss has the REINFORCE gradient -A / count."""
    lp, old, ref, adv, mask = _inputs(seed=5)
    g = jax.grad(lambda x: gl.grpo_loss(x, old, ref, adv, mask, policy_loss=policy)[0])(
        jnp.asarray(old, jnp.float32))
    np.testing.assert_allclose(np.asarray(g), -adv[:, None] * mask / mask.sum(), rtol=1e-5,
                               atol=1e-8)


@pytest.mark.parametrize("agg", gl.AGGREGATIONS)
@pytest.mark.parametrize("policy,kl", [("gspo", "k3"), ("cispo", "k3_unbiased"),
                                       ("ppo_clip", "k1"), ("gspo", "k2")])
@pytest.mark.parametrize("splits", [[2, 4], [1, 3, 5]])
def test_micro_batch_shares_add_up(policy, kl, agg, splits):
    """Micro-batches normalized by the whole batch's `normalizers` add up to the whole-batch loss,
    gradient and metrics, which equal the slow formula."""
    lp, old, ref, adv, mask = _inputs(seed=11)
    w = np.random.default_rng(4).uniform(0, 2, lp.shape).astype(np.float32).astype(np.float64)
    kw = dict(eps_low=0.2, eps_high=0.28, beta=0.1, agg=agg, max_len=9, policy_loss=policy, kl=kl)

    def f(x, rows, norm):
        return gl.grpo_loss(x, old[rows], ref[rows], adv[rows], mask[rows], is_weights=w[rows],
                            norm=norm, **kw)

    every = np.arange(len(adv))
    x = jnp.asarray(lp, jnp.float32)
    (loss, m), g = jax.value_and_grad(f, has_aux=True)(x, every, None)
    norm = gl.normalizers(mask, agg, 9)
    loss_sum, g_sum, m_sum = 0.0, np.zeros(lp.shape), {k: 0.0 for k in m}
    for rows in np.split(every, splits):
        (l_k, m_k), g_k = jax.value_and_grad(f, has_aux=True)(x[rows], rows, norm)
        loss_sum += float(l_k)
        g_sum[rows] = np.asarray(g_k)
        for k in m:
            m_sum[k] += float(m_k[k])
    np.testing.assert_allclose(loss_sum, float(loss), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g_sum, np.asarray(g), rtol=1e-5, atol=1e-8)
    for k in m:
        np.testing.assert_allclose(m_sum[k], float(m[k]), rtol=1e-5, atol=1e-7, err_msg=k)
    want = slow_loss(lp, old, ref, adv, mask, policy=policy, kl=kl, agg=agg, eps_low=0.2,
                     eps_high=0.28, beta=0.1, w=w, max_len=9)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-7)


def _user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rl.py").write_text(
        "import jax.numpy as jnp\n"
        "from rossjax.train.rl.grpo_losses import Aggregation\n"
        "from rossjax.train.rl.policy_losses import PolicyTerms\n"
        "def reinforce(logp, old_logp, adv, mask, eps_low, eps_high):\n"
        "    z = jnp.zeros_like(logp)\n"
        "    return PolicyTerms(-adv * jnp.where(mask != 0, logp, 0.0), z + 1.0, z, z)\n"
        "def sq(logp, ref_logp, old_logp):\n"
        "    return (logp - ref_logp) ** 2\n"
        "def sign(r, ok, eps):\n"
        "    return jnp.sign(r - 0.5)\n"
        "row_sum = Aggregation(lambda x, m, d: (x * m).sum() / d, lambda m, L: 1.0)\n"
        "def not_an_aggregation(x, m, d):\n"
        "    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_users_own_loss_estimator_and_aggregation(tmp_path, monkeypatch):
    _user_module(tmp_path, monkeypatch)
    lp, old, ref, adv, mask = _inputs(seed=8)
    loss, m = gl.grpo_loss(lp, old, ref, adv, mask, beta=0.5, agg="my_rl:row_sum",
                           policy_loss="my_rl:reinforce", kl="my_rl:sq")
    want = sum(-adv[b] * lp[b, t] + 0.5 * (lp[b, t] - ref[b, t]) ** 2
               for b in range(len(lp)) for t in range(lp.shape[1]) if mask[b, t])
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    r = np.array([0.0, 1.0, 1.0, np.nan])
    assert np.asarray(advantages.group_advantages(r, 2, "my_rl:sign")).tolist() == [-1, 1, 1, 0]
    # through the config, as `--config.grpo.policy_loss=my_rl:reinforce` gives it
    from rossjax.train.rl import grpo_config

    c = grpo_config.default_config()
    c.grpo.policy_loss, c.grpo.kl, c.grpo.advantages = "my_rl:reinforce", "my_rl:sq", "my_rl:sign"
    c.grpo.agg = "my_rl:row_sum"
    c.reward.functions = ("contains",)
    grpo_config.check_config(c)


@pytest.mark.parametrize("field, value, says", [
    ("policy_loss", "ppo", r"config.grpo.policy_loss 'ppo' is not one of ppo_clip, gspo, cispo"),
    ("kl", "no_such_module_xyz:f", r"config.grpo.kl 'no_such_module_xyz:f': module "
                                   r"'no_such_module_xyz' cannot be imported"),
    ("advantages", "my_rl:missing", r"config.grpo.advantages 'my_rl:missing': my_rl has no "
                                    r"function 'missing'"),
    ("agg", "my_rl:not_an_aggregation", r"config.grpo.agg 'my_rl:not_an_aggregation': it must "
                                        r"be a rossjax.train.rl.grpo_losses.Aggregation"),
    ("agg", "my_rl:", r"config.grpo.agg 'my_rl:' is not module:function"),
    ("overlong_buffer", 64, r"config.grpo.overlong_buffer 64 must be in \[0, max_new_tokens = 64\)"),
    ("temperature", -0.5, r"config.grpo.temperature is -0.5"),
])
def test_bad_registry_names_are_one_sentence(tmp_path, monkeypatch, field, value, says):
    _user_module(tmp_path, monkeypatch)
    from rossjax.train.rl import grpo_config

    c = grpo_config.default_config()
    c.reward.functions = ("contains",)
    c.grpo.max_new_tokens = 64
    c.grpo[field] = value
    with pytest.raises(ConfigError, match=says):
        grpo_config.check_config(c)


def test_registry_refuses_a_second_implementation_under_one_name():
    reg = Registry("thing", "config.x")
    reg.register("a", abs)
    reg.register("a", abs)  # the same object again is fine (a module imported twice)
    with pytest.raises(ConfigError, match="thing 'a' is registered already"):
        reg.register("a", round)
    assert reg.names() == ("a",) and "a" in reg


# ---- log-probs at the sampling temperature, through the model ----

def _tiny():
    cfg = models.get_preset("tiny_qwen2", vocab_size=64)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    return cfg, params


def _batch(rows=16, seq=16, vocab=64, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, (rows, seq)).astype(np.int32)
    mask = np.zeros((rows, seq), np.float32)
    mask[:, 5:13] = 1
    mask[3, 9:] = 0
    return {"tokens": tokens, "positions": np.tile(np.arange(seq, dtype=np.int32), (rows, 1)),
            "segment_ids": np.ones((rows, seq), np.int32),
            "targets": np.concatenate([tokens[:, 1:], np.zeros((rows, 1), np.int32)], 1),
            "mask": mask}


def _np_logsoftmax(logits, T):
    z = np.asarray(logits, np.float64) / T
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.mark.parametrize("T", [0.6, 1.0, 1.7])
def test_trainer_logprobs_and_entropy_at_the_sampling_temperature(T):
    cfg, params = _tiny()
    b = _batch()
    logits = np.asarray(models.forward(cfg, params, b["tokens"], b["positions"],
                                       b["segment_ids"])[0])
    lsm = _np_logsoftmax(logits, T)
    want = np.take_along_axis(lsm, b["targets"][..., None], -1)[..., 0]
    want_ent = -(np.exp(lsm) * lsm).sum(-1)
    lp, ent = grpo_step.logp_entropy(cfg, params, b, chunk=8, temperature=T)
    np.testing.assert_allclose(np.asarray(lp), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), want_ent, rtol=1e-5, atol=1e-5)
    if T != 1.0:  # the T = 1 log-probs are a different distribution's
        assert np.abs(np.asarray(grpo_step.token_logprobs(cfg, params, b, 8)) - want).max() > 1e-2
    assert grpo_step.sampling_temperature(0.0) == 1.0 and grpo_step.sampling_temperature(T) == T


def test_sampler_and_trainer_logprobs_agree_at_the_temperature():
    """On-policy, the trainer's log-probs of the sampled tokens are the sampler's: the IS ratio
    is 1, at any temperature."""
    from rossjax import sample

    cfg, params = _tiny()
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    gen = sample.generate(cfg, params, prompts, 8, temperature=0.6, num_samples=4, seed=3)
    b = grpo_step.completion_batch(prompts, gen, 4, 16)
    lp = np.asarray(grpo_step.token_logprobs(cfg, params, b, 8, temperature=0.6))
    m = b["mask"] > 0
    np.testing.assert_allclose(lp[m], b["sampler_logp"][m], rtol=1e-5, atol=1e-5)


# ---- the jitted step: accumulated micro-batches equal the one-batch step ----

def _step_fns(micro, loss_cfg, cfg):
    part = sharding.Partitioner(sharding.make_mesh(data=4, fsdp=1, tensor=2))
    opt = optax.sgd(0.5)
    p_shard = model_shardings.param_shardings(cfg, part)
    params = model_shardings.init_params_sharded(cfg, jax.random.PRNGKey(0), part)
    s_shard = state_lib.state_shardings(p_shard, opt, jax.eval_shape(lambda: params), part)
    c = ml_collections.ConfigDict(dict(loss_cfg, micro_batches=micro))
    fns = grpo_step.StepFns(cfg, opt, lambda s: 0.5, partitioner=part, param_shardings=p_shard,
                            state_shardings=s_shard, base_shardings={}, lora_alpha=None,
                            loss_cfg=c, chunk=8, max_new=10)
    return fns, state_lib.init_state(params, opt, s_shard)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
@pytest.mark.parametrize("policy,kl,agg,T,passes", [
    ("gspo", "k3", "seq_mean_token_mean", 0.7, 2),
    ("cispo", "k3_unbiased", "token_mean", 1.3, 2),
    ("ppo_clip", "k3_unbiased", "seq_mean_token_sum_norm", 0.7, 2),
    ("gspo", "k3_unbiased", "token_mean", 1.3, 1),
])
def test_step_equals_the_slow_formula_with_and_without_micro_batches(policy, kl, agg, T, passes):
    """One update through StepFns (log-probs at T from the model, the registered loss): its loss
    is the slow formula on NumPy log-probs of the same logits, and 4 micro-batches give the same
    loss, gradient norm, metrics and SGD params as one batch. With two passes a step the old
    log-probs are given; with one the update is on-policy (old = its own log-probs, ratio 1)."""
    cfg, params0 = _tiny()
    b = _batch(seed=1)
    rng = np.random.default_rng(7)
    logits = np.asarray(models.forward(cfg, params0, b["tokens"], b["positions"],
                                       b["segment_ids"])[0])
    lp_now = np.take_along_axis(_np_logsoftmax(logits, T), b["targets"][..., None], -1)[..., 0]
    mask = b["mask"].astype(np.float64)
    old = np.where(mask > 0, lp_now + rng.normal(0, 0.3, lp_now.shape), 0.0).astype(np.float32)
    ref = np.where(mask > 0, lp_now + rng.normal(0, 0.3, lp_now.shape), 0.0).astype(np.float32)
    adv = rng.normal(size=len(mask)).astype(np.float32)
    loss_cfg = dict(agg=agg, beta=0.2, eps_low=0.2, eps_high=0.28, is_mode="none",
                    policy_loss=policy, kl=kl, temperature=T, contexts=4, group_size=4,
                    num_iterations=passes, minibatch=0, minibatches=1)
    full = {**b, "old_logp": old, "ref_logp": ref, "adv": adv,
            "is_weights": np.zeros_like(old), "sampler_logp": np.zeros_like(old)}
    if passes == 1:
        old = lp_now   # what the on-policy step uses instead of the given old_logp
    outs = []
    for micro in (1, 4):
        fns, state = _step_fns(micro, loss_cfg, cfg)
        assert fns.on_policy == (passes == 1)
        state, m = fns.update(state, {}, fns.put_rows(full))
        outs.append((jax.device_get(m), jax.device_get(state["params"])))
    (m1, p1), (m4, p4) = outs
    want = slow_loss(lp_now, old.astype(np.float64), ref.astype(np.float64),
                     adv.astype(np.float64), mask, policy=policy, kl=kl, agg=agg, eps_low=0.2,
                     eps_high=0.28, beta=0.2, max_len=10)
    np.testing.assert_allclose(m1["loss"], want, rtol=1e-5)
    for k in ("loss", "pg_loss", "kl", "grad_norm", "ratio_mean", "clip_frac_low",
              "clip_frac_high"):
        np.testing.assert_allclose(m4[k], m1[k], rtol=1e-5, atol=1e-7, err_msg=k)
    assert m1["grad_norm"] > 0
    p0 = jax.device_get(params0)
    for a0, a, b_ in zip(jax.tree.leaves(p0), jax.tree.leaves(p1), jax.tree.leaves(p4)):
        d1, d4 = a - a0, b_ - a0   # the SGD step = -lr x gradient
        # fp32: sums in another order differ by ~1e-5 of the leaf's largest entry, and a delta
        # read off the params carries the rounding of a0 + d (eps x |a0|)
        tol = max(1e-5 * np.abs(d1).max(), 4 * np.finfo(np.float32).eps * np.abs(a0).max())
        np.testing.assert_allclose(d4, d1, rtol=1e-5, atol=tol)


def test_module_names_registered_once():
    """The registries are the config's vocabulary: every built-in name is listed once."""
    assert gl.POLICY_LOSSES == POLICIES and gl.KL_ESTIMATORS == KLS
    assert gl.ADVANTAGES == ("mean", "grpo", "rloo")
    assert gl.AGGREGATIONS == ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
