"""Generation with a KV cache: one prefill, then a jitted `lax.while_loop` decode.

    res = generate(cfg, params, [[1, 2, 3], [4, 5]], max_new_tokens=32, temperature=0.7,
                   num_samples=8, seed=0, stop_ids=(eos,))
    res.tokens[i * 8 + j, :res.lengths[i * 8 + j]]   # sample j of prompt i, prompt excluded

Layout. Prompts are left-padded to a bucketed length P (padding slots are marked invalid in the
cache, so they are never attended), the cache holds P + max_new_tokens slots, and every row
decodes in lockstep at slot P + step while its RoPE position continues from its own prompt length.
`num_samples` copies of a prompt share one prefill: the prefilled cache rows are repeated, which
is what GRPO groups need. Rows of sample j of prompt i sit at i * num_samples + j.

`logprobs` are log-softmax at temperature 1 of the *chosen* token under the unmodified logits
(before temperature, top-k, top-p), i.e. the behaviour log-probs GRPO's importance ratio needs.
A stop token is kept in the output and counted in `lengths`; after it a row emits padding (0)
with log-prob 0, and the loop exits early once every row has stopped.

Sampling with a partitioner (rossjax.sharding.Partitioner: mesh + rules; or a bare mesh) puts rows
over the batch axes and heads over `tensor` (param and cache shardings from
rossjax.models.shardings); results equal the single-device run. Params already in that layout (as
a trainer holds them) are used as they are, not placed again on every call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from rossjax import models, sharding
from rossjax.errors import ConfigError, InputError
from rossjax.models import ModelConfig, shardings as model_shardings

# Prompt lengths round up to one of these (then to multiples of 512) so a stream of
# different-length prompts compiles a handful of programs, not one per length.
_BUCKETS = (16, 32, 64, 128, 256, 512)


@dataclasses.dataclass
class GenerationResult:
    tokens: np.ndarray        # int32 [n_prompts * num_samples, max_new_tokens], 0 after the end
    logprobs: np.ndarray      # float32 [same], log p(chosen token) at temperature 1, 0 after the end
    lengths: np.ndarray       # int32 [n_prompts * num_samples], stop token included
    finish_reason: list       # "stop" | "length" per row

    def sequences(self) -> list[list[int]]:
        return [self.tokens[i, :n].tolist() for i, n in enumerate(self.lengths)]


def bucket_length(n: int) -> int:
    for b in _BUCKETS:
        if n <= b:
            return b
    return -(-n // 512) * 512


def _filter_logits(logits, temperature, top_k, top_p):
    """Temperature, then top-k (0 = off), then nucleus top-p; dropped entries become the dtype min.

    All three may be traced values, so one compiled sampler serves every sampling setting.
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


def _first_index(hit):
    """argmax of a bool [n, V] (first True; V - 1 if none): two plain reductions, where
    jnp.argmax's variadic (value, index) reduce is ~5x slower on XLA CPU."""
    v = hit.shape[-1]
    idx = jnp.min(jnp.where(hit, jnp.arange(v, dtype=jnp.int32), v), axis=-1)
    return jnp.minimum(idx, v - 1)


@dataclasses.dataclass(frozen=True)
class _Spec:
    """Everything that fixes the compiled program (hashable: one Sampler per distinct spec)."""
    cfg: ModelConfig
    batch: int
    prompt_len: int
    max_new: int
    num_samples: int
    greedy: bool
    n_stop: int
    partitioner: object = None    # rossjax.sharding.Partitioner or None (one device)


