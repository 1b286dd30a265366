"""GRPO's packed shared-prompt layout: each group's prompt runs once (as in
grpo_step.shared_prompt_logprobs) and its G completions are packed, first-fit decreasing, into
rows of max_new + 1 slots that continue the prompt's KV cache. Each completion is its own
document there, seeing the prompt (models.attention.SHARED_SEGMENT) and its own earlier tokens,
never another's: the same log-probs as the row layout. A completion that stopped early costs its
own tokens instead of max_new + 1 slots (verl's remove-padding, with the prompt shared as well;
TRL pads every completion to the batch's longest).

The host plans the packing per micro-batch (`plan`); the device runs the packed rows
(`logprobs`) and puts every token's result back at its [B, S] place, so the losses read the row
layout unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rossjax import models
from rossjax.train import losses

PACK_KEYS = ("pk_tokens", "pk_positions", "pk_segments", "pk_targets", "pk_group", "pk_row",
             "pk_col")
# Pack only where the packed rows hold at most this share of the shared-prompt blocks' slots
# (B x (max_new + 1)): below it the saved work pays for a second compiled update.
MAX_SHARE = 0.75


def rows_bucket(n: int, floor: int = 0) -> int:
    """Packed rows per micro-batch: `n` rounded up to a quarter of its power of two and never
    below `floor` (the most of the run so far), so that a run compiles few row counts."""
    n = max(int(n), 1)
    step = max(1, (1 << (n - 1).bit_length()) // 4)
    return max(int(floor), -(-n // step) * step)


def group_starts(mask, group: int) -> np.ndarray:
    """Per group of `group` consecutive rows, its first trained position p0 (0 where no row
    trains): the shared-prompt layout's (grpo_step.shared_prompt_ok)."""
    m = np.asarray(mask) > 0
    has = m.any(1)
    first = np.where(has, np.argmax(m, axis=1), 0)
    return first.reshape(-1, group).max(1)


