"""The device half of the engine: a fixed pool of KV-cache slots and the three jitted programs
that act on it (insert a prefill, extend a live sequence, decode a chunk of steps).

State (a dict pytree, donated to every program so XLA updates it in place):
    cache     the model's KV cache (models.init_cache) with one row per slot: k/v [.., S, K, T, hd],
              slot validity `mask` [S, T] and stored RoPE positions `pos` [S, T]
    write_col [S] next cache column a slot writes;  pos_next [S] its next RoPE position
    last      [S, V] float32 logits of the next token;  active [S] decoding now;  budget [S] tokens
              it may still emit this turn
    temp, top_k, top_p [S], stop [S, n_stop] (-1 = none), key [S, 2] uint32, count [S] int32
              (the sampling settings: per slot, so one program serves every request)

Each slot writes at its own column, so a step is the model's `forward_cached` vmapped over rows
(one query per row at `write_col[s]`; the cache write becomes a scatter). Prompts are left-padded to a
bucketed length and prefilled into a fresh [n, P] cache, whose rows are then copied into the
slots (one prefill for a prompt's G candidates). An extension (a tool observation) runs the
same way over the gathered rows of its slots, at their current columns, and is scattered back:
the history is never prefilled again. Padding columns stay invalid in `mask`, so no query sees
them; what an earlier occupant left in a slot's later columns is invalid too.

Layout as in rossjax.sample: on CPU without a mesh the cache is per layer and weights are
models.decode_params (decode reads and writes it in place); with a partitioner (or off CPU) the
cache is stacked and sharded by models.shardings.cache_shardings (slots over the batch axes,
kv heads over `tensor`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.sharding import PartitionSpec as P

from rossjax import models, sharding
from rossjax.engine import sampler
from rossjax.engine.stream import hook as _host_hook
from rossjax.models import ModelConfig, shardings as model_shardings


@dataclasses.dataclass(frozen=True)
class Layout:
    """What fixes the compiled programs (hashable)."""
    cfg: ModelConfig
    slots: int
    max_len: int
    n_stop: int
    partitioner: object = None

    @property
    def per_layer(self) -> bool:
        return self.partitioner is None and jax.default_backend() == "cpu"


def init_state(layout: Layout) -> dict:
    cfg, s = layout.cfg, layout.slots
    return {"cache": models.init_cache(cfg, s, layout.max_len, per_layer=layout.per_layer),
            "write_col": jnp.zeros((s,), jnp.int32), "pos_next": jnp.zeros((s,), jnp.int32),
            "last": jnp.zeros((s, cfg.vocab_size), jnp.float32),
            "active": jnp.zeros((s,), bool), "budget": jnp.zeros((s,), jnp.int32),
            "temp": jnp.zeros((s,), jnp.float32), "top_k": jnp.zeros((s,), jnp.int32),
            "top_p": jnp.ones((s,), jnp.float32), "stop": jnp.full((s, layout.n_stop), -1, jnp.int32),
            "key": jnp.zeros((s, 2), jnp.uint32), "count": jnp.zeros((s,), jnp.int32)}


def _kv_axis(layout: Layout) -> int:
    return 0 if layout.per_layer else 1     # the slot axis of k/v leaves


def _rows_of(layout: Layout, cache, idx):
    """The cache rows of slots `idx` [e] (a gather)."""
    ax = _kv_axis(layout)
    kv = lambda x: jnp.take(x, idx, axis=ax, mode="clip")
    return {"k": jax.tree.map(kv, cache["k"]), "v": jax.tree.map(kv, cache["v"]),
            "mask": cache["mask"][jnp.clip(idx, 0, layout.slots - 1)],
            "pos": cache["pos"][jnp.clip(idx, 0, layout.slots - 1)]}


def _put_rows(layout: Layout, cache, idx, rows, width=None):
    """Write `rows` (a cache of e rows, `width` columns, default all) into slots `idx`; indices
    >= slots (padding rows) are dropped."""
    ax = _kv_axis(layout)
    w = rows["mask"].shape[1] if width is None else width

    def put(big, small):
        at = (slice(None),) * ax + (idx, slice(None), slice(0, w))
        return big.at[at].set(small[(slice(None),) * (ax + 2) + (slice(0, w),)], mode="drop")

    out = {"k": jax.tree.map(put, cache["k"], rows["k"]), "v": jax.tree.map(put, cache["v"], rows["v"])}
    t = layout.max_len
    for name in ("mask", "pos"):
        full = rows[name][:, :w]
        if w < t:  # columns past the copied ones: invalid (stale data of an earlier occupant)
            full = jnp.pad(full, ((0, 0), (0, t - w)))
        out[name] = cache[name].at[idx].set(full, mode="drop")
    return out


def forward_rows(layout: Layout, params, tokens, positions, cache, col, token_mask, logits_to_keep=0):
    """models.forward_cached with a cache column per row: tokens [b, t] written at
    [col[r], col[r] + t) of row r. Returns (logits [b, t or keep, V], new cache)."""
    ax = _kv_axis(layout)
    axes = {"k": ax, "v": ax, "mask": 0, "pos": 0}

    def one(tok, pos, c, ci, tm):
        c1 = {"k": jax.tree.map(lambda x: jnp.expand_dims(x, ax), c["k"]),
              "v": jax.tree.map(lambda x: jnp.expand_dims(x, ax), c["v"]),
              "mask": c["mask"][None], "pos": c["pos"][None]}
        logits, c2 = models.forward_cached(layout.cfg, params, tok[None], pos[None], c1, ci, tm[None],
                                           logits_to_keep=logits_to_keep)
        sq = lambda x: jnp.squeeze(x, ax)
        return logits[0], {"k": jax.tree.map(sq, c2["k"]), "v": jax.tree.map(sq, c2["v"]),
                           "mask": c2["mask"][0], "pos": c2["pos"][0]}

    return jax.vmap(one, in_axes=(0, 0, axes, 0, 0), out_axes=(0, axes))(
        tokens, positions, cache, col, token_mask)


def _set_columns(state, idx, settings):
    """state[name][idx] = value for each per-slot entry of `settings` (padding idx dropped)."""
    out = dict(state)
    for name, val in settings.items():
        out[name] = state[name].at[idx].set(val, mode="drop")
    return out


def insert(layout: Layout, params, state, tokens, positions, valid, slot_idx, src_row, settings):
    """Prefill left-padded prompts tokens [n, P] into a fresh cache, then copy row src_row[m] into
    slot slot_idx[m] (m >= n: a prompt's candidates share its prefill). settings: per-slot values
    [m] for temp, top_k, top_p, stop [m, n_stop], key [m, 2], budget; count restarts at 0."""
    n, plen = tokens.shape
    fresh = models.init_cache(layout.cfg, n, plen, per_layer=layout.per_layer)
    logits, fresh = models.forward_cached(layout.cfg, params, tokens, positions, fresh, 0, valid,
                                          logits_to_keep=1)
    ax = _kv_axis(layout)
    rows = {"k": jax.tree.map(lambda x: jnp.take(x, src_row, axis=ax), fresh["k"]),
            "v": jax.tree.map(lambda x: jnp.take(x, src_row, axis=ax), fresh["v"]),
            "mask": fresh["mask"][src_row], "pos": fresh["pos"][src_row]}
    out = dict(state, cache=_put_rows(layout, state["cache"], slot_idx, rows))
    next_pos = jnp.max(jnp.where(valid, positions, -1), axis=1) + 1
    m = slot_idx.shape[0]
    out = _set_columns(out, slot_idx, {
        **settings, "write_col": jnp.full((m,), plen, jnp.int32), "pos_next": next_pos[src_row],
        "last": logits[src_row, -1], "active": jnp.ones((m,), bool),
        "count": jnp.zeros((m,), jnp.int32)})
    return out


def fork(layout: Layout, state, dst, src, end, n_tokens, settings):
    """Slot dst[f] takes the cache columns [0, end[f]) of slot src[f] (a cached prefix of
    n_tokens[f] tokens; dst may be src), nothing valid past them, and sampling settings as
    insert's; it is not active until an extension runs the rest of its prompt. Every source row
    is read before any is written."""
    rows = _rows_of(layout, state["cache"], src)
    rows["mask"] = rows["mask"] & (jnp.arange(layout.max_len)[None, :] < end[:, None])
    out = dict(state, cache=_put_rows(layout, state["cache"], dst, rows, width=layout.max_len))
    f = dst.shape[0]
    return _set_columns(out, dst, {
        **settings, "write_col": end, "pos_next": n_tokens, "active": jnp.zeros((f,), bool),
        "count": jnp.zeros((f,), jnp.int32)})


def extend(layout: Layout, params, state, tokens, valid, slot_idx, budget):
    """Append left-padded tokens [e, C] to live slots `slot_idx` [e] at their current columns
    (positions continue from each slot's pos_next); the slots decode again with `budget`."""
    e, c = tokens.shape
    safe = jnp.clip(slot_idx, 0, layout.slots - 1)
    col, pos0 = state["write_col"][safe], state["pos_next"][safe]
    positions = pos0[:, None] + jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1
    positions = jnp.where(valid, positions, 0)
    rows = _rows_of(layout, state["cache"], slot_idx)
    logits, rows = forward_rows(layout, params, tokens, positions, rows, col, valid, logits_to_keep=1)
    # Rows are written back whole (their columns beyond this chunk are unchanged).
    cache = _put_rows(layout, state["cache"], slot_idx, rows, width=layout.max_len)
    out = dict(state, cache=cache)
    return _set_columns(out, slot_idx, {
        "write_col": col + c, "pos_next": pos0 + jnp.sum(valid, axis=1, dtype=jnp.int32),
        "last": logits[:, -1], "active": jnp.ones((e,), bool), "budget": budget})


def _host_call(listener, emitted, out_tok, out_lp):
    """A streaming decode's call to the host (rossjax.engine.stream): (halt, gap). out_lp: the
    log-prob buffers (lp, or lp, top ids, top log-probs)."""
    return io_callback(_host_hook, (jax.ShapeDtypeStruct((), jnp.bool_),
                                     jax.ShapeDtypeStruct((), jnp.int32)),
                       listener, emitted, out_tok, *out_lp, ordered=False)


def decode(layout: Layout, params, state, exit_on_free, listener=None, first_call=None, *,
           steps: int, mode: str, stream: bool = False, top_n: int = 0):
    """Up to `steps` decode steps over every slot (inactive slots compute but change nothing);
    stops early once no slot is active, or, with exit_on_free, after a step that ended one (so
    a waiting request can take its slot). Returns (state, tokens [S, steps], logprobs, emitted [S]),
    with top_n > 0 (static) also the top_n likeliest tokens' ids and log-probs [S, steps, top_n].
    stream: the host is called (rossjax.engine.stream) after step `first_call` and then every
    `gap` steps it asks for, with what every row has emitted so far; it may end the chunk (halt).
    The steps between calls are a plain inner loop (a call or a branch inside every step would
    cost every step)."""
    s = layout.slots
    stop = state["stop"]
    start_count = state["count"]
    top_n = min(int(top_n), layout.cfg.vocab_size)

    def going(c):
        i, st, _, _, freed = c
        return (i < steps) & jnp.any(st["active"]) & ~(exit_on_free & freed)

    def body(c):
        i, st, out_tok, out_lp, freed = c
        act = st["active"]
        tok, *lps = sampler.select(st["last"], st["temp"], st["top_k"], st["top_p"], st["key"],
                                   st["count"], mode, top_n)
        tok = jnp.where(act, tok, 0)
        lps[0] = jnp.where(act, lps[0], 0.0)
        out_tok = jax.lax.dynamic_update_slice(out_tok, tok[:, None], (0, i))
        out_lp = tuple(jax.lax.dynamic_update_slice(buf, x[:, None], (0, i) + (0,) * (x.ndim - 1))
                       for buf, x in zip(out_lp, lps))
        budget = st["budget"] - act.astype(jnp.int32)
        ended = act & (jnp.any(tok[:, None] == stop, axis=1) | (budget <= 0))
        # Every emitted token (a stop token too) enters the cache: a held sequence can be
        # extended right after it. Inactive rows write nothing valid and do not advance.
        logits, cache = forward_rows(layout, params, tok[:, None], st["pos_next"][:, None],
                                     st["cache"], st["write_col"], act[:, None])
        a = act.astype(jnp.int32)
        st = dict(st, cache=cache, write_col=st["write_col"] + a, pos_next=st["pos_next"] + a,
                  count=st["count"] + a, budget=budget, active=act & ~ended,
                  last=jnp.where(act[:, None], logits[:, 0], st["last"]))
        return i + 1, st, out_tok, out_lp, freed | jnp.any(ended)

    out_tok = jnp.zeros((s, steps), jnp.int32)
    bufs = (jnp.zeros((s, steps), jnp.float32),)
    if top_n:
        bufs += (jnp.zeros((s, steps, top_n), jnp.int32), jnp.zeros((s, steps, top_n), jnp.float32))
    init = (jnp.int32(0), state, out_tok, bufs, jnp.bool_(False))
    if not stream:
        _, state, out_tok, out_lp, _ = jax.lax.while_loop(going, body, init)
        return (state, out_tok, out_lp[0], state["count"] - start_count, *out_lp[1:])

    def segment(oc):
        c, _, last_call = oc
        c = jax.lax.while_loop(lambda c: going(c) & (c[0] <= last_call), body, c)
        call = lambda: _host_call(listener, c[1]["count"] - start_count, c[2], c[3])
        halt, gap = jax.lax.cond(going(c), call, lambda: (jnp.bool_(False), jnp.int32(1)))
        return c, halt, c[0] - 1 + jnp.maximum(gap, 1)

    c, _, _ = jax.lax.while_loop(lambda oc: going(oc[0]) & ~oc[1], segment,
                                 (init, jnp.bool_(False), first_call))
    _, state, out_tok, out_lp, _ = c
    return (state, out_tok, out_lp[0], state["count"] - start_count, *out_lp[1:])


def _slot_axes(layout: Layout, state):
    ax = _kv_axis(layout)
    return {k: ({"k": ax, "v": ax, "mask": 0, "pos": 0} if k == "cache" else 0) for k in state}


def decode_compact(layout: Layout, params, state, idx, exit_on_free, listener=None,
                   first_call=None, *, steps: int, mode: str, stream: bool = False,
                   top_n: int = 0):
    """`decode` over slots `idx` [k] only (distinct; padding entries name idle slots): their rows
    are gathered into a k-slot state, decoded, and written back. Once most sequences of a batch
    have ended, the steps then cost k rows instead of every slot's."""
    sub_layout = dataclasses.replace(layout, slots=int(idx.shape[0]))
    axes = _slot_axes(layout, state)

    def take(x, ax):
        return jax.tree.map(lambda a, ax=ax: jnp.take(a, idx, axis=ax), x)

    sub = {k: take(v, axes[k]) if k != "cache" else
           {n: take(v[n], axes[k][n]) for n in v} for k, v in state.items()}
    sub, out_tok, out_lp, emitted, *top = decode(sub_layout, params, sub, exit_on_free, listener,
                                                 first_call, steps=steps, mode=mode,
                                                 stream=stream, top_n=top_n)

    def put(big, small, ax):
        at = (slice(None),) * ax + (idx,)
        return jax.tree.map(lambda b, s_: b.at[at].set(s_), big, small)

    out = {k: put(v, sub[k], axes[k]) if k != "cache" else
           {n: put(v[n], sub[k][n], axes[k][n]) for n in v} for k, v in state.items()}
    return (out, out_tok, out_lp, emitted, *top)


class Programs:
    """The jitted insert / extend / decode programs of one Layout (shardings fixed once)."""

    def __init__(self, layout: Layout):
        self.layout = layout
        part = layout.partitioner
        self._decode = {}
        if part is None:
            self.state_shardings = self._param_sh = self._repl = None
            self._out = lambda extra=(): None
        else:
            s = layout.slots
            self._param_sh = model_shardings.param_shardings(layout.cfg, part)
            self._repl = part.replicated()
            rows1 = part.sharding(P("batch"), (s,), name="slots")
            rows2 = part.rows(2, (s, 1), name="slots")
            sh = {k: rows1 for k in ("write_col", "pos_next", "active", "budget", "temp", "top_k",
                                     "top_p", "count")}
            self.state_shardings = {**sh, "cache": model_shardings.cache_shardings(
                layout.cfg, part, s, layout.max_len), "last": rows2, "stop": rows2, "key": rows2}
            self._out = lambda extra=(): (self.state_shardings if not extra
                                          else (self.state_shardings, *extra))
            self._decode_out = (rows2, rows2, rows1)
        self._insert = jax.jit(functools.partial(insert, layout), donate_argnums=1,
                               out_shardings=self._out())
        self._extend = jax.jit(functools.partial(extend, layout), donate_argnums=1,
                               out_shardings=self._out())
        self._fork = jax.jit(functools.partial(fork, layout), donate_argnums=0,
                             out_shardings=self._out())

    def _host(self, tree):
        """Host values -> global replicated arrays on a mesh (every process holds the same)."""
        if self._repl is None:
            return tree
        return jax.tree.map(lambda x: sharding.from_host(x, self._repl), tree)

    def insert(self, params, state, *host):
        return self._insert(params, state, *self._host(host))

    def extend(self, params, state, *host):
        return self._extend(params, state, *self._host(host))

    def fork(self, state, *host):
        return self._fork(state, *self._host(host))

    def decode(self, params, state, exit_on_free: bool, steps: int, mode: str, stream=None,
               top_n: int = 0):
        """stream: None, or (listener id, first call step) for a streaming decode (unsharded).
        top_n: 0, or the static k of the top log-probs (a program of its own)."""
        return self.decode_program(steps, mode, stream is not None, top_n)(
            params, state, *self._host((np.bool_(exit_on_free),)), *_stream_args(stream))

    def decode_program(self, steps: int, mode: str, streaming: bool = False, top_n: int = 0):
        """The jitted decode program of these static settings, built once (also what
        `rossjax plan` compiles)."""
        key = (steps, mode, streaming, top_n)
        if key not in self._decode:
            fn = functools.partial(decode, self.layout, steps=steps, mode=mode,
                                   stream=streaming, top_n=top_n)
            out = None if self._repl is None else self._out(
                self._decode_out + ((self._repl, self._repl) if top_n else ()))
            self._decode[key] = jax.jit(fn, donate_argnums=1, out_shardings=out)
        return self._decode[key]

    def decode_compact(self, params, state, idx, exit_on_free: bool, steps: int, mode: str,
                       stream=None, top_n: int = 0):
        key = ("compact", int(idx.shape[0]), steps, mode, stream is not None, top_n)
        if key not in self._decode:
            self._decode[key] = jax.jit(functools.partial(
                decode_compact, self.layout, steps=steps, mode=mode, stream=stream is not None,
                top_n=top_n), donate_argnums=1)
        return self._decode[key](params, state, idx, np.bool_(exit_on_free),
                                 *_stream_args(stream))

    def new_state(self):
        st = init_state(self.layout)
        if self.state_shardings is not None:
            st = jax.device_put(st, self.state_shardings)
        return st

    def place_params(self, params):
        """Params as the programs read them: decode layout on CPU, the partitioner's layout on a
        mesh (kept as they are when already placed, as a trainer holds them)."""
        if self.layout.partitioner is None:
            if jax.default_backend() == "cpu":
                return models.decode_params(self.layout.cfg, params)
            return params
        leaves, want = jax.tree.leaves(params), jax.tree.leaves(self._param_sh)
        placed = len(leaves) == len(want) and all(
            isinstance(x, jax.Array) and x.sharding == s for x, s in zip(leaves, want))
        return params if placed else jax.device_put(params, self._param_sh)


def _stream_args(stream) -> tuple:
    return () if stream is None else (np.int32(stream[0]), np.int32(stream[1]))


@functools.lru_cache(maxsize=16)
def programs(layout: Layout) -> Programs:
    return Programs(layout)
