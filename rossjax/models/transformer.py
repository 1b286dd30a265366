"""The decoder, applied functionally: params pytree in, arrays out.

Params layout (stable; hf.py maps it to Hugging Face names):
    {"embed":      {"embedding": [vocab, d]},
     "layers":     Block params stacked on a leading [n_layers] axis:
                   {"attn_norm": {"scale"}, "attn": {"q", "k", "v", "o", ["q_norm", "k_norm"]},
                    "mlp_norm": {"scale"}, "mlp": {"gate", "up", "down"}},
     "final_norm": {"scale": [d]},
     "lm_head":    {"kernel": [d, vocab]}}          # absent when cfg.tie_embeddings

Hidden-state convention (matches transformers' `output_hidden_states`): index 0 is the token
embeddings, index i in 1..L-1 is the raw residual stream after block i (1-based), and index L is
the output of the last block *after the final RMSNorm* — exactly `hidden_states(...)`.

Masking: a token attends to earlier-or-equal positions in the row that carry the same segment id
(so padding, given segment id 0, only ever attends to padding and never leaks into real tokens).
"""

from __future__ import annotations

import contextlib
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from rossjax import sharding
from rossjax.errors import ConfigError
from rossjax.models.attention import SHARED_SEGMENT, MaskSpec
from rossjax.models.config import ModelConfig
from rossjax.models.kernels.activations import CURRENT as _ACTIVATIONS, Activations
from rossjax.models.layers import Block, Embed, LMHead, RMSNorm, fuse_kernels, rope_cos_sin

_REMAT = {"full": jax.checkpoint_policies.nothing_saveable,
          "dots": jax.checkpoint_policies.checkpoint_dots,
          "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims}


def _rule_axes(part, logical: str) -> tuple[str, ...]:
    axes = part.spec(P(logical))[0]
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


@contextlib.contextmanager
def shard_activations(mesh, batch_axes=None):
    """Trace model calls in this context to keep the residual stream's rows [b, ...] split over
    the batch axes of `mesh` (a Mesh, or a sharding.Partitioner whose rules say which): the mesh
    axes of the rule for the logical axis "batch" (default data x fsdp), unless `batch_axes` names
    them. Without it, XLA's propagation meets an fsdp-sharded embedding table ([vocab, embed]
    split over fsdp) and rows split over the same fsdp axis, and may keep the table's split and
    gather every row onto every device (measured: the whole global batch's activations on each
    device, 8x the compute and memory at fsdp=8). The splash kernel runs per shard (shard_map)
    on these axes, and on the "kv_heads" rule's axes where they divide the kv heads."""
    part = sharding.as_partitioner(mesh)
    live = lambda axes: tuple(a for a in axes if a in part.mesh.axis_names and part.mesh.shape[a] > 1)
    batch = live(_rule_axes(part, "batch") if batch_axes is None else tuple(batch_axes))
    heads = tuple(a for a in live(_rule_axes(part, "kv_heads")) if a not in batch)
    token = _ACTIVATIONS.set(Activations(part.mesh, batch, heads) if batch or heads else None)
    try:
        yield
    finally:
        _ACTIVATIONS.reset(token)


def under_mesh(fn, mesh):
    """`fn` traced inside `shard_activations(mesh)` (wrap a step before jax.jit); `mesh` may be a
    Partitioner, whose rules then place the rows."""
    @functools.wraps(fn)
    def wrapped(*args, **kw):
        with shard_activations(mesh):
            return fn(*args, **kw)
    return wrapped


def _rows(x, act):
    """x [b, ...] constrained to rows over the context's batch axes (when they divide b)."""
    if act is None or not act.batch:
        return x
    mesh, axes = act.mesh, act.batch
    if x.shape[0] % math.prod(mesh.shape[a] for a in axes):
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(axes, *[None] * (x.ndim - 1))))


def _dummies(cfg: ModelConfig):
    dt = jnp.dtype(cfg.dtype)
    x = jnp.zeros((1, 1, cfg.d_model), dt)
    cs = jnp.zeros((1, 1, cfg.head_dim), jnp.float32)
    ids = jnp.zeros((1, 1), jnp.int32)
    return x, cs, cs, MaskSpec(ids, ids, ids[0], ids[0], ids, ids, jnp.int32(0))