def plan(host: dict, group: int, max_new: int, n_micro: int = 1, floor: int = 0) -> dict | None:
    """Host arrays (tokens, positions, segment_ids, targets, mask; rows in the update's order,
    passing shared_prompt_ok) -> the PACK_KEYS arrays, or None where packing would keep more than
    MAX_SHARE of the slots.

    split_micro hands micro-batch m the rows m, m + n, ...; so it gets packed rows m, m + n, ...,
    and pk_row (the packed row of each [B, S] token, -1 outside every block) and pk_group (the
    group whose prompt a packed row continues) count within the micro-batch."""
    tok, pos, seg, tgt, mask = (np.asarray(host[k]) for k in ("tokens", "positions",
                                                              "segment_ids", "targets", "mask"))
    b, s = tok.shape
    c, n = max_new + 1, int(n_micro)
    end = (seg > 0).sum(1)
    has = (mask > 0).any(1)
    bins_of = []                       # per micro-batch: [(group, [(local row, length)])]
    for m in range(n):
        rows = np.arange(m, b, n)
        p0 = group_starts(mask[rows], group)
        bins = []
        for g in range(len(rows) // group):
            blocks = sorted(((j, int(end[rows[j]] - p0[g])) for j in range(g * group, (g + 1) * group)
                             if has[rows[j]]), key=lambda x: -x[1])
            mine = []
            for j, ln in blocks:
                fit = next((x for x in mine if x[0] + ln <= c), None)
                if fit is None:
                    fit = [0, []]
                    mine.append(fit)
                fit[1].append((j, ln))
                fit[0] += ln
            bins += [(g, x[1]) for x in mine]
        bins_of.append((rows, p0, bins))
    r = rows_bucket(max(len(x[2]) for x in bins_of), floor)
    if n * r * c > MAX_SHARE * b * c:
        return None
    out = {k: np.zeros((n * r, c), np.int32) for k in PACK_KEYS[:4]}
    out["pk_group"] = np.zeros((n * r,), np.int32)
    out["pk_row"] = np.full((b, s), -1, np.int32)
    out["pk_col"] = np.zeros((b, s), np.int32)
    for m, (rows, p0, bins) in enumerate(bins_of):
        for k, (g, blocks) in enumerate(bins):
            pr, o = m + k * n, 0
            out["pk_group"][pr] = g
            for d, (j, ln) in enumerate(blocks):
                src, at = rows[j], slice(int(p0[g]), int(p0[g]) + ln)
                for key, a in (("pk_tokens", tok), ("pk_positions", pos), ("pk_targets", tgt)):
                    out[key][pr, o:o + ln] = a[src, at]
                out["pk_segments"][pr, o:o + ln] = d + 1
                out["pk_row"][src, at] = k
                out["pk_col"][src, at] = np.arange(o, o + ln)
                o += ln
    return out


def prompt_cache(model_cfg, params, tok, pos, mask, group: int, pp: int, slots: int):
    """Each group's prompt [0, p0) prefilled once, left-padded to end at slot pp, into a cache of
    `slots` slots: (cache over groups, per_layer, p0 per group). Rows i*G .. i*G+G-1 form
    group i."""
    s = tok.shape[1]
    has = jnp.any(mask > 0, axis=1)
    first = jnp.argmax(mask > 0, axis=1).astype(jnp.int32)
    p0g = jnp.max(jnp.where(has, first, 0).reshape(-1, group), axis=1)
    take = lambda x, idx: jnp.take_along_axis(x, jnp.clip(idx, 0, s - 1), axis=1)
    src = jnp.arange(pp, dtype=jnp.int32)[None] - (pp - p0g[:, None])   # left-padded prefix
    pvalid = src >= 0
    lead_tok, lead_pos = tok[::group], pos[::group]
    # A per-layer cache runs the layers as one unrolled program (as forward's scan unrolls
    # small stacks: ~8% faster on CPU); deep stacks keep the scan over a stacked cache.
    per_layer = model_cfg.n_layers <= 16
    cache = models.init_cache(model_cfg, lead_tok.shape[0], slots, per_layer=per_layer)
    _, cache = models.forward_cached(model_cfg, params, jnp.where(pvalid, take(lead_tok, src), 0),
                                     jnp.where(pvalid, take(lead_pos, src), 0), cache, 0,
                                     pvalid, logits_to_keep=1)
    return cache, per_layer, p0g


def cache_rows(cache, idx, per_layer: bool):
    """The cache's rows `idx` (a row per use of a group's prompt)."""
    kv = (lambda x: tuple(a[idx] for a in x)) if per_layer else (lambda x: jnp.take(x, idx, 1))
    return {"k": kv(cache["k"]), "v": kv(cache["v"]), "mask": cache["mask"][idx],
            "pos": cache["pos"][idx]}


def logprobs(model_cfg, params, batch, chunk: int, with_entropy: bool, temperature: float,
             group: int, max_new: int):
    """grpo_step.token_logprobs of a batch carrying `plan`'s arrays, [B, S] (0 outside the
    completions' blocks)."""
    tok, pos, mask = (jnp.asarray(batch[k]) for k in ("tokens", "positions", "mask"))
    s, c = tok.shape[1], max_new + 1
    cache, per_layer, _ = prompt_cache(model_cfg, params, tok, pos, mask, group, s - c, s)
    cache = cache_rows(cache, batch["pk_group"], per_layer)
    segs = batch["pk_segments"]
    h, _ = models.transformer.hidden_states_cached(
        model_cfg, params, batch["pk_tokens"], batch["pk_positions"], cache, s - c, segs > 0,
        segment_ids=segs)
    w, vocab_major = losses.head_weights(model_cfg, params)
    out = losses.chunked_token_logprobs(h, w, batch["pk_targets"], chunk, vocab_major,
                                        with_entropy, temperature)
    row, col = batch["pk_row"], batch["pk_col"]
    back = lambda x: jnp.where(row >= 0, x[jnp.maximum(row, 0), col], 0.0)
    return jax.tree.map(back, out)
