"""Per-example gradient sketches of the LM head: `rossjax extract --config.kind=grad_sketch`,
read by `rossjax select --config.method=gradient --config.gradient_store=DIR`.

For a row with target positions T (the tokens of its assistant turns when `use_turns` gives turn
spans, else every token after the first), the gradient of its mean next-token NLL with respect to
the LM head W (d x V: the output projection, tied to the embedding or not) is

    G = H^T (P - Y) / |T|,     H: final-norm hidden states predicting T [|T|, d],
                               P: softmax of the logits there, Y: one-hot targets [|T|, V].

Its sketch is vec(A^T G B) with fixed Gaussian A [d, k1] / sqrt(k1) and B [V, k2] / sqrt(k2)
(numpy PCG64(seed): the same on every machine), computed as (H A)^T ((P - Y) B) / |T| without
forming G: a Kronecker-structured Johnson-Lindenstrauss projection (the factored sketch of
LoGra-style gradient data selection), so sketch inner products estimate gradient inner products
(E[<S(G1), S(G2)>] = <G1, G2>). The logits are taken as H W (no softcap; true of Qwen, Llama and
Mistral). The store has the activation store's layout (store.py), one "layer" named
`lm_head_grad` of width k1 * k2, manifest `kind: grad_sketch`; the whole store is written, then
marked complete (a killed run starts again; there is no per-batch resume here).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from rossjax import runlock
from rossjax.errors import ConfigError, InputError, read_json
from rossjax.probes import activations, store

LAYER = "lm_head_grad"


def projections(d: int, vocab: int, k1: int, k2: int, seed: int):
    """The fixed (A [d, k1], B [vocab, k2]) float32 Gaussian sketch matrices for `seed`."""
    rng = np.random.Generator(np.random.PCG64(seed))
    a = rng.standard_normal((d, k1), dtype=np.float32) / np.sqrt(k1)
    b = rng.standard_normal((vocab, k2), dtype=np.float32) / np.sqrt(k2)
    return a, b


def _target_mask(n: int, spans) -> np.ndarray:
    """bool[n]: position p predicts token p + 1, a target (inside a span when spans are given)."""
    want = np.zeros(n, bool)
    if spans is None:
        want[1:] = True
    else:
        for s, e in spans:
            want[max(s, 1):e] = True
    return np.r_[want[1:], False]


def make_sketch_fn(cfg, a, b):
    from rossjax import models

    a, b = jnp.asarray(a), jnp.asarray(b)

    @jax.jit
    def run(params, tokens, seg, pred_mask):
        logits, hidden = models.forward(cfg, params, tokens, segment_ids=seg,
                                        hidden_layers=(cfg.n_layers,))
        h = jax.lax.stop_gradient(hidden[cfg.n_layers]).astype(jnp.float32)   # [r, s, d]
        p = jax.nn.softmax(jax.lax.stop_gradient(logits).astype(jnp.float32), axis=-1)
        nxt = jnp.concatenate([tokens[:, 1:], tokens[:, :1]], axis=1)        # the target ids
        m = pred_mask.astype(jnp.float32)
        e_b = (p @ b - b[nxt]) * m[..., None]                                 # (P - Y) B  [r, s, k2]
        h_a = h @ a                                                           # H A        [r, s, k1]
        s = jnp.einsum("rsi,rsj->rij", h_a, e_b) / jnp.maximum(m.sum(1), 1.0)[:, None, None]
        return s.reshape(s.shape[0], -1)

    return run


def sketches(cfg, params, token_lists, turn_spans=None, *, k1=16, k2=16, seed=0,
             batch_tokens=8192):
    """Yield (row indices, sketches [k, k1 * k2] float32) in length-bucketed batches."""
    a, b = projections(cfg.d_model, cfg.vocab_size, k1, k2, seed)
    run = make_sketch_fn(cfg, a, b)
    for blen, per, rows in activations.plan_batches([len(t) for t in token_lists], batch_tokens):
        tokens = np.zeros((per, blen), np.int32)
        seg = np.zeros((per, blen), np.int32)
        mask = np.zeros((per, blen), bool)
        for r, i in enumerate(rows):
            toks = np.asarray(token_lists[i], np.int32)
            tokens[r, :len(toks)], seg[r, :len(toks)] = toks, 1
            mask[r, :len(toks)] = _target_mask(len(toks), None if turn_spans is None else turn_spans[i])
        for r in range(len(rows), per):  # dummy rows keep the batch shape fixed
            seg[r, 0] = 1
        yield np.asarray(rows), np.asarray(run(params, tokens, seg, mask))[:len(rows)]


def write_sketch_store(out_dir, cfg, params, ids, token_lists, turn_spans=None, *, k1=16, k2=16,
                       seed=0, batch_tokens=8192, model_name="") -> dict:
    """Write the sketches of every row into `out_dir` (the activation store layout)."""
    import tensorstore as ts

    ids = [str(i) for i in ids]
    if len(set(ids)) != len(ids):
        raise InputError(f"{out_dir}: field 'id' repeats; sketch rows need unique ids.")
    if min(k1, k2) < 1:
        raise ConfigError(f"config.sketch.k1 {k1} and k2 {k2} must be >= 1.")
    short = [i for i, t in zip(ids, token_lists) if len(t) < 2]
    if short:
        raise InputError(f"row {short[0]!r} has fewer than 2 tokens: no next-token target to "
                         f"take a gradient of.")
    width = k1 * k2
    manifest = {"kind": "grad_sketch", "model": model_name, "model_config": dataclasses.asdict(cfg),
                "layers": [LAYER], "pooling": "grad_sketch", "turn_pooling": None,
                "turns": turn_spans is not None, "sketch": {"k1": k1, "k2": k2, "seed": seed},
                "n": len(ids), "d_model": width, "dtype": "float32",
                "ids_sha256": store._ids_digest(ids), "complete": False}
    paths = store._store_paths(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    lock = runlock.acquire(out_dir, "rossjax extract")
    try:
        if os.path.exists(paths["manifest"]):
            old = read_json(paths["manifest"], "sketch store manifest")
            if old.get("complete") and {k: v for k, v in old.items() if k not in ("complete", "files")} \
                    == json.loads(json.dumps({k: v for k, v in manifest.items() if k != "complete"})):
                return old
            if old.get("complete"):
                raise InputError(f"{paths['manifest']}: an existing store was written with other "
                                 f"settings; use a new output directory.")
        arr = ts.open(store._ts_spec(paths["array"], (len(ids), 1, width)), create=True,
                      delete_existing=True).result()
        store._atomic_write(paths["ids"], json.dumps(ids).encode())
        store._atomic_write(paths["manifest"], json.dumps(manifest, indent=1).encode())
        for rows, sk in sketches(cfg, params, token_lists, turn_spans, k1=k1, k2=k2, seed=seed,
                                 batch_tokens=batch_tokens):
            if not np.isfinite(sk).all():
                bad = rows[int(np.flatnonzero(~np.isfinite(sk).all(1))[0])]
                raise InputError(f"row {ids[bad]!r}: its gradient sketch is not finite.")
            arr.oindex[rows] = sk[:, None, :]
        manifest["files"] = store._file_digests(out_dir)
        manifest["complete"] = True
        store._atomic_write(paths["manifest"], json.dumps(manifest, indent=1).encode())
        return manifest
    finally:
        if lock is not None:
            lock.release()


def run(c, workdir: str = "") -> dict:
    """`rossjax extract --config.kind=grad_sketch`: rows -> model -> the sketch store."""
    from rossjax.models import loading

    out = c.output or (os.path.join(workdir, "grad_sketch") if workdir else "")
    if not c.input or not out:
        raise ConfigError("configs/extract.py: fields 'input' and 'output' must be set.")
    ids, lists, spans = activations.read_rows(c.input, c.tokenizer, c.use_turns)
    section = loading.section_from_spec(c.model, c.dtype, where="configs/extract.py: field 'model'")
    cfg, params = loading.load_model(section, None, seed=c.seed, field="config.model")
    sk = c.get("sketch") or {}
    man = write_sketch_store(out, cfg, params, ids, lists, spans, k1=int(sk.get("k1", 16)),
                             k2=int(sk.get("k2", 16)), seed=int(sk.get("seed", 0)),
                             batch_tokens=c.batch_tokens, model_name=c.model)
    return {**man, "output": out, "mesh": {"devices": 1}}