def _init_boxed(cfg: ModelConfig, rng, *, stacked: bool):
    """Init with nn.LogicallyPartitioned boxes; `stacked=False` gives one un-stacked Block."""
    k_emb, k_layers, k_head = jax.random.split(rng, 3)
    x, cos, sin, mask = _dummies(cfg)
    block_init = lambda r: Block(cfg).init(r, x, cos, sin, mask)["params"]
    params = {"embed": Embed(cfg).init(k_emb, jnp.zeros((1, 1), jnp.int32))["params"]}
    if stacked:
        params["layers"] = jax.vmap(lambda r: nn.unbox(block_init(r)))(
            jax.random.split(k_layers, cfg.n_layers))
    else:
        params["layers"] = block_init(k_layers)
    params["final_norm"] = RMSNorm(cfg).init(k_head, x)["params"]
    if not cfg.tie_embeddings:
        params["lm_head"] = LMHead(cfg).init(k_head)["params"]
    return params


@functools.partial(jax.jit, static_argnames=("cfg",))
def _init(rng, *, cfg):
    return nn.unbox(_init_boxed(cfg, rng, stacked=True))


def init_params(cfg: ModelConfig, rng):
    """Random init (normal(initializer_range) kernels and embeddings, ones for norms, zero biases)."""
    return _init(rng, cfg=cfg)


def logical_axes(cfg: ModelConfig):
    """Pytree (same structure as params) of PartitionSpecs holding logical axis names."""
    boxed = jax.eval_shape(lambda r: _init_boxed(cfg, r, stacked=False), jax.random.key(0))
    specs = nn.get_partition_spec(boxed)
    is_spec = lambda s: isinstance(s, jax.sharding.PartitionSpec)
    specs["layers"] = jax.tree.map(lambda s: jax.sharding.PartitionSpec("layers", *s),
                                   specs["layers"], is_leaf=is_spec)
    return specs


def lm_head(cfg: ModelConfig, params):
    """The output projection [d_model, vocab] (the embedding transposed when tied)."""
    if "lm_head" in params:  # untied, or tied with the transpose materialized by decode_params
        return params["lm_head"]["kernel"]
    return params["embed"]["embedding"].T


def compute_logits(cfg: ModelConfig, params, hidden):
    """float32 logits from final hidden states [..., d]; chunked losses should call this per chunk."""
    head = lm_head(cfg, params).astype(hidden.dtype)
    return jnp.einsum("...d,dv->...v", hidden, head, preferred_element_type=jnp.float32)


