"""Activations of a frozen reference model, pooled per row, stored in a tensorstore zarr array.

    acts = extract(cfg, params, token_lists, layers=(4, 8), pooling="mean")   # [n, 2, d] float32
    rossjax extract --config=configs/extract.py --config.output=runs/acts

Pooling. Without turn spans a row is pooled over all its tokens (`mean`, `last`, `max`). With
turn spans (token ranges of the assistant turns, from the curation pipeline) each turn is pooled
over its own tokens first, giving one vector per generated turn, and those are then pooled over
turns with `turn_pooling`. Hidden states use the models convention: 0 = embeddings, i = block i,
n_layers = after the final norm.

Rows are sorted by length and run in length-bucketed batches (few compiled shapes, little padding);
right padding carries segment id 0, so it never leaks into real tokens.

Store layout (a directory): activations.zarr [n, len(layers), d] float32, ids.json (row order),
done.bits (packed bitmap of finished rows, replaced atomically after each written batch) and
manifest.json, whose `complete` flag is set last. A killed run resumes from done.bits; a store
whose manifest is not complete is refused by `open_store`, so it is never read as finished.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

POOLINGS = ("mean", "last", "max")
_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def _check_inputs(cfg, token_lists, layers, pooling, turn_pooling, turn_spans):
    if pooling not in POOLINGS or turn_pooling not in POOLINGS:
        raise ValueError(f"extract: pooling {pooling!r}/{turn_pooling!r} is not one of {POOLINGS}.")
    layers = tuple(int(x) for x in layers)
    if not layers:
        raise ValueError("extract: field 'layers' is empty.")
    for x in layers:
        if not 0 <= x <= cfg.n_layers:
            raise ValueError(f"extract: field 'layers' asks for layer {x}, but the model has "
                             f"{cfg.n_layers} layers (valid: 0 = embeddings .. {cfg.n_layers}).")
    if turn_spans is not None and len(turn_spans) != len(token_lists):
        raise ValueError(f"extract: field 'turn_spans' has {len(turn_spans)} rows for "
                         f"{len(token_lists)} token lists.")
    for i, toks in enumerate(token_lists):
        if len(toks) == 0:
            raise ValueError(f"extract: row {i} has an empty text (no tokens).")
        if turn_spans is not None:
            spans = turn_spans[i]
            if len(spans) == 0:
                raise ValueError(f"extract: row {i} field 'turn_spans' is empty (no assistant turn).")
            for s, e in spans:
                if not 0 <= s < e <= len(toks):
                    raise ValueError(f"extract: row {i} field 'turn_spans' holds ({s}, {e}), outside "
                                     f"the row's {len(toks)} tokens or empty.")
    return layers


def _bucket(n: int) -> int:
    for b in _BUCKETS:
        if n <= b:
            return b
    return -(-n // 4096) * 4096


def plan_batches(lengths: Sequence[int], batch_tokens: int):
    """Yield (bucket_len, rows_per_batch, row indices) in length order.

    rows_per_batch is a power of two with rows * bucket_len <= batch_tokens (at least 1), fixed per
    bucket, so the number of compiled shapes is the number of buckets.
    """
    order = np.argsort(np.asarray(lengths), kind="stable")
    by_bucket: dict[int, list[int]] = {}
    for i in order:
        by_bucket.setdefault(_bucket(int(lengths[i])), []).append(int(i))
    for blen, rows in sorted(by_bucket.items()):
        per = max(1, 1 << int(np.floor(np.log2(max(1, batch_tokens // blen)))))
        for s in range(0, len(rows), per):
            yield blen, per, rows[s:s + per]


@dataclasses.dataclass(frozen=True)
class _PoolSpec:
    cfg: object
    layers: tuple
    pooling: str
    turn_pooling: str


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
    last = jnp.maximum(valid.sum(1) - 1, 0)
    return jnp.take_along_axis(v, last[:, None, None], axis=1)[:, 0]


@functools.lru_cache(maxsize=16)
def _make_batch_fn(spec: _PoolSpec):
    from rossjax import models

    @jax.jit
    def run(params, tokens, seg, mask, last_idx, turn_valid):
        _, hidden = models.forward(spec.cfg, params, tokens, segment_ids=seg,
                                   hidden_layers=spec.layers)
        hidden = jax.tree.map(jax.lax.stop_gradient, hidden)  # frozen model: no gradients
        per_layer = [_pool_turns(_pool_tokens(hidden[l], mask, last_idx, spec.pooling), turn_valid,
                                 spec.turn_pooling) for l in spec.layers]
        return jnp.stack(per_layer, axis=1)   # [b, len(layers), d]

    return run


def iter_extract(cfg, params, token_lists, layers, pooling="mean", turn_spans=None, *,
                 turn_pooling="mean", batch_tokens=8192, skip=None):
    """Yield (row indices, activations [k, len(layers), d]) batch by batch, skipping rows where
    `skip[row]` is true. The streaming core of `extract` and of the resumable store writer."""
    layers = _check_inputs(cfg, token_lists, layers, pooling, turn_pooling, turn_spans)
    run = _make_batch_fn(_PoolSpec(cfg, layers, pooling, turn_pooling))
    todo = [i for i in range(len(token_lists)) if skip is None or not skip[i]]
    lengths = [len(token_lists[i]) for i in todo]
    max_turns = 1 if turn_spans is None else max(len(turn_spans[i]) for i in todo) if todo else 1
    n_turns = 1 << int(np.ceil(np.log2(max_turns)))  # bucketed too: few compiled shapes
    for blen, per, local in plan_batches(lengths, batch_tokens):
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
        yield np.asarray(rows), out


def extract(cfg, params, token_lists, layers, pooling="mean", turn_spans=None, *,
            turn_pooling="mean", batch_tokens=8192) -> np.ndarray:
    """Pooled activations [n, len(layers), d_model] (float32) for every row, in input order."""
    n = len(token_lists)
    out = np.zeros((n, len(tuple(layers)), cfg.d_model), np.float32)
    for rows, acts in iter_extract(cfg, params, token_lists, layers, pooling, turn_spans,
                                   turn_pooling=turn_pooling, batch_tokens=batch_tokens):
        out[rows] = acts
    return out


# ----------------------------------------------------------------------------- the store

def _store_paths(d):
    return {k: os.path.join(d, v) for k, v in (("array", "activations.zarr"), ("ids", "ids.json"),
                                                   ("done", "done.bits"), ("manifest", "manifest.json"))}


def _atomic_write(path: str, data: bytes):
    """Write-then-rename, so a crash leaves the old file or the new one, never half of one."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _ids_digest(ids) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