class Sampler:
    """The prefill + decode program for one shape, jitted once and reused across calls."""

    def __init__(self, spec: _Spec):
        self.spec = spec
        cfg, part = spec.cfg, spec.partitioner
        if part is None:
            self._fn = jax.jit(self._run)
            return
        rows = part.rows(2, (spec.batch, 1), name="prompts")
        self._param_shardings = model_shardings.param_shardings(cfg, part)
        self._param_leaves = jax.tree.leaves(self._param_shardings)
        n_out = spec.batch * spec.num_samples
        self._cache_spec = model_shardings.cache_shardings(cfg, part, n_out,
                                                           spec.prompt_len + spec.max_new)
        repl = part.replicated()
        out2 = part.rows(2, (n_out, 1), name="samples")
        out1 = part.sharding(P("batch"), (n_out,), name="samples")
        self._in_shardings = (self._param_shardings, rows, rows, rows, repl, repl)
        self._fn = jax.jit(self._run, in_shardings=self._in_shardings,
                           out_shardings=(out2, out2, out1, out1))

    def _constrain(self, cache):
        if self.spec.partitioner is None:
            return cache
        return jax.lax.with_sharding_constraint(cache, self._cache_spec)

    def _run(self, params, tokens, positions, valid, rng, knobs):
        """tokens/positions/valid [B, P] (left-padded) -> (tokens, logprobs [N, T], lengths, stopped)."""
        s = self.spec
        cfg, n_new = s.cfg, s.max_new
        b, plen = tokens.shape
        # On CPU without a mesh the cache is per layer (decode reads and writes it in place, as
        # with decode_params' weights); with a mesh, or on an accelerator, it stays stacked (the
        # sharding rules apply to it as a whole; the layer scan reads it there). Its dtype is
        # cfg.dtype: a bf16 model decodes with a bf16 KV cache.
        per_layer = s.partitioner is None and jax.default_backend() == "cpu"
        cache = models.init_cache(cfg, b, plen + n_new, per_layer=per_layer)
        logits, cache = models.forward_cached(cfg, params, tokens, positions, cache, 0, valid,
                                              logits_to_keep=1)
        last = logits[:, -1]                       # left padding: the last slot is always real
        next_pos = jnp.max(jnp.where(valid, positions, -1), axis=1) + 1
        if s.num_samples > 1:                      # GRPO groups: copy the prefilled rows
            rep = lambda x, axis=0: jnp.repeat(x, s.num_samples, axis=axis)
            rep_kv = (lambda c: tuple(map(rep, c))) if per_layer else (lambda c: rep(c, 1))
            cache = {"k": rep_kv(cache["k"]), "v": rep_kv(cache["v"]),
                     "mask": rep(cache["mask"]), "pos": rep(cache["pos"])}
            last, next_pos = rep(last), rep(next_pos)
        cache = self._constrain(cache)
        n = last.shape[0]
        temperature, top_k, top_p, stop = knobs

        def cond(st):
            i, _, _, _, _, done, _, _ = st
            return (i < n_new) & ~jnp.all(done)

        def body(st):
            i, cache, last, out_tok, out_lp, done, lengths, pos = st
            top = jnp.max(last, axis=-1, keepdims=True)
            if s.greedy:
                tok = _first_index(last == top)
            else:
                filt = _filter_logits(last, temperature, top_k, top_p)
                tok = jax.random.categorical(jax.random.fold_in(rng, i), filt).astype(jnp.int32)
            lse = top[:, 0] + jnp.log(jnp.sum(jnp.exp(last - top), axis=-1))
            lp = jnp.take_along_axis(last, tok[:, None], 1)[:, 0] - lse
            tok = jnp.where(done, 0, tok)
            lp = jnp.where(done, 0.0, lp)
            out_tok = jax.lax.dynamic_update_slice(out_tok, tok[:, None], (0, i))
            out_lp = jax.lax.dynamic_update_slice(out_lp, lp[:, None], (0, i))
            lengths = lengths + (~done).astype(jnp.int32)
            done = done | jnp.any(tok[:, None] == stop[None, :], axis=1)
            logits, cache = models.forward_cached(cfg, params, tok[:, None], pos[:, None], cache,
                                                  plen + i)
            return (i + 1, self._constrain(cache), logits[:, 0], out_tok, out_lp, done, lengths,
                    pos + 1)

        init = (jnp.int32(0), cache, last, jnp.zeros((n, n_new), jnp.int32),
                jnp.zeros((n, n_new), jnp.float32), jnp.zeros((n,), bool),
                jnp.zeros((n,), jnp.int32), next_pos)
        _, _, _, out_tok, out_lp, done, lengths, _ = jax.lax.while_loop(cond, body, init)
        return out_tok, out_lp, lengths, done

    def __call__(self, params, tokens, positions, valid, rng, knobs):
        if self.spec.partitioner is not None:
            if not self._placed(params):  # e.g. params of another layout; a trainer's are placed
                params = jax.device_put(params, self._param_shardings)
            # Host values become global arrays (every process holds the same prompts), so the
            # same call runs on one host or on many.
            rows, repl = self._in_shardings[1], self._in_shardings[4]
            tokens, positions, valid = (sharding.from_host(x, rows) for x in (tokens, positions, valid))
            rng = sharding.from_host(np.asarray(rng), repl)    # a raw uint32 PRNGKey
            knobs = tuple(sharding.from_host(k, repl) for k in knobs)
        elif jax.default_backend() == "cpu":
            # Decode reads per-layer, pre-fused weights (models.decode_params): measured on XLA
            # CPU, where slicing stacked weights copies them every step. It holds a second copy
            # of the layer weights for the call, so accelerators keep the stacked layout.
            params = models.decode_params(self.spec.cfg, params)
        return self._fn(params, tokens, positions, valid, rng, knobs)


    def _placed(self, params) -> bool:
        leaves = jax.tree.leaves(params)
        return len(leaves) == len(self._param_leaves) and all(
            isinstance(x, jax.Array) and x.sharding == s for x, s in zip(leaves, self._param_leaves))


