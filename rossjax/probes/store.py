"""The activation store: pooled activations in a tensorstore zarr array, resumable and checked.

Store layout (a directory): activations.zarr [n, len(layers), d] float32, ids.json (row order),
done.bits (packed bitmap of finished rows, replaced atomically after each written batch) and
manifest.json, whose `complete` flag is set last, together with `files`: the size and sha256 of
every file of activations.zarr and of ids.json. A killed run resumes from done.bits; a store
whose manifest is not complete is refused by `open_store`, so it is never read as finished, and
`open_store` verifies the checksums (a changed chunk file is one sentence naming it). While
`rossjax extract` writes a store it holds the folder's run.lock (rossjax/runlock.py): a second
extract into the same folder is refused, naming the first one's host and pid.
Extraction also writes TensorBoard events (tb/) and metrics.jsonl into the store directory:
rows/s, tokens/s and the padding share of the forward batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time

import numpy as np

from rossjax import checksums, runlock
from rossjax.errors import ConfigError, InputError, read_json
from rossjax.probes import activations

# manifest fields that are not the store's settings (a resumed store compares the rest)
_STATUS = ("complete", "files")


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


def _file_digests(out_dir) -> dict:
    """{path in the store: [size, sha256]} of the array's files and the id list."""
    paths = _store_paths(out_dir)
    files = {f"activations.zarr/{k}": v for k, v in checksums.digest_folder(paths["array"]).items()}
    files["ids.json"] = [os.path.getsize(paths["ids"]), checksums.file_sha256(paths["ids"])]
    return files


def _ids_digest(ids) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


