"""Token selection for a batch of slots, each with its own sampling settings and random stream.

Per slot: temperature (0 = greedy), top-k (0 = off), top-p (1 = off), a raw uint32 PRNG key and
a count of tokens drawn so far; token t of a slot is drawn with `fold_in(key, t)`, so a
sequence's samples do not depend on which slot it sits in or who else is decoding.

`logprobs` are the log-softmax of logits / T (the slot's temperature; T = 1 for greedy slots)
at the *chosen* token, before top-k / top-p: the distribution GRPO's trainer scores
(grpo_step.sampling_temperature), so its importance ratio compares like with like.

Modes fix the compiled program: "greedy" (every slot greedy: no sort, no draws), "plain"
(temperature only: one draw from logits / T, no vocab sort), "filtered" (top-k / top-p: the
sort). Greedy slots stay greedy in every mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MODES = ("greedy", "plain", "filtered")


def filter_logits(logits, temperature, top_k, top_p):
    """Temperature, then top-k (0 = off), then nucleus top-p; dropped entries become the dtype min.

    All three may be traced values (scalars, or [n, 1] per row), so one compiled sampler serves
    every sampling setting.
    """
    logits = logits / temperature
    neg = jnp.finfo(logits.dtype).min
    vocab = logits.shape[-1]
    srt = jnp.sort(logits, axis=-1)[..., ::-1]
    rank = jnp.arange(vocab)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    srt = jnp.where(rank < k, srt, neg)
    probs = jax.nn.softmax(srt, axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    keep = ((jnp.cumsum(probs, axis=-1) - probs) < top_p) & (rank < k)
    cutoff = jnp.min(jnp.where(keep, srt, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < cutoff, neg, logits)


def first_index(hit):
    """argmax of a bool [n, V] (first True; V - 1 if none): two plain reductions, where
    jnp.argmax's variadic (value, index) reduce is ~5x slower on XLA CPU."""
    v = hit.shape[-1]
    idx = jnp.min(jnp.where(hit, jnp.arange(v, dtype=jnp.int32), v), axis=-1)
    return jnp.minimum(idx, v - 1)


def mode_for(temperatures, top_ks, top_ps) -> str:
    """The cheapest mode that serves these (host) settings."""
    if all(t <= 0 for t in temperatures):
        return "greedy"
    sampled = [(k, p) for t, k, p in zip(temperatures, top_ks, top_ps) if t > 0]
    return "plain" if all(k == 0 and p >= 1.0 for k, p in sampled) else "filtered"


def select(last, temperature, top_k, top_p, keys, count, mode: str, top_n: int = 0):
    """last [n, V] float32 logits; per-row knobs [n]; keys [n, 2] uint32; count [n] int32.
    Returns (tokens [n] int32, log p(token) under logits / T [n] float32: the temperature the
    row samples at, T = 1 for greedy rows; before top-k / top-p, as the GRPO trainer scores it).
    top_n > 0 (static): also (ids [n, top_n] int32, log-probs [n, top_n]) of the likeliest
    tokens under that same distribution, best first (ties: the lower id first, as greedy)."""
    top = jnp.max(last, axis=-1, keepdims=True)
    greedy_tok = first_index(last == top)
    if mode == "greedy":
        tok = greedy_tok
        scaled = last
    else:
        is_greedy = temperature <= 0
        temp = jnp.where(is_greedy, 1.0, temperature)[:, None]
        if mode == "plain":
            filt = last / temp
        else:
            filt = filter_logits(last, temp, top_k[:, None], top_p[:, None])
        step_keys = jax.vmap(jax.random.fold_in)(keys, count)
        drawn = jax.vmap(jax.random.categorical)(step_keys, filt).astype(jnp.int32)
        tok = jnp.where(is_greedy, greedy_tok, drawn)
        scaled = last / temp
    top = jnp.max(scaled, axis=-1, keepdims=True)
    lse = top[:, 0] + jnp.log(jnp.sum(jnp.exp(scaled - top), axis=-1))
    lp = jnp.take_along_axis(scaled, tok[:, None], 1)[:, 0] - lse
    if not top_n:
        return tok, lp
    vals, ids = jax.lax.top_k(scaled, min(top_n, scaled.shape[-1]))
    return tok, lp, ids.astype(jnp.int32), vals - lse[:, None]
