"""KL-to-reference estimators (a registry, `config.grpo.kl`), per token, for the GRPO loss's
beta x KL term and its `kl` metric.

An estimator is `fn(logp, ref_logp, old_logp) -> [B, T]` float32: logp carries the gradient,
ref_logp (frozen reference) and old_logp (the policy that sampled, for importance correction)
do not, and all three are 0 at padding, where every estimator here is 0. Definitions follow
Schulman's "Approximating KL divergence" (k1, k2, k3) as TRL and verl name them; `k3` is the
default (GRPO's, TRL's `beta` term, verl's `low_var_kl` without its [-10, 10] clamp).
"""

from __future__ import annotations

import jax.numpy as jnp

from rossjax.train.registry import Registry

KL_REGISTRY = Registry("KL estimator", "config.grpo.kl")


@KL_REGISTRY.register("k1")
def k1(logp, ref_logp, old_logp):
    """log pi / pi_ref: unbiased for KL(pi || pi_ref) on pi's samples, high variance, can be < 0."""
    return logp - ref_logp


@KL_REGISTRY.register("k2")
def k2(logp, ref_logp, old_logp):
    """(log pi - log pi_ref)^2 / 2: biased but >= 0; its gradient is the KL's (verl `mse`)."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_REGISTRY.register("k3")
def k3(logp, ref_logp, old_logp):
    """pi_ref / pi - log(pi_ref / pi) - 1: unbiased on pi's own samples, >= 0, low variance."""
    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0


@KL_REGISTRY.register("k3_unbiased")
def k3_importance_corrected(logp, ref_logp, old_logp):
    """(pi / pi_old) x k3: the importance-corrected estimator (DeepSeek-V3.2; TRL's
    `use_bias_correction_kl`). The tokens were drawn from pi_old, so weighting k3 by the ratio
    makes its value unbiased for KL(pi || pi_ref), and, the ratio carrying the gradient, its
    gradient unbiased for that KL's gradient: E_old[(pi / pi_old) k3] = E_pi[k3] = KL. The
    log-ratio is clamped to +-20 as the surrogate's is, so exp cannot overflow."""
    ratio = jnp.exp(jnp.clip(logp - old_logp, -20.0, 20.0))
    return ratio * k3(logp, ref_logp, old_logp)
