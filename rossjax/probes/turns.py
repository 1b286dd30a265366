"""Per-agent-turn activations, aggregated over turns, for probing multi-turn (agentic) rows such
as the SWE generator's bash episodes.

    v, valid = turn_vectors(cfg, params, token_lists, turn_spans, layers=(8,), pooling="mean")
    x = aggregate(v, valid, "attention")               # [n, len(layers), d] float32

A row's turn spans are the token ranges of its assistant turns (curate's `turn_spans`: one per
generated agent turn). `turn_vectors` returns one vector per turn, [n, T, len(layers), d] with
`valid` [n, T]: each turn is its row cut at the turn's end and pooled over the turn's tokens by
`activations.extract` (the model is causal, so the cut changes no hidden state of the turn).
`aggregate` pools over the valid turns:
  mean, last, max  as `activations.extract(..., turn_pooling=...)` computes them in one pass;
  attention        dot-product attention of the last turn over the episode: weights
                   softmax_t(<v_t, v_last> / sqrt(d)) over valid turns, per layer, applied to
                   the turn vectors. Parameter-free, so the probe sweep compares it with mean
                   and last on equal terms (no extra trained weights, no extra split).
Cost of `turn_vectors`: the sum over turns of each turn's end in tokens (at most T forward
passes of the row); for mean / last / max the one-pass `turn_pooling` of extract is cheaper.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rossjax.errors import InputError
from rossjax.probes import activations

TURN_POOLINGS = ("mean", "last", "max", "attention")


def turn_vectors(cfg, params, token_lists, turn_spans, layers, pooling: str = "mean", *,
                 batch_tokens: int = 8192, partitioner=None):
    """(v [n, T, len(layers), d] float32, valid [n, T] bool), T the most turns of any row."""
    if turn_spans is None:
        raise InputError("turn_vectors: field 'turn_spans' is needed (one span per agent turn).")
    layers = activations.check_inputs(cfg, token_lists, layers, pooling, "mean", turn_spans)
    rows, spans, where = [], [], []
    for i, toks in enumerate(token_lists):
        for t, (s, e) in enumerate(turn_spans[i]):
            rows.append(list(toks[:e]))
            spans.append([(s, e)])
            where.append((i, t))
    n_turns = max(len(s) for s in turn_spans) if turn_spans else 0
    v = np.zeros((len(token_lists), n_turns, len(layers), cfg.d_model), np.float32)
    valid = np.zeros((len(token_lists), n_turns), bool)
    if rows:
        acts = activations.extract(cfg, params, rows, layers, pooling, spans,
                                   batch_tokens=batch_tokens, partitioner=partitioner)
        for (i, t), a in zip(where, acts):
            v[i, t], valid[i, t] = a, True
    return v, valid


def attention_weights(v: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """[n, T, L] softmax weights over valid turns of <v_t, v_last> / sqrt(d)."""
    v64 = v.astype(np.float64)
    last = _last_index(valid)
    q = np.take_along_axis(v64, last[:, None, None, None], axis=1)  # [n, 1, L, d]
    scores = (v64 * q).sum(-1) / np.sqrt(v.shape[-1])  # [n, T, L]
    scores = np.where(valid[..., None], scores, -np.inf)
    scores -= scores.max(axis=1, keepdims=True)
    w = np.exp(scores)
    return w / w.sum(axis=1, keepdims=True)


def aggregate(v: np.ndarray, valid: np.ndarray, how: str = "mean") -> np.ndarray:
    """Pool [n, T, L, d] turn vectors over their valid turns -> [n, L, d] float32."""
    if how not in TURN_POOLINGS:
        raise InputError(f"turn pooling {how!r} is not one of {TURN_POOLINGS}.")
    v, valid = np.asarray(v), np.asarray(valid, bool)
    if v.ndim != 4 or valid.shape != v.shape[:2]:
        raise InputError(f"turn vectors must be [n, T, L, d] with valid [n, T], got "
                         f"{v.shape} and {valid.shape}.")
    if not valid.any(axis=1).all():
        raise InputError(f"row {int(np.argmin(valid.any(axis=1)))} has no valid turn.")
    m = valid[..., None, None]
    if how == "mean":
        out = (v.astype(np.float64) * m).sum(1) / valid.sum(1)[:, None, None]
    elif how == "max":
        out = np.where(m, v, -np.inf).max(axis=1)
    elif how == "last":
        out = np.take_along_axis(v, _last_index(valid)[:, None, None, None], axis=1)[:, 0]
    else:
        w = attention_weights(v, valid)
        out = (w[..., None] * np.where(m, v.astype(np.float64), 0.0)).sum(1)
    return out.astype(np.float32)


def _last_index(valid: np.ndarray) -> np.ndarray:
    """The index of each row's last valid turn."""
    t = valid.shape[1]
    return t - 1 - np.argmax(valid[:, ::-1], axis=1)


def pooled(cfg, params, token_lists, turn_spans: Sequence, layers, pooling: str = "mean",
           how: str = "mean", **kw) -> np.ndarray:
    """`aggregate(*turn_vectors(...), how)`: [n, len(layers), d] per-row features."""
    return aggregate(*turn_vectors(cfg, params, token_lists, turn_spans, layers, pooling, **kw),
                     how)