@functools.lru_cache(maxsize=32)
def get_sampler(spec: _Spec) -> Sampler:
    return Sampler(spec)


def generate(cfg: ModelConfig, params, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, stop_ids=(),
             num_samples: int = 1, seed: int = 0, partitioner=None,
             mesh=None) -> GenerationResult:
    """Sample `num_samples` continuations of each prompt (lists of token ids, any lengths).

    temperature 0 is greedy. Same seed and inputs give the same samples. `partitioner` (or a bare
    `mesh`, with the default rules) runs the sampler sharded; None runs on one device.
    """
    part = sharding.as_partitioner(partitioner if partitioner is not None else mesh)
    prompts = [list(map(int, p)) for p in prompts]
    if not prompts:
        raise InputError("generate: field 'prompts' is empty.")
    for i, p in enumerate(prompts):
        if not p:
            raise InputError(f"generate: prompts row {i} is empty; every prompt needs at least one token.")
        if min(p) < 0 or max(p) >= cfg.vocab_size:
            raise InputError(f"generate: prompts row {i} holds a token id outside [0, {cfg.vocab_size}).")
    if max_new_tokens < 1 or num_samples < 1:
        raise ConfigError("generate: fields 'max_new_tokens' and 'num_samples' must be >= 1.")
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ConfigError("generate: need temperature >= 0, 0 < top_p <= 1 and top_k >= 0.")

    n = len(prompts)
    # Pad the batch so each prompt's copies split evenly over the batch shards; dummy rows
    # (one token) are dropped at the end.
    mult = 1 if part is None else part.batch_size_multiple()
    b = -(-n // mult) * mult
    plen = bucket_length(max(len(p) for p in prompts))
    tokens = np.zeros((b, plen), np.int32)
    positions = np.zeros((b, plen), np.int32)
    valid = np.zeros((b, plen), bool)
    for i in range(b):
        p = prompts[i] if i < n else [0]
        tokens[i, plen - len(p):] = p
        positions[i, plen - len(p):] = np.arange(len(p))
        valid[i, plen - len(p):] = True
    stop = np.asarray([int(t) for t in stop_ids] or [-1], np.int32)
    spec = _Spec(cfg, b, plen, int(max_new_tokens), int(num_samples), temperature == 0.0,
                 len(stop), part)
    knobs = (np.float32(max(temperature, 1e-6)), np.int32(top_k), np.float32(top_p), stop)
    out_tok, out_lp, lengths, stopped = get_sampler(spec)(
        params, tokens, positions, valid, jax.random.PRNGKey(seed), knobs)
    keep = n * num_samples
    out_tok, out_lp, lengths, stopped = (sharding.to_host(x)[:keep]
                                         for x in (out_tok, out_lp, lengths, stopped))
    return GenerationResult(out_tok, out_lp, lengths,
                            ["stop" if s else "length" for s in stopped])
