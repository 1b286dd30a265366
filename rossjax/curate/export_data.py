"""Curated examples as Parquet that other trainers read: `rossjax curate
--config.export_format=parquet` writes DIR/data.parquet next to the ArrayRecord shards.

One row per kept example, columns
    id               string
    input_ids        list<int32>   the tokens
    attention_mask   list<int8>    all 1 (rows are not padded)
    labels           list<int32>   input_ids where the loss mask is 1, else -100 (Hugging Face's
                                   ignore index: TRL's SFTTrainer, transformers' Trainer)
    assistant_masks  list<int8>    the loss mask itself (TRL's assistant_only_loss column; verl's
                                   loss_mask)
`labels` are not shifted: the trainer shifts them, as it does its own. Written to a temporary
name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import os

import numpy as np

from rossjax.curate.compiled import read_compiled

COLUMNS = ("id", "input_ids", "attention_mask", "labels", "assistant_masks")
IGNORE_INDEX = -100


def _schema():
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())),
                      ("attention_mask", pa.list_(pa.int8())), ("labels", pa.list_(pa.int32())),
                      ("assistant_masks", pa.list_(pa.int8()))])


def _table(batch: list[dict]):
    import pyarrow as pa

    lens = np.array([len(ex["input_ids"]) for ex in batch], np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    ids = np.concatenate([ex["input_ids"] for ex in batch]).astype(np.int32)
    mask = np.concatenate([ex["loss_mask"] for ex in batch]).astype(np.int8)
    labels = np.where(mask != 0, ids, IGNORE_INDEX).astype(np.int32)

    def lists(values):
        return pa.ListArray.from_arrays(offsets, pa.array(values))

    return pa.Table.from_arrays(
        [pa.array([ex["id"] for ex in batch], pa.string()), lists(ids),
         lists(np.ones(len(ids), np.int8)), lists(labels), lists(mask)], schema=_schema())


def export_parquet(curated_dir: str, path: str | None = None, batch_rows: int = 1024) -> str:
    """Write the curated dir's examples to `path` (default DIR/data.parquet); returns the path."""
    import pyarrow.parquet as pq

    path = path or os.path.join(curated_dir, "data.parquet")
    tmp = path + ".tmp"
    writer = pq.ParquetWriter(tmp, _schema())
    try:
        batch = []
        for ex in read_compiled(curated_dir):
            batch.append(ex)
            if len(batch) == batch_rows:
                writer.write_table(_table(batch))
                batch = []
        if batch:
            writer.write_table(_table(batch))
    finally:
        writer.close()
    os.replace(tmp, path)
    return path