def _ts_spec(path, shape=None):
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": path}}
    if shape is not None:
        chunk = max(1, min(shape[0], (4 << 20) // max(1, 4 * shape[1] * shape[2])))  # ~4 MiB chunks
        spec["metadata"] = {"shape": list(shape), "chunks": [chunk, shape[1], shape[2]], "dtype": "<f4"}
    return spec


def write_store(out_dir, cfg, params, ids, token_lists, layers, pooling="mean", turn_spans=None, *,
                turn_pooling="mean", batch_tokens=8192, model_name="", progress=True, mesh=None,
                rules=None, partitioner=None) -> dict:
    """Extract into `out_dir`, resuming a run that was killed with the same settings.

    Returns the manifest. Settings that differ from an unfinished store's manifest are an error
    (its finished rows would not be comparable with the new ones). `partitioner` (or `mesh` +
    `rules`): see `activations.iter_extract` (the batch runs over the mesh's data axes).
    """
    import tensorstore as ts
    from tqdm import tqdm

    from rossjax.monitor import MetricsWriter

    ids = [str(i) for i in ids]
    if len(set(ids)) != len(ids):
        raise InputError(f"{out_dir}: field 'id' repeats; activation rows need unique ids.")
    if len(ids) != len(token_lists):
        raise InputError(f"{out_dir}: {len(ids)} ids for {len(token_lists)} token lists.")
    layers = activations.check_inputs(cfg, token_lists, layers, pooling, turn_pooling, turn_spans)
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
        raise InputError(f"{out_dir}: the activation store directory is not writable ({e.strerror}).") from None
    lock = runlock.acquire(out_dir, "rossjax extract")  # one writer per store at a time
    try:
        done = np.zeros(n, bool)
        if os.path.exists(paths["manifest"]):
            old = read_json(paths["manifest"], "activation store manifest")
            same = {k: v for k, v in old.items() if k not in _STATUS} == \
                   {k: v for k, v in json.loads(json.dumps(manifest)).items() if k not in _STATUS}
            if not same:
                raise InputError(f"{paths['manifest']}: an existing store was written with other settings "
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
                raise InputError(f"{out_dir}: the activation store needs {need} bytes but the disk has "
                                 f"{free} free.")
            try:
                arr = ts.open(_ts_spec(paths["array"], shape), create=True, delete_existing=True).result()
                _atomic_write(paths["ids"], json.dumps(ids).encode())
                _atomic_write(paths["manifest"], json.dumps(manifest, indent=1).encode())
            except (OSError, ValueError) as e:
                raise InputError(f"{out_dir}: could not create the activation store ({e}).") from None
        bar = tqdm(total=n, initial=int(done.sum()), desc="extract", unit="row", disable=not progress)
        writer = MetricsWriter(out_dir)
        rate = _Rate(writer, bar)
        try:
            for rows, acts, padded in activations.iter_extract(
                    cfg, params, token_lists, layers, pooling, turn_spans, turn_pooling=turn_pooling,
                    batch_tokens=batch_tokens, skip=done, partitioner=partitioner, mesh=mesh, rules=rules,
                    with_padding=True):
                try:
                    arr.oindex[rows] = acts  # the write completes (or raises) before `done` moves
                    done[rows] = True
                    _atomic_write(paths["done"], np.packbits(done).tobytes())
                except (OSError, ValueError) as e:
                    raise InputError(f"{out_dir}: writing activations failed ({e}); rerun to resume.") from None
                bar.update(len(rows))
                rate.add(int(done.sum()), len(rows), sum(len(token_lists[i]) for i in rows), padded)
            rate.flush(int(done.sum()), force=True)
        finally:
            bar.close()
            writer.close()
        manifest["files"] = _file_digests(out_dir)
        manifest["complete"] = True
        _atomic_write(paths["manifest"], json.dumps(manifest, indent=1).encode())  # last: marks finished
        return manifest
    finally:
        if lock is not None:
            lock.release()


class _Rate:
    """Extraction throughput to TensorBoard/metrics.jsonl (split "extract"), about every 10 s."""

    def __init__(self, writer, bar, every_s: float = 10.0):
        self.writer, self.bar, self.every_s = writer, bar, every_s
        self.t0 = self.t = time.perf_counter()
        self.rows = self.tokens = self.padded = 0

    def add(self, done: int, rows: int, tokens: int, padded: int):
        self.rows, self.tokens, self.padded = self.rows + rows, self.tokens + tokens, self.padded + padded
        self.flush(done)

    def flush(self, done: int, force: bool = False):
        now = time.perf_counter()
        if not self.rows or (not force and now - self.t < self.every_s):
            return
        dt = max(now - self.t, 1e-9)
        self.writer.write(done, {"rows_done": done, "rows_per_s": self.rows / dt,
                                 "tokens_per_s": self.tokens / dt,
                                 "padding_share": 1.0 - self.tokens / max(self.padded, 1)},
                          prefix="extract")
        self.t, self.rows, self.tokens, self.padded = now, 0, 0, 0


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
                raise InputError(f"{self.path}: layer {layer} is not in the store (layers "
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
        raise InputError(f"{path}: no manifest.json; this is not an activation store.")
    manifest = read_json(paths["manifest"], "activation store manifest")
    if not manifest.get("complete"):
        raise InputError(f"{path}: the activation store is unfinished (manifest 'complete' is false); "
                         "rerun `rossjax extract` to resume it.")
    if "files" in manifest:
        checksums.verify_folder(path, manifest["files"], what=f"activation store {path}")
    else:
        print(f"rossjax: note: activation store {path} has no checksums (written by an older "
              f"rossjax); its files are not verified.", file=sys.stderr)
    ids = read_json(paths["ids"], "activation store id list")
    if _ids_digest(ids) != manifest["ids_sha256"] or len(ids) != manifest["n"]:
        raise InputError(f"{paths['ids']}: field 'ids' does not match the manifest's ids digest.")
    return ActivationStore(path, ids, manifest, ts.open(_ts_spec(paths["array"]), open=True).result())


def run(c, workdir: str = "") -> dict:
    """`rossjax extract` (configs/extract.py): rows -> model -> the activation store. Returns
    the store's manifest plus "output" and "mesh"."""
    from rossjax import sharding
    from rossjax.models import loading

    out = c.output or (os.path.join(workdir, "activations") if workdir else "")
    if not c.input or not out:
        raise ConfigError("configs/extract.py: fields 'input' and 'output' must be set.")
    part = sharding.partitioner_from_config(c)
    ids, lists, spans = activations.read_rows(c.input, c.tokenizer, c.use_turns)
    section = loading.section_from_spec(c.model, c.dtype,
                                        where="configs/extract.py: field 'model'")
    cfg, params = loading.load_model(section, part, seed=c.seed, field="config.model")
    man = write_store(out, cfg, params, ids, lists, tuple(c.layers), c.pooling, spans,
                      turn_pooling=c.turn_pooling, batch_tokens=c.batch_tokens, model_name=c.model,
                      partitioner=part)
    return {**man, "output": out, "mesh": dict(part.mesh.shape)}