def default_positions(segment_ids):
    """Positions that restart at 0 at every segment boundary (packed rows)."""
    b, s = segment_ids.shape
    idx = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    start = jnp.concatenate([jnp.ones((b, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], 1)
    return idx - jax.lax.cummax(jnp.where(start, idx, 0), axis=1)


def _stack(cfg: ModelConfig, layers, x, cos, sin, mask: MaskSpec, *, collect: bool, kv=None,
           cache_mask: MaskSpec | None = None, cache_index=None, act=None):
    """Run all blocks. Returns (x, per-layer outputs [L, b, s, d] or None, updated kv or None).

    `kv` is the cache's (k, v), stacked [L, b, K, T, hd] or per-layer tuples of [b, K, T, hd]:
    each layer writes this call's s slots at `cache_index`, then attends over its cache (see
    layers.Attention). Stacked layers run as a scan; per-layer weights or cache as a python loop.
    Layer windows are set per layer.
    """
    block = Block(cfg)
    windows = jnp.asarray(cfg.layer_windows(), jnp.int32)
    s = x.shape[1]

    def body(h, p, window, layer_kv):
        m = mask._replace(window=window)
        cm = None if cache_mask is None else cache_mask._replace(window=window)
        h, new_kv = block.apply({"params": p}, h, cos, sin, m, layer_kv, cm, cache_index)
        h = _rows(h, act)
        return h, (h if collect else None), new_kv

    def write_back(stacked, layer_cache, i):
        """Only this call's slots go back into a stacked cache (not the whole layer)."""
        new = jax.lax.dynamic_slice_in_dim(layer_cache, cache_index, s, axis=2)
        return jax.lax.dynamic_update_slice(stacked, new[None], (i, 0, 0, cache_index, 0))

    if cfg.remat_policy != "none":
        body = jax.checkpoint(body, policy=_REMAT[cfg.remat_policy], prevent_cse=not cfg.scan_layers)
    split = isinstance(layers, (list, tuple))          # decode_params: one buffer per layer
    kv_split = kv is not None and isinstance(kv[0], (list, tuple))   # init_cache(per_layer=True)
    if cfg.scan_layers and not split and not kv_split:
        def scan_body(carry, xs):
            h, cache = carry
            p, window, i = xs
            h, out, new_kv = body(h, p, window, None if cache is None else (cache[0][i], cache[1][i]))
            if cache is not None:
                cache = tuple(write_back(c, n, i) for c, n in zip(cache, new_kv))
            return (h, cache), out

        # Small stacks without remat: let XLA unroll the scan (one program across layer
        # boundaries is ~5-12% faster on CPU; compile time grows with depth, hence the cap).
        # With remat the loop stays rolled so rematerialized values are never CSE'd away.
        small = cfg.n_layers <= 16 and cfg.remat_policy == "none" and kv is None
        xs = (layers, windows, jnp.arange(cfg.n_layers))
        (x, kv), outs = jax.lax.scan(scan_body, (x, kv), xs, unroll=cfg.n_layers if small else 1)
        return x, outs, kv
    outs, new = [], []
    for i in range(cfg.n_layers):
        p = layers[i] if split else jax.tree.map(lambda a: a[i], layers)
        x, out, new_kv = body(x, p, windows[i], None if kv is None else (kv[0][i], kv[1][i]))
        outs.append(out)
        new.append(new_kv)
        if kv is not None and not kv_split:
            kv = tuple(write_back(c, n, i) for c, n in zip(kv, new_kv))
    if kv_split:
        kv = (tuple(n[0] for n in new), tuple(n[1] for n in new))
    return x, (jnp.stack(outs) if collect else None), kv


def _prepare(tokens, positions, segment_ids):
    tokens = jnp.asarray(tokens, jnp.int32)
    seg = (jnp.ones(tokens.shape, jnp.int32) if segment_ids is None
           else jnp.asarray(segment_ids, jnp.int32))
    pos = default_positions(seg) if positions is None else jnp.asarray(positions, jnp.int32)
    return tokens, pos, seg


def _trunk(cfg, params, tokens, positions, segment_ids, collect, act=None):
    tokens, pos, seg = _prepare(tokens, positions, segment_ids)
    x = _rows(Embed(cfg).apply({"params": params["embed"]}, tokens), act)
    cos, sin = rope_cos_sin(cfg, pos)
    idx = jnp.arange(tokens.shape[1], dtype=jnp.int32)
    mask = MaskSpec(seg, seg, idx, idx, pos, pos, jnp.int32(0))
    emb = x
    x, outs, _ = _stack(cfg, params["layers"], x, cos, sin, mask, collect=collect, act=act)
    h = RMSNorm(cfg).apply({"params": params["final_norm"]}, x)
    return emb, outs, h


@functools.partial(jax.jit, static_argnames=("cfg", "act"))
def _hidden_states(params, tokens, positions, segment_ids, *, cfg, act):
    return _rows(_trunk(cfg, params, tokens, positions, segment_ids, False, act)[2], act)


def hidden_states(cfg: ModelConfig, params, tokens, positions=None, segment_ids=None):
    """Final-normed hidden states [b, s, d] (cfg.dtype), i.e. the LM head's input."""
    # The activation context is a static argument: a trace inside and one outside
    # `shard_activations` never share a cached program.
    return _hidden_states(params, tokens, positions, segment_ids, cfg=cfg, act=_ACTIVATIONS.get())


def _check_layers(cfg: ModelConfig, hidden_layers) -> tuple[int, ...]:
    n = cfg.n_layers
    out = []
    for i in hidden_layers:
        if not isinstance(i, int) or not -(n + 1) <= i <= n:
            raise ConfigError(f"forward: field 'hidden_layers' entry {i!r} is not a layer index in "
                             f"[0, {n}] (or a negative index).")
        out.append(i % (n + 1))
    return tuple(sorted(set(out)))


@functools.partial(jax.jit, static_argnames=("cfg", "hidden_layers", "act"))
def _forward(params, tokens, positions, segment_ids, *, cfg, hidden_layers, act):
    collect = any(0 < i < cfg.n_layers for i in hidden_layers)
    emb, outs, h = _trunk(cfg, params, tokens, positions, segment_ids, collect, act)
    hidden = {}
    for i in hidden_layers:
        hidden[i] = emb if i == 0 else h if i == cfg.n_layers else outs[i - 1]
    return compute_logits(cfg, params, h), hidden


def forward(cfg: ModelConfig, params, tokens, positions=None, segment_ids=None, hidden_layers=()):
    """Logits [b, s, vocab] float32 and {layer index: [b, s, d]} for `hidden_layers`.

    positions default to 0.. restarting at each segment; segment_ids default to one segment per
    row. Padding: give it segment id 0 (it then attends only to itself) and ignore its outputs.
    Negative `hidden_layers` count from the end (-1 == n_layers); keys are the normalized indices.
    """
    requested = list(hidden_layers)
    layers = _check_layers(cfg, requested)
    logits, hidden = _forward(params, tokens, positions, segment_ids, cfg=cfg, hidden_layers=layers,
                              act=_ACTIVATIONS.get())
    return logits, {i: hidden[i % (cfg.n_layers + 1)] for i in requested}


@functools.partial(jax.jit, static_argnames=("cfg",))
def _decode_params(params, *, cfg):
    def fused(module, names):  # the layers._fused_dense key: "+".join(names)
        w, b = fuse_kernels([module.pop(n) for n in names], cfg.d_model)
        module["+".join(names)] = {"kernel": w} if b is None else {"kernel": w, "bias": b}
        return module

    def layer(i):
        p = jax.tree.map(lambda a: a[i], params["layers"])
        return {**p, "attn": fused(dict(p["attn"]), ("q", "k", "v")),
                "mlp": fused(dict(p["mlp"]), ("gate", "up"))}
    out = {**params, "layers": tuple(layer(i) for i in range(cfg.n_layers))}
    if cfg.tie_embeddings:  # [d, vocab] row-major: the logits matmul streams it ~25% faster
        out["lm_head"] = {"kernel": params["embed"]["embedding"].T}
    return out


def decode_params(cfg: ModelConfig, params):
    """The same weights laid out for KV-cache decoding: one buffer per layer (a tuple instead of
    the stacked [L, ...] arrays) with q/k/v and gate/up kernels pre-concatenated, and a tied
    embedding's transpose as an explicit `lm_head`.

    A decode step is bound by reading the weights once. With stacked weights XLA (CPU) copies
    each layer's slice, and the compute-time q/k/v and gate/up concatenations, inside the
    decode loop (~3x the weight traffic). Built once per generate call; costs one extra copy of
    the layer weights while it lives. forward_cached and forward accept either layout.
    """
    return _decode_params(params, cfg=cfg)


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None, per_layer: bool = False):
    """Empty KV cache: k/v [L, b, K, max_len, hd] (head-major, see attention.attend_cache), slot
    validity `mask` [b, max_len] (all False) and the RoPE position stored in each slot `pos`
    [b, max_len] (used by sliding windows). `per_layer=True` gives k/v as tuples of L arrays
    [b, K, max_len, hd]: with decode_params a decode step then reads and writes every layer's
    cache in place (a stacked cache is sliced, i.e. copied, per layer by XLA on CPU)."""
    dt = jnp.dtype(dtype or cfg.dtype)
    shape = (batch, cfg.n_kv_heads, max_len, cfg.head_dim)
    kv = (lambda: tuple(jnp.zeros(shape, dt) for _ in range(cfg.n_layers))) if per_layer else (
        lambda: jnp.zeros((cfg.n_layers,) + shape, dt))
    return {"k": kv(), "v": kv(),
            "mask": jnp.zeros((batch, max_len), bool), "pos": jnp.zeros((batch, max_len), jnp.int32)}


@functools.partial(jax.jit, static_argnames=("cfg", "logits_to_keep", "hidden"))
def _forward_cached(params, tokens, positions, cache, cache_index, token_mask, segment_ids=None,
                    *, cfg, logits_to_keep, hidden=False):
    tokens = jnp.asarray(tokens, jnp.int32)
    positions = jnp.asarray(positions, jnp.int32)
    b, t = tokens.shape
    tm = jnp.ones((b, t), bool) if token_mask is None else jnp.asarray(token_mask, bool)
    ci = jnp.asarray(cache_index, jnp.int32)
    n_slots = cache["mask"].shape[1]
    kv_idx = jnp.arange(n_slots, dtype=jnp.int32)
    put = jax.lax.dynamic_update_slice
    new_mask, new_pos = put(cache["mask"], tm, (0, ci)), put(cache["pos"], positions, (0, ci))
    # Every layer writes its keys/values first and then attends over the whole cache: valid
    # slots carry segment 1 (as valid queries do); this call's padding slots 0, so padding only
    # sees padding; older empty slots -1. Slots after this call's are excluded by causality.
    in_call = (kv_idx >= ci) & (kv_idx < ci + t)
    if segment_ids is None:
        q_seg = tm.astype(jnp.int32)
        kv_seg = jnp.where(new_mask, 1, jnp.where(in_call[None], 0, -1)).astype(jnp.int32)
    else:
        # Packed documents continuing one prefix: each sees its own earlier tokens and every
        # valid slot written before this call (attention.SHARED_SEGMENT), never another's.
        q_seg = jnp.where(tm, jnp.asarray(segment_ids, jnp.int32), 0)
        call_seg = put(jnp.zeros((b, n_slots), jnp.int32), q_seg, (0, ci))
        kv_seg = jnp.where(in_call[None], call_seg,
                           jnp.where(cache["mask"], SHARED_SEGMENT, -1)).astype(jnp.int32)
    cache_mask = MaskSpec(q_seg, kv_seg, ci + jnp.arange(t, dtype=jnp.int32), kv_idx,
                          positions, new_pos, jnp.int32(0))
    x = Embed(cfg).apply({"params": params["embed"]}, tokens)
    cos, sin = rope_cos_sin(cfg, positions)
    x, _, (k, v) = _stack(cfg, params["layers"], x, cos, sin, cache_mask, collect=False,
                          kv=(cache["k"], cache["v"]), cache_mask=cache_mask, cache_index=ci)
    h = RMSNorm(cfg).apply({"params": params["final_norm"]}, x)
    new_cache = {"k": k, "v": v, "mask": new_mask, "pos": new_pos}
    if logits_to_keep:
        h = h[:, -logits_to_keep:]
    return (h if hidden else compute_logits(cfg, params, h)), new_cache


def forward_cached(cfg: ModelConfig, params, tokens, positions, cache, cache_index, token_mask=None,
                   logits_to_keep: int = 0):
    """Run tokens [b, t] at cache slots [cache_index, cache_index + t) for every row.

    Writes their keys/values, validity (`token_mask` [b, t], default all True; pass False for
    left padding) and positions into the cache, and attends causally by slot over valid slots.
    Returns (logits [b, t, vocab] float32, new cache); with `logits_to_keep` = n > 0 only the
    last n positions' logits (a prefill needs just the last). jit-able; cache_index may be traced.
    """
    return _forward_cached(params, tokens, positions, cache, cache_index, token_mask, cfg=cfg,
                           logits_to_keep=int(logits_to_keep))


def hidden_states_cached(cfg: ModelConfig, params, tokens, positions, cache, cache_index,
                         token_mask=None, segment_ids=None):
    """forward_cached's final-normed hidden states [b, t, d] (cfg.dtype) instead of logits, for
    a chunked loss over tokens that continue a cached prefix (GRPO's shared prompts). With
    `segment_ids` [b, t] (1, 2, ... per packed document; 0 padding) the tokens are several
    documents, each continuing the whole prefix and seeing only its own earlier tokens."""
    return _forward_cached(params, tokens, positions, cache, cache_index, token_mask, segment_ids,
                           cfg=cfg, logits_to_keep=0, hidden=True)
