"""Training-side data glue: per-host packed loaders, global batch assembly, a dataset scan.

Each host reads its own shard (`shard_index = jax.process_index()`) of the packed rows and
contributes `global_batch / process_count` rows to every step; the rows become one global
array whose leading dim is split over the mesh's batch axes.
"""

from __future__ import annotations

import os

import jax
import numpy as np

from rossjax.train.sft import BATCH_KEYS


def split_paths(spec: str, field: str) -> list[str]:
    paths = [p.strip() for p in str(spec or "").split(",") if p.strip()]
    if not paths:
        raise ValueError(f"config.{field} is empty; give a curated dir written by `rossjax curate`.")
    for p in paths:
        if not os.path.exists(p):
            raise FileNotFoundError(f"config.{field}: {p} does not exist.")
    return paths


def open_loader(paths, data_cfg, *, rows_per_host: int, num_epochs: int, shuffle: bool, seed: int):
    from rossjax.curate.packing import make_loader

    return make_loader(paths, int(data_cfg.seq_len), int(rows_per_host), seed=int(seed),
                       shuffle=bool(shuffle), num_epochs=int(num_epochs),
                       shard_index=jax.process_index(), shard_count=jax.process_count(),
                       strategy=data_cfg.strategy, truncate=data_cfg.truncate,
                       worker_count=int(data_cfg.worker_count))


def supervised_count(batch) -> int:
    """Supervised prediction targets in a numpy batch (same rule as losses.shift_targets)."""
    lm, seg = np.asarray(batch["loss_mask"]), np.asarray(batch["segment_ids"])
    ok = (lm[:, 1:] != 0) & (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
    return int(ok.sum())


def scan(loader) -> tuple[int, int, int]:
    """(batches, supervised targets, real tokens) of one full pass (this host's shard)."""
    n = sup = tok = 0
    for batch in loader:
        n += 1
        sup += supervised_count(batch)
        tok += int((np.asarray(batch["segment_ids"]) > 0).sum())
    return n, sup, tok


def agree(values, op: str):
    """Combine per-host integers across processes (`min` or `sum`); identity on one process."""
    values = np.asarray(values, np.int64)
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    allv = np.asarray(multihost_utils.process_allgather(values))
    return allv.min(0) if op == "min" else allv.sum(0)


def local_batch(batch, rows: int, seq_len: int) -> dict:
    """Keep the training keys, cast to int32, and pad a short final batch with empty rows
    (segment id 0, nothing supervised), which leave the loss and the gradient unchanged."""
    out = {}
    keys = BATCH_KEYS + (("eligible_mask",) if "eligible_mask" in batch else ())
    for k in keys:
        x = np.asarray(batch[k], np.int32)
        if x.shape[1] != seq_len:
            raise ValueError(f"the loader gave rows of {x.shape[1]} tokens for {k!r}, expected "
                             f"data.seq_len = {seq_len}.")
        if x.shape[0] < rows:
            x = np.concatenate([x, np.zeros((rows - x.shape[0], seq_len), np.int32)])
        out[k] = x
    return out


def to_global(batch: dict, sharding, global_rows: int) -> dict:
    """Per-host numpy rows -> global jax arrays laid out over the batch axes of the mesh."""
    return {k: jax.make_array_from_process_local_data(sharding, v, (global_rows, *v.shape[1:]))
            for k, v in batch.items()}