def _ts_spec(path, shape=None):
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": path}}
    if shape is not None:
        chunk = max(1, min(shape[0], (4 << 20) // max(1, 4 * shape[1] * shape[2])))  # ~4 MiB chunks
        spec["metadata"] = {"shape": list(shape), "chunks": [chunk, shape[1], shape[2]], "dtype": "<f4"}
    return spec


def write_store(out_dir, cfg, params, ids, token_lists, layers, pooling="mean", turn_spans=None, *,
                turn_pooling="mean", batch_tokens=8192, model_name="", progress=True) -> dict:
    """Extract into `out_dir`, resuming a run that was killed with the same settings.

    Returns the manifest. Settings that differ from an unfinished store's manifest are an error
    (its finished rows would not be comparable with the new ones).
    """
    import tensorstore as ts
    from tqdm import tqdm

    ids = [str(i) for i in ids]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{out_dir}: field 'id' repeats; activation rows need unique ids.")
    if len(ids) != len(token_lists):
        raise ValueError(f"{out_dir}: {len(ids)} ids for {len(token_lists)} token lists.")
    layers = _check_inputs(cfg, token_lists, layers, pooling, turn_pooling, turn_spans)
    n, shape = len(ids), (len(ids), len(layers), cfg.d_model)
    manifest = {"model": model_name, "model_config": dataclasses.asdict(cfg), "layers": list(layers),
                "pooling": pooling, "turn_pooling": turn_pooling, "turns": turn_spans is not None,
                "n": n, "d_model": cfg.d_model, "dtype": "float32", "ids_sha256": _ids_digest(ids),
                "complete": False}
    paths = _store_paths(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe_file = os.path.join(out_dir, ".write_test")
        with open(probe_file, "wb") as f:
            f.write(b"x")
        os.remove(probe_file)
    except OSError as e:
        raise ValueError(f"{out_dir}: the activation store directory is not writable ({e.strerror}).") from None
    done = np.zeros(n, bool)
    if os.path.exists(paths["manifest"]):
        old = json.load(open(paths["manifest"]))
        same = {k: v for k, v in old.items() if k != "complete"} == \
               {k: v for k, v in json.loads(json.dumps(manifest)).items() if k != "complete"}
        if not same:
            raise ValueError(f"{paths['manifest']}: an existing store was written with other settings "
                             "(model, layers, pooling or ids); use a new output directory.")
        if old["complete"]:
            return old
        if os.path.exists(paths["done"]):
            done = np.unpackbits(np.frombuffer(open(paths["done"], "rb").read(), np.uint8))[:n].astype(bool)
        arr = ts.open(_ts_spec(paths["array"]), open=True).result()
    else:
        need = int(np.prod(shape)) * 4
        free = shutil.disk_usage(out_dir).free
        if need > free:
            raise ValueError(f"{out_dir}: the activation store needs {need} bytes but the disk has "
                             f"{free} free.")
        try:
            arr = ts.open(_ts_spec(paths["array"], shape), create=True, delete_existing=True).result()
            _atomic_write(paths["ids"], json.dumps(ids).encode())
            _atomic_write(paths["manifest"], json.dumps(manifest, indent=1).encode())
        except (OSError, ValueError) as e:
            raise ValueError(f"{out_dir}: could not create the activation store ({e}).") from None
    bar = tqdm(total=n, initial=int(done.sum()), desc="extract", unit="row", disable=not progress)
    for rows, acts in iter_extract(cfg, params, token_lists, layers, pooling, turn_spans,
                                   turn_pooling=turn_pooling, batch_tokens=batch_tokens, skip=done):
        try:
            arr.oindex[rows] = acts  # noqa: the write completes (or raises) before `done` moves
            done[rows] = True
            _atomic_write(paths["done"], np.packbits(done).tobytes())
        except (OSError, ValueError) as e:
            raise ValueError(f"{out_dir}: writing activations failed ({e}); rerun to resume.") from None
        bar.update(len(rows))
    bar.close()
    manifest["complete"] = True
    _atomic_write(paths["manifest"], json.dumps(manifest, indent=1).encode())  # last: marks finished
    return manifest


@dataclasses.dataclass
class ActivationStore:
    path: str
    ids: list
    manifest: dict
    array: object  # tensorstore handle [n, len(layers), d]

    def read(self, layer: int | None = None, rows=None) -> np.ndarray:
        """[n, len(layers), d], or [n, d] for one stored `layer` (a model layer index)."""
        a = self.array
        if layer is not None:
            if layer not in self.manifest["layers"]:
                raise ValueError(f"{self.path}: layer {layer} is not in the store (layers "
                                 f"{self.manifest['layers']}).")
            a = a[:, self.manifest["layers"].index(layer)]
        if rows is not None:
            a = a.oindex[np.asarray(rows)]
        return np.asarray(a.read().result())


def open_store(path) -> ActivationStore:
    """Open a finished store; an unfinished or foreign directory is a ValueError."""
    import tensorstore as ts

    paths = _store_paths(path)
    if not os.path.exists(paths["manifest"]):
        raise ValueError(f"{path}: no manifest.json; this is not an activation store.")
    manifest = json.load(open(paths["manifest"]))
    if not manifest.get("complete"):
        raise ValueError(f"{path}: the activation store is unfinished (manifest 'complete' is false); "
                         "rerun `rossjax extract` to resume it.")
    ids = json.load(open(paths["ids"]))
    if _ids_digest(ids) != manifest["ids_sha256"] or len(ids) != manifest["n"]:
        raise ValueError(f"{paths['ids']}: field 'ids' does not match the manifest's ids digest.")
    return ActivationStore(path, ids, manifest, ts.open(_ts_spec(paths["array"]), open=True).result())



# ----------------------------------------------------------------------------- CLI

def load_model(spec: str, seed: int = 0, dtype: str = "float32"):
    """"preset:NAME" (random init, for smoke runs and tests) or a Hugging Face model folder."""
    from rossjax import models

    if spec.startswith("preset:"):
        cfg = models.get_preset(spec.split(":", 1)[1], dtype=dtype, param_dtype=dtype)
        return cfg, models.init_params(cfg, jax.random.PRNGKey(seed))
    return models.load_hf(spec, dtype=dtype)


def read_rows(path: str, tokenizer: str = "", use_turns: bool = False):
    """(ids, token_lists, turn_spans or None) from a curated directory or a JSONL(.gz) file whose
    rows hold "id" and "input_ids" (or "text", tokenized with `tokenizer`), optionally "turn_spans"."""
    import gzip

    if not os.path.exists(path):
        raise ValueError(f"{path}: the extraction input does not exist.")
    if os.path.isdir(path):
        from rossjax.curate.pipeline import read_compiled
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
                        raise ValueError(f"{path} row {n}: not valid JSON ({e.msg}).") from None
    tok = None
    ids, lists, spans = [], [], []
    for n, r in enumerate(rows, start=1):
        if "id" not in r:
            raise ValueError(f"{path} row {n}: field 'id' is missing.")
        if "input_ids" in r:
            toks = list(r["input_ids"])
        elif "text" in r:
            if not tokenizer:
                raise ValueError(f"{path} row {n}: field 'text' needs --config.tokenizer to be set.")
            if tok is None:
                from rossjax.curate.tokenizers import load_tokenizer
                tok = load_tokenizer(tokenizer)
            toks = tok.encode(r["text"])
        else:
            raise ValueError(f"{path} row {n}: needs field 'input_ids' or 'text'.")
        if not toks:
            raise ValueError(f"{path} row {n}: field '{'input_ids' if 'input_ids' in r else 'text'}' "
                             "is empty.")
        if use_turns and not r.get("turn_spans"):
            raise ValueError(f"{path} row {n}: field 'turn_spans' is missing or empty.")
        ids.append(str(r["id"]))
        lists.append(toks)
        spans.append([tuple(s) for s in r["turn_spans"]] if use_turns else None)
    if not ids:
        raise ValueError(f"{path}: the extraction input has no rows.")
    return ids, lists, (spans if use_turns else None)


def main(argv=None) -> int:
    from rossjax.cli import parse_config

    c, flags, _ = parse_config(argv or [], default_config=None)
    if c is None:
        raise ValueError("rossjax extract: --config=configs/extract.py is required.")
    out = c.output or (os.path.join(flags.workdir, "activations") if flags.workdir else "")
    if not c.input or not out:
        raise ValueError("configs/extract.py: fields 'input' and 'output' must be set.")
    cfg, params = load_model(c.model, c.seed, c.dtype)
    ids, lists, spans = read_rows(c.input, c.tokenizer, c.use_turns)
    man = write_store(out, cfg, params, ids, lists, tuple(c.layers), c.pooling, spans,
                      turn_pooling=c.turn_pooling, batch_tokens=c.batch_tokens, model_name=c.model)
    print(f"rossjax extract: {man['n']} rows x layers {man['layers']} x d {man['d_model']} "
          f"({man['pooling']} pooling) -> {out}")
    return 0
