"""Activations of a frozen reference model, pooled per row (the store is in store.py).

    acts = extract(cfg, params, token_lists, layers=(4, 8), pooling="mean")   # [n, 2, d] float32
    acts = extract(cfg, params, token_lists, (4, 8), partitioner=Partitioner(make_mesh(data=-1)))
    rossjax extract --config=configs/extract.py --config.output=runs/acts

Pooling. Without turn spans a row is pooled over all its tokens (`mean`, `last`, `max`). With
turn spans (token ranges of the assistant turns, from the curation pipeline) each turn is pooled
over its own tokens first, giving one vector per generated turn, and those are then pooled over
turns with `turn_pooling`. Hidden states use the models convention: 0 = embeddings, i = block i,
n_layers = after the final norm.

Rows are sorted by length and run in length-bucketed batches (few compiled shapes, little padding);
right padding carries segment id 0, so it never leaks into real tokens.

With a partitioner, each forward batch is split over the mesh's batch axes (data x fsdp by default)
and params follow `rossjax.models.shardings.param_shardings` (heads/MLP over tensor); batches are padded with
dummy rows to a multiple of the batch-axis size. Single process only: every host would need its
own rows and its own part of the store, which this does not do yet.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rossjax.errors import InputError

POOLINGS = ("mean", "last", "max")
TURN_POOLINGS = POOLINGS + ("attention",)  # over turns only: softmax of <v_t, v_last> / sqrt(d)
_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def check_inputs(cfg, token_lists, layers, pooling, turn_pooling, turn_spans):
    if pooling not in POOLINGS:
        raise InputError(f"extract: pooling {pooling!r} is not one of {POOLINGS}.")
    if turn_pooling not in TURN_POOLINGS:
        raise InputError(f"extract: turn_pooling {turn_pooling!r} is not one of {TURN_POOLINGS}.")
    layers = tuple(int(x) for x in layers)
    if not layers:
        raise InputError("extract: field 'layers' is empty.")
    for x in layers:
        if not 0 <= x <= cfg.n_layers:
            raise InputError(f"extract: field 'layers' asks for layer {x}, but the model has "
                             f"{cfg.n_layers} layers (valid: 0 = embeddings .. {cfg.n_layers}).")
    if turn_spans is not None and len(turn_spans) != len(token_lists):
        raise InputError(f"extract: field 'turn_spans' has {len(turn_spans)} rows for "
                         f"{len(token_lists)} token lists.")
    for i, toks in enumerate(token_lists):
        if len(toks) == 0:
            raise InputError(f"extract: row {i} has an empty text (no tokens).")
        if turn_spans is not None:
            spans = turn_spans[i]
            if len(spans) == 0:
                raise InputError(f"extract: row {i} field 'turn_spans' is empty (no assistant turn).")
            for s, e in spans:
                if not 0 <= s < e <= len(toks):
                    raise InputError(f"extract: row {i} field 'turn_spans' holds ({s}, {e}), outside "
                                     f"the row's {len(toks)} tokens or empty.")
    return layers


def _bucket(n: int) -> int:
    for b in _BUCKETS:
        if n <= b:
            return b
    return -(-n // 4096) * 4096


def plan_batches(lengths: Sequence[int], batch_tokens: int, multiple: int = 1):
    """Yield (bucket_len, rows_per_batch, row indices) in length order.

    rows_per_batch is a power of two with rows * bucket_len <= batch_tokens (at least 1), rounded up
    to a multiple of `multiple` (the devices the batch is split over), fixed per bucket, so the
    number of compiled shapes is the number of buckets.
    """
    order = np.argsort(np.asarray(lengths), kind="stable")
    by_bucket: dict[int, list[int]] = {}
    for i in order:
        by_bucket.setdefault(_bucket(int(lengths[i])), []).append(int(i))
    for blen, rows in sorted(by_bucket.items()):
        per = max(1, 1 << int(np.floor(np.log2(max(1, batch_tokens // blen)))))
        per = -(-per // multiple) * multiple
        for s in range(0, len(rows), per):
            yield blen, per, rows[s:s + per]


@dataclasses.dataclass(frozen=True)
class _PoolSpec:
    cfg: object
    layers: tuple
    pooling: str
    turn_pooling: str
    partitioner: object = None   # rossjax.sharding.Partitioner or None (one device)


def _pool_tokens(h, mask, last_idx, how: str):
    """h [b, s, d], mask [b, T, s] bool, last_idx [b, T] -> [b, T, d] (float32)."""
    h = h.astype(jnp.float32)
    if how == "mean":
        m = mask.astype(jnp.float32)
        return jnp.einsum("bts,bsd->btd", m, h) / jnp.maximum(m.sum(-1, keepdims=True), 1.0)
    if how == "max":
        return jnp.max(jnp.where(mask[..., None], h[:, None], -jnp.inf), axis=2)
    return jnp.take_along_axis(h, last_idx[:, :, None], axis=1)


def _pool_turns(v, valid, how: str):
    """v [b, T, d], valid [b, T] -> [b, d]."""
    if how == "mean":
        w = valid.astype(jnp.float32)[..., None]
        return (v * w).sum(1) / jnp.maximum(w.sum(1), 1.0)
    if how == "max":
        return jnp.max(jnp.where(valid[..., None], v, -jnp.inf), axis=1)
    last = jnp.maximum(valid.sum(1) - 1, 0)  # valid turns are a prefix of the T slots
    v_last = jnp.take_along_axis(v, last[:, None, None], axis=1)[:, 0]
    if how == "last":
        return v_last
    # attention: the last turn queries every valid turn, parameter-free (probes/turns.py)
    v = jnp.where(valid[..., None], v, 0.0)  # an empty slot may hold -inf (max pooling)
    scores = jnp.einsum("btd,bd->bt", v, v_last) / jnp.sqrt(jnp.float32(v.shape[-1]))
    w = jax.nn.softmax(jnp.where(valid, scores, -jnp.inf), axis=1)
    return jnp.einsum("bt,btd->bd", w, v)


def _shardings(spec: _PoolSpec):
    """(params, [b, s], [b, T, s], [b, T], [b, L, d]) shardings on the mesh; the batch dim over
    the batch axes, everything else replicated."""
    from rossjax.models import shardings as model_shardings

    part = spec.partitioner
    return (model_shardings.param_shardings(spec.cfg, part), part.rows(2), part.rows(3),
            part.rows(2), part.rows(3))


@functools.lru_cache(maxsize=16)
def _make_batch_fn(spec: _PoolSpec):
    from rossjax import models

    def run(params, tokens, seg, mask, last_idx, turn_valid):
        _, hidden = models.forward(spec.cfg, params, tokens, segment_ids=seg,
                                   hidden_layers=spec.layers)
        hidden = jax.tree.map(jax.lax.stop_gradient, hidden)  # frozen model: no gradients
        per_layer = [_pool_turns(_pool_tokens(hidden[l], mask, last_idx, spec.pooling), turn_valid,
                                 spec.turn_pooling) for l in spec.layers]
        return jnp.stack(per_layer, axis=1)   # [b, len(layers), d]

    if spec.partitioner is None:
        return jax.jit(run)
    p, r2, r3, t2, out = _shardings(spec)
    # Traced inside shard_activations: rows stay split and a Pallas attention kernel (splash,
    # what `auto` picks on TPU) runs per shard in shard_map; the TPU compiler refuses one it
    # would have to partition itself (found by `rossjax plan --config=configs/extract.py`).
    return jax.jit(models.transformer.under_mesh(run, spec.partitioner),
                   in_shardings=(p, r2, r2, r3, t2, t2), out_shardings=out)


def iter_extract(cfg, params, token_lists, layers, pooling="mean", turn_spans=None, *,
                 turn_pooling="mean", batch_tokens=8192, skip=None, partitioner=None, mesh=None,
                 rules=None, with_padding=False):
    """Yield (row indices, activations [k, len(layers), d]) batch by batch, skipping rows where
    `skip[row]` is true. The streaming core of `extract` and of the resumable store writer.

    `partitioner` (rossjax.sharding.Partitioner; or a `mesh` + `rules`): run each batch sharded,
    rows over the batch axes, params placed by `rossjax.models.shardings.param_shardings` (a
    no-op for params already on the mesh). With `with_padding` the tuples carry a third item,
    the padded token count of the batch."""
    from rossjax import sharding

    layers = check_inputs(cfg, token_lists, layers, pooling, turn_pooling, turn_spans)
    part = partitioner if partitioner is not None else sharding.as_partitioner(mesh, rules)
    spec = _PoolSpec(cfg, layers, pooling, turn_pooling, part)
    run = _make_batch_fn(spec)
    shards = 1
    if part is not None:
        shards = part.batch_size_multiple()
        params = jax.device_put(params, _shardings(spec)[0])
    todo = [i for i in range(len(token_lists)) if skip is None or not skip[i]]
    lengths = [len(token_lists[i]) for i in todo]
    max_turns = 1 if turn_spans is None else max(len(turn_spans[i]) for i in todo) if todo else 1
    n_turns = 1 << int(np.ceil(np.log2(max_turns)))  # bucketed too: few compiled shapes
    for blen, per, local in plan_batches(lengths, batch_tokens, multiple=shards):
        rows = [todo[j] for j in local]
        tokens = np.zeros((per, blen), np.int32)
        seg = np.zeros((per, blen), np.int32)
        mask = np.zeros((per, n_turns, blen), bool)
        last_idx = np.zeros((per, n_turns), np.int32)
        valid = np.zeros((per, n_turns), bool)
        for r, i in enumerate(rows):
            toks = np.asarray(token_lists[i], np.int32)
            tokens[r, :len(toks)], seg[r, :len(toks)] = toks, 1
            spans = [(0, len(toks))] if turn_spans is None else turn_spans[i]
            for t, (s, e) in enumerate(spans):
                mask[r, t, s:e], last_idx[r, t], valid[r, t] = True, e - 1, True
        for r in range(len(rows), per):  # dummy rows keep the batch shape fixed
            seg[r, 0], mask[r, 0, 0], valid[r, 0] = 1, True, True
        out = np.asarray(run(params, tokens, seg, mask, last_idx, valid))[:len(rows)]
        yield (np.asarray(rows), out, per * blen) if with_padding else (np.asarray(rows), out)


def extract(cfg, params, token_lists, layers, pooling="mean", turn_spans=None, *,
            turn_pooling="mean", batch_tokens=8192, partitioner=None, mesh=None,
            rules=None) -> np.ndarray:
    """Pooled activations [n, len(layers), d_model] (float32) for every row, in input order."""
    n = len(token_lists)
    out = np.zeros((n, len(tuple(layers)), cfg.d_model), np.float32)
    for rows, acts in iter_extract(cfg, params, token_lists, layers, pooling, turn_spans,
                                   turn_pooling=turn_pooling, batch_tokens=batch_tokens,
                                   partitioner=partitioner, mesh=mesh, rules=rules):
        out[rows] = acts
    return out


# ----------------------------------------------------------------------------- input rows

def read_rows(path: str, tokenizer: str = "", use_turns: bool = False):
    """(ids, token_lists, turn_spans or None) from a curated directory or a JSONL(.gz) file whose
    rows hold "id" and "input_ids" (or "text", tokenized with `tokenizer`), optionally "turn_spans"."""
    import gzip

    if not os.path.exists(path):
        raise InputError(f"{path}: the extraction input does not exist.")
    if os.path.isdir(path):
        from rossjax.curate.compiled import read_compiled
        rows = [{"id": r["id"], "input_ids": np.asarray(r["input_ids"]).tolist(),
                 "turn_spans": r.get("turn_spans")} for r in read_compiled(path)]
    else:
        rows, opener = [], gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise InputError(f"{path} row {n}: not valid JSON ({e.msg}).") from None
    tok = None
    ids, lists, spans = [], [], []
    for n, r in enumerate(rows, start=1):
        if "id" not in r:
            raise InputError(f"{path} row {n}: field 'id' is missing.")
        if "input_ids" in r:
            toks = list(r["input_ids"])
        elif "text" in r:
            if not tokenizer:
                raise InputError(f"{path} row {n}: field 'text' needs --config.tokenizer to be set.")
            if tok is None:
                from rossjax.tokenizers import load_tokenizer
                tok = load_tokenizer(tokenizer)
            toks = tok.encode(r["text"])
        else:
            raise InputError(f"{path} row {n}: needs field 'input_ids' or 'text'.")
        if not toks:
            raise InputError(f"{path} row {n}: field '{'input_ids' if 'input_ids' in r else 'text'}' "
                             "is empty.")
        if use_turns and not r.get("turn_spans"):
            raise InputError(f"{path} row {n}: field 'turn_spans' is missing or empty.")
        ids.append(str(r["id"]))
        lists.append(toks)
        spans.append([tuple(s) for s in r["turn_spans"]] if use_turns else None)
    if not ids:
        raise InputError(f"{path}: the extraction input has no rows.")
    return ids, lists, (spans if use_turns else None)
