"""Grouped-query attention kernels in pure JAX: dense for short rows, block-wise for long ones;
`attend` also dispatches to the fused backends of models/kernels (cuDNN, XLA, Pallas splash).

Masks are described by ids (`MaskSpec`), never passed as a [b, s, t] array: key slot j is
visible to query i when

    kv_idx[j] <= q_idx[i]                                   (causal, by slot)
    and (q_seg[b, i] == kv_seg[b, j]                        (same packed document / validity)
         or kv_seg[b, j] == SHARED_SEGMENT and q_seg[b, i] > 0)   (a prefix every document sees)
    and (window == 0 or q_pos[b, i] - kv_pos[b, j] < window)   (sliding window, by position)

The block-wise path is flash attention (online softmax) with a custom VJP: the forward keeps only
the output and the per-row logsumexp, the backward recomputes each [block_q, block_k] tile, so
memory stays O(s * block) in both directions, and tiles that the mask empties entirely (later
slots, other documents, outside the window) are skipped. Scores and softmax are float32.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

# Large finite negative instead of -inf: fully masked rows stay finite (uniform, as in the dense
# softmax) instead of NaN, and exp(masked - max) underflows to exactly 0 once a row sees a key.
MASK_VALUE = -1e30
# A key's segment id for a prefix that every valid query sees, whatever its document: GRPO's
# packed completions of one group all continue the group's prompt (train/rl/packed_prompt.py).
# Keys only; the largest id, so a tile's max segment tells whether it holds such a key.
SHARED_SEGMENT = 2**31 - 2


class MaskSpec(NamedTuple):
    q_seg: jax.Array    # [b, s] int32
    kv_seg: jax.Array   # [b, t] int32
    q_idx: jax.Array    # [s] int32 slot of each query
    kv_idx: jax.Array   # [t] int32 slot of each key
    q_pos: jax.Array    # [b, s] int32 RoPE positions (sliding windows measure these)
    kv_pos: jax.Array   # [b, t] int32
    window: jax.Array   # [] int32, 0 = no window


def _visible(q_seg, kv_seg, q_idx, kv_idx, q_pos, kv_pos, window):
    """[b, s, t] bool from (possibly block-sliced) ids."""
    qs, ks = q_seg[:, :, None], kv_seg[:, None, :]
    ok = (kv_idx[None, None, :] <= q_idx[None, :, None]) & (
        (qs == ks) | ((ks == SHARED_SEGMENT) & (qs > 0)))
    in_window = (q_pos[:, :, None] - kv_pos[:, None, :]) < window
    return ok & ((window == 0) | in_window)


def mask_array(m: MaskSpec):
    return _visible(*m)


def dense(q, k, v, m: MaskSpec):
    """q [b, s, K, G, hd], k/v [b, t, K, hd] -> out [b, s, K, G, hd] in q.dtype."""
    hd = q.shape[-1]
    scores = jnp.einsum("bskgd,btkd->bkgst", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask_array(m)[:, None, None], scores * (hd ** -0.5), MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1)
    # Output [b, K, G, s, hd], then moved: the einsum straight to [b, s, K, G, hd] makes XLA CPU
    # pick a slower dot (see attend_cache).
    out = jnp.einsum("bkgst,btkd->bkgsd", probs.astype(v.dtype), v)
    return jnp.moveaxis(out, 3, 1).astype(q.dtype)


# ---------------------------------------------------------------------------------------------
# Block-wise (flash) attention.

def _pad_to(x, axis, size, value):
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def _blocks(x, axis, n):
    """Split `axis` into n blocks and move the block index to the front."""
    shape = x.shape[:axis] + (n, x.shape[axis] // n) + x.shape[axis + 1:]
    return jnp.moveaxis(x.reshape(shape), axis, 0)


def _unblock(x, axis):
    """Inverse of _blocks (block index at 0 goes back in front of `axis`)."""
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2:])


class _Tiles(NamedTuple):
    """Mask ids cut into blocks plus the [nq, nk] table of tiles that hold any visible pair."""
    q_seg: jax.Array   # [nq, b, bq]
    kv_seg: jax.Array  # [nk, b, bk]
    q_idx: jax.Array   # [nq, bq]
    kv_idx: jax.Array  # [nk, bk]
    q_pos: jax.Array
    kv_pos: jax.Array
    window: jax.Array
    needed: jax.Array  # [nq, nk] bool


def _tiles(m: MaskSpec, s_pad, t_pad, bq, bk) -> _Tiles:
    nq, nk = s_pad // bq, t_pad // bk
    big = jnp.iinfo(jnp.int32).max
    # Padded queries/keys get segment ids that match nothing (-1 vs -2).
    q_seg = _blocks(_pad_to(m.q_seg, 1, s_pad, -1), 1, nq)
    kv_seg = _blocks(_pad_to(m.kv_seg, 1, t_pad, -2), 1, nk)
    q_idx = _blocks(_pad_to(m.q_idx, 0, s_pad, big), 0, nq)
    kv_idx = _blocks(_pad_to(m.kv_idx, 0, t_pad, big), 0, nk)
    q_pos = _blocks(_pad_to(m.q_pos, 1, s_pad, 0), 1, nq)
    kv_pos = _blocks(_pad_to(m.kv_pos, 1, t_pad, 0), 1, nk)
    # A tile can hold a visible pair only if every rule can hold for some pair in it; the range
    # tests below are necessary conditions, so skipping on them is exact.
    causal = kv_idx.min(1)[None, :] <= jnp.where(q_idx < big, q_idx, -1).max(1)[:, None]
    qs_lo, qs_hi = q_seg.min(2), q_seg.max(2)            # [nq, b]
    ks_lo, ks_hi = kv_seg.min(2), kv_seg.max(2)          # [nk, b]
    seg = (ks_lo[None] <= qs_hi[:, None]) & (qs_lo[:, None] <= ks_hi[None])      # [nq, nk, b]
    seg = seg | ((ks_hi[None] == SHARED_SEGMENT) & (qs_hi[:, None] > 0))
    win = (q_pos.min(2)[:, None] - kv_pos.max(2)[None]) < m.window
    seg = seg & ((m.window == 0) | win)
    return _Tiles(q_seg, kv_seg, q_idx, kv_idx, q_pos, kv_pos, m.window, causal & seg.any(-1))


def _grid(m: MaskSpec, s: int, t: int, bq: int, bk: int):
    """Block sizes clipped to the lengths, padded lengths, block counts and the mask tiles."""
    bq, bk = min(bq, s), min(bk, t)
    s_pad, t_pad = -(-s // bq) * bq, -(-t // bk) * bk
    return bq, bk, s_pad, t_pad, s_pad // bq, t_pad // bk, _tiles(m, s_pad, t_pad, bq, bk)


def _tile_scores(qb, kb, tl: _Tiles, i, j, scale):
    """Masked, scaled float32 scores [b, K, G, bq, bk] of query block i against key block j."""
    s = jnp.einsum("bqkgd,btkd->bkgqt", qb, kb, preferred_element_type=jnp.float32) * scale
    vis = _visible(tl.q_seg[i], tl.kv_seg[j], tl.q_idx[i], tl.kv_idx[j], tl.q_pos[i], tl.kv_pos[j],
                   tl.window)
    return jnp.where(vis[:, None, None], s, MASK_VALUE)


def _flash_forward(q, k, v, m: MaskSpec, bq: int, bk: int):
    """(out [b, s, K, G, hd] q.dtype, lse [b, K, G, s] float32)."""
    b, s, nkv, g, hd = q.shape
    t = k.shape[1]
    bq, bk, s_pad, t_pad, nq, nk, tl = _grid(m, s, t, bq, bk)
    qb_all = _blocks(_pad_to(q, 1, s_pad, 0), 1, nq)          # [nq, b, bq, K, G, hd]
    kb_all = _blocks(_pad_to(k, 1, t_pad, 0), 1, nk)          # [nk, b, bk, K, hd]
    vb_all = _blocks(_pad_to(v, 1, t_pad, 0), 1, nk)
    scale = hd ** -0.5

    def q_block(_, i):
        qb = qb_all[i]

        def kv_step(j, carry):
            def tile(c):
                o, mx, l = c
                sc = _tile_scores(qb, kb_all[j], tl, i, j, scale)
                m_new = jnp.maximum(mx, sc.max(-1))
                corr = jnp.exp(mx - m_new)
                p = jnp.exp(sc - m_new[..., None])
                o = o * corr[..., None] + jnp.einsum("bkgqt,btkd->bkgqd", p.astype(v.dtype),
                                                     vb_all[j], preferred_element_type=jnp.float32)
                return o, m_new, l * corr + p.sum(-1)
            return jax.lax.cond(tl.needed[i, j], tile, lambda c: c, carry)

        init = (jnp.zeros((b, nkv, g, bq, hd), jnp.float32),
                jnp.full((b, nkv, g, bq), -jnp.inf, jnp.float32),
                jnp.zeros((b, nkv, g, bq), jnp.float32))
        o, mx, l = jax.lax.fori_loop(0, nk, kv_step, init)
        l = jnp.where(l == 0, 1.0, l)     # rows with no computed tile (padding only)
        mx = jnp.where(jnp.isfinite(mx), mx, MASK_VALUE)
        return None, (jnp.moveaxis(o / l[..., None], 3, 1).astype(q.dtype), mx + jnp.log(l))

    _, (o, lse) = jax.lax.scan(q_block, None, jnp.arange(nq))
    # o [nq, b, bq, K, G, hd]; lse [nq, b, K, G, bq]
    return _unblock(o, 1)[:, :s], _unblock(lse, 3)[..., :s]


def _flash_backward(q, k, v, m: MaskSpec, o, lse, do, bq: int, bk: int):
    b, s, nkv, g, hd = q.shape
    t = k.shape[1]
    bq, bk, s_pad, t_pad, nq, nk, tl = _grid(m, s, t, bq, bk)
    scale = hd ** -0.5
    delta = jnp.einsum("bskgd,bskgd->bkgs", do.astype(jnp.float32), o.astype(jnp.float32))
    qb_all = _blocks(_pad_to(q, 1, s_pad, 0), 1, nq)
    dob_all = _blocks(_pad_to(do.astype(q.dtype), 1, s_pad, 0), 1, nq)
    lse_all = _blocks(_pad_to(lse, 3, s_pad, 0.0), 3, nq)          # [nq, b, K, G, bq]
    delta_all = _blocks(_pad_to(delta, 3, s_pad, 0.0), 3, nq)
    kb_all = _blocks(_pad_to(k, 1, t_pad, 0), 1, nk)
    vb_all = _blocks(_pad_to(v, 1, t_pad, 0), 1, nk)

    def kv_block(dq_all, j):
        kb, vb = kb_all[j], vb_all[j]

        def q_step(i, carry):
            def tile(c):
                dk, dv, dq_all = c
                qb, dob = qb_all[i], dob_all[i]
                sc = _tile_scores(qb, kb, tl, i, j, scale)
                p = jnp.exp(sc - lse_all[i][..., None])                         # [b,K,G,bq,bk]
                dv = dv + jnp.einsum("bkgqt,bqkgd->btkd", p.astype(dob.dtype), dob,
                                     preferred_element_type=jnp.float32)
                dp = jnp.einsum("bqkgd,btkd->bkgqt", dob, vb, preferred_element_type=jnp.float32)
                ds = (p * (dp - delta_all[i][..., None]) * scale).astype(q.dtype)
                dk = dk + jnp.einsum("bkgqt,bqkgd->btkd", ds, qb, preferred_element_type=jnp.float32)
                dq = jnp.einsum("bkgqt,btkd->bqkgd", ds, kb, preferred_element_type=jnp.float32)
                return dk, dv, dq_all.at[i].add(dq)
            return jax.lax.cond(tl.needed[i, j], tile, lambda c: c, carry)

        zeros = jnp.zeros((b, bk, nkv, hd), jnp.float32)
        dk, dv, dq_all = jax.lax.fori_loop(0, nq, q_step, (zeros, zeros, dq_all))
        return dq_all, (dk, dv)

    dq_all = jnp.zeros((nq, b, bq, nkv, g, hd), jnp.float32)
    dq_all, (dk, dv) = jax.lax.scan(kv_block, dq_all, jnp.arange(nk))
    dq = _unblock(dq_all, 1)[:, :s].astype(q.dtype)
    return dq, _unblock(dk, 1)[:, :t].astype(k.dtype), _unblock(dv, 1)[:, :t].astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q, k, v, m, bq, bk):
    return _flash_forward(q, k, v, m, bq, bk)[0]


def _flash_fwd_rule(q, k, v, m, bq, bk):
    o, lse = _flash_forward(q, k, v, m, bq, bk)
    return o, (q, k, v, m, o, lse)


def _flash_bwd_rule(bq, bk, res, do):
    q, k, v, m, o, lse = res
    dq, dk, dv = _flash_backward(q, k, v, m, o, lse, do, bq, bk)
    return dq, dk, dv, None


_flash.defvjp(_flash_fwd_rule, _flash_bwd_rule)


def blockwise(q, k, v, m: MaskSpec, *, block: int = 512):
    """Same contract as `dense`, O(s * block) memory."""
    return _flash(q, k, v, m, block, block)


# The pure-JAX kernels' block where ModelConfig.attention_block is 0, by the target's platform.
# CPU: a 512 x 512 tile's float32 scores for 8 heads (8 MiB) stream through L3 on every
# elementwise pass of the online softmax; at 128 (512 KiB) they stay in L2. Fwd + bwd of one
# causal row, 8 heads / 2 kv heads of 64, AMD EPYC AVX-512, 2 threads: at 1,024 keys 67.6 ms
# (128-blocks) vs 97.6 (512-blocks) vs 220 (dense, what 512 chose there); at 2,048 270 vs 329;
# at 512 19.5 vs 27.6 (dense). Forward alone ties at 512 and 1,024 keys, 7% slower at 2,048.
BLOCK_BY_PLATFORM = {"cpu": 128}
BLOCK_DEFAULT = 512


def block_size(block: int) -> int:
    """`block`, or for 0 the platform's (BLOCK_BY_PLATFORM, else BLOCK_DEFAULT) of the devices
    the program is traced for."""
    if block:
        return int(block)
    from rossjax.models import kernels

    return BLOCK_BY_PLATFORM.get(kernels.target_platform(), BLOCK_DEFAULT)


def use_blockwise(impl: str, s: int, t: int, block: int) -> bool:
    """Among the pure-JAX kernels: 'auto' (and a fused backend's fallback) picks dense while the
    keys fit in two blocks (dense is as fast or faster on CPU at short lengths) or for a few
    queries (decode), block-wise beyond."""
    if impl == "dense":
        return False
    if impl == "blockwise":
        return True
    return t > 2 * block and s > 16


def backend(impl: str, s: int, t: int, block: int, dtype, *, self_attention: bool = True) -> str:
    """The kernel that runs: dense | blockwise | xla | cudnn | splash.

    Fused backends (models/kernels) serve self-attention rows (training, scoring); `auto` picks
    splash on TPU and cuDNN on NVIDIA GPUs in half precision, the pure-JAX kernels elsewhere.
    Attention over a KV cache (prefill, decode) always uses the pure-JAX kernels. On CPU 'auto'
    then picks between those two again by the rows' sizes (`row_chunks`).
    """
    from rossjax.models import kernels

    if self_attention and impl in kernels.FUSED:
        return impl
    if self_attention and impl == "auto" and s > 16:
        fused = kernels.platform_default(dtype)
        if fused:
            return fused
    return "blockwise" if use_blockwise(impl, s, t, block_size(block)) else "dense"


# CPU, where rows are not split over devices: the pure-JAX kernels run over chunks of rows, so
# that the float32 scores of one step stay small whatever the batch (the block size alone
# bounds them per row: 128 rows x 8 heads of 128 x 128 tiles are 67 MB, streamed through memory
# by every pass of the online softmax). Dense while one row's scores [H, s, t] take at most
# "dense_row" bytes, over as many rows as "chunk" bytes hold; block-wise otherwise, over as many
# rows as "tile" bytes of tiles hold. Fwd + bwd of one layer (8 heads / 2 kv heads of 64, AMD
# EPYC AVX-512, 2 threads), all rows at once (block-wise, as before) against the chunks: 128 rows
# x 257 queries x 352 keys (GRPO's shared-prompt block) 3.7-4.0 s against 0.75-0.93 (dense, 2
# rows); 128 x 352 x 352 (row-wise) 3.2 against 1.5 (dense, 2 rows); 64 x 96 x 352 (a prefill)
# 0.57 against 0.17-0.19; 2 x 1,024 x 1,024 (SFT) unchanged (block-wise, both rows).
ROW_CHUNKS_BY_PLATFORM = {"cpu": {"dense_row": 4 << 20, "chunk": 8 << 20, "tile": 1 << 20}}


def row_chunks(b: int, s: int, t: int, h: int, block: int):
    """(kind, rows per chunk) for `attend`'s 'auto' on the target platform, or None where
    ROW_CHUNKS_BY_PLATFORM has no entry or rows are split over devices (the kernels then run on
    all rows at once). Chunks are the largest divisor of b within the budget (at least one row)."""
    from rossjax.models import kernels
    from rossjax.models.kernels import activations

    plan = ROW_CHUNKS_BY_PLATFORM.get(kernels.target_platform())
    act = activations.current()
    if plan is None or (act is not None and act.batch):
        return None
    row = 4 * h * s * t
    if row <= plan["dense_row"]:
        kind, fit = "dense", plan["chunk"] // row
    else:
        kind, fit = "blockwise", plan["tile"] // (4 * h * min(block, s) * min(block, t))
    return kind, max(r for r in range(1, min(b, max(fit, 1)) + 1) if b % r == 0)


def _by_rows(kernel, rows: int, q, k, v, m: MaskSpec):
    """`kernel(q, k, v, m)` over chunks of `rows` rows in turn (lax.map), each chunk
    rematerialized in the backward so that no chunk's scores outlive it."""
    n = q.shape[0] // rows
    split = lambda x: x.reshape((n, rows) + x.shape[1:])

    @jax.checkpoint
    def chunk(a):
        qc, kc, vc, qs, ks, qp, kp = a
        return kernel(qc, kc, vc, MaskSpec(qs, ks, m.q_idx, m.kv_idx, qp, kp, m.window))

    out = jax.lax.map(chunk, tuple(split(x) for x in (q, k, v, m.q_seg, m.kv_seg, m.q_pos,
                                                      m.kv_pos)))
    return out.reshape(q.shape)


def attend(q, k, v, m: MaskSpec, *, impl: str = "auto", block: int = 0, windows=(0,),
           self_attention: bool = True):
    """q [b, s, H, hd], k/v [b, t, K, hd] -> [b, s, H, hd].

    `windows`: every value `m.window` can take (static; the fused splash kernel needs it).
    """
    b, s, h, hd = q.shape
    nkv = k.shape[2]
    qg = q.reshape(b, s, nkv, h // nkv, hd)
    block = block_size(block)
    kind = backend(impl, s, k.shape[1], block, q.dtype, self_attention=self_attention)
    rows = b
    if impl == "auto" and kind in ("dense", "blockwise"):
        kind, rows = row_chunks(b, s, k.shape[1], h, block) or (kind, b)
    if kind in ("dense", "blockwise"):
        kernel = dense if kind == "dense" else functools.partial(blockwise, block=block)
        out = kernel(qg, k, v, m) if rows == b else _by_rows(kernel, rows, qg, k, v, m)
    else:
        from rossjax.models import kernels

        visible = mask_array(m) if kind in ("xla", "cudnn") else None
        out = kernels.attend(kind, qg, k, v, m, tuple(windows), visible)
    return out.reshape(b, s, h, hd)


def attend_cache(q, kc, vc, m: MaskSpec, *, impl: str = "auto", block: int = 0):
    """Queries q [b, s, H, hd] against a KV cache laid out head-major, kc/vc [b, K, T, hd]
    -> [b, s, H, hd].

    Head-major keeps each kv head's keys contiguous, so a decode step's two batched matmuls (over
    b, K) read the cache where it lies; a [b, T, K, hd] cache would be copied per head per step.
    Long query chunks (prefill) use the general kernels on a transposed copy instead.
    """
    b, s, h, hd = q.shape
    if s > 16:
        return attend(q, kc.swapaxes(1, 2), vc.swapaxes(1, 2), m, impl=impl, block=block,
                      self_attention=False)
    nkv = kc.shape[1]
    qg = q.reshape(b, s, nkv, h // nkv, hd)
    scores = jnp.einsum("bskgd,bktd->bkgst", qg, kc, preferred_element_type=jnp.float32)
    visible = jnp.broadcast_to(mask_array(m)[:, None, None], scores.shape)
    # The softmax over a [rows, T] view: unit axes (s = 1, and b = 1 under the engine's per-row
    # vmap) put XLA:CPU's reductions on a path several times slower.
    flat = (-1, scores.shape[-1])
    probs = jax.nn.softmax(jnp.where(visible.reshape(flat), scores.reshape(flat) * (hd ** -0.5),
                                     MASK_VALUE), axis=-1)
    probs = probs.reshape(scores.shape).astype(vc.dtype)
    # Output [b, K, G, s, hd] (a plain batched matmul), moved to [b, s, K, G, hd] afterwards:
    # asking the einsum for the final layout directly makes XLA CPU pick a ~3x slower dot.
    out = jnp.moveaxis(jnp.einsum("bkgst,bktd->bkgsd", probs, vc), 3, 1).astype(q.dtype)
    return out.reshape(b, s, h, hd)
