"""The compiled example format: what `rossjax curate` writes and training, select, mix and
inspect read.

Record encoding inside the ArrayRecord shards (one record per example, stdlib + numpy only):
    b"RJX1" | uint32 little-endian header length | JSON header | array bytes
with header {"id", "provenance", "turn_spans", "n", "arrays": [[name, dtype], ...]} and the arrays
(input_ids int32, loss_mask uint8, eligible_mask uint8, each n long) concatenated in that order.
`read_compiled(DIR)` and `decode_example(bytes)` read it back.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from typing import Iterator

import numpy as np

from rossjax.errors import InputError

_MAGIC = b"RJX1"
_ARRAYS = (("input_ids", "int32"), ("loss_mask", "uint8"), ("eligible_mask", "uint8"))
SHARD_GLOB = "compiled-*.array_record"
SHARD_OPTIONS = "group_size:1"  # ArrayRecord writer options: random access for grain


def shard_name(index: int) -> str:
    return f"compiled-{index:05d}.array_record"


def encode_example(ex) -> bytes:
    """Bytes of a kept CompiledExample (or a dict with the same fields)."""
    get = ex.get if isinstance(ex, dict) else (lambda k, d=None: getattr(ex, k, d))
    arrays = [np.ascontiguousarray(get(name), dtype=dt) for name, dt in _ARRAYS]
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise InputError(f"example {get('id')!r}: input_ids and masks differ in length")
    header = json.dumps({"id": get("id"), "provenance": get("provenance") or {},
                         "turn_spans": [[int(s), int(e)] for s, e in (get("turn_spans") or [])],
                         "n": n, "arrays": [list(a) for a in _ARRAYS]},
                        separators=(",", ":"), default=str).encode("utf-8")
    return b"".join([_MAGIC, struct.pack("<I", len(header)), header, *(a.tobytes() for a in arrays)])


def decode_example(blob: bytes) -> dict:
    if blob[:4] != _MAGIC:
        raise InputError("not a rossjax compiled example (bad magic bytes)")
    (hlen,) = struct.unpack_from("<I", blob, 4)
    header = json.loads(blob[8:8 + hlen])
    out = {"id": header["id"], "provenance": header["provenance"],
           "turn_spans": [tuple(s) for s in header["turn_spans"]]}
    off, n = 8 + hlen, header["n"]
    for name, dt in header["arrays"]:
        a = np.frombuffer(blob, dtype=dt, count=n, offset=off)
        out[name] = a
        off += a.nbytes
    return out


def compiled_paths(path_or_dir) -> list[str]:
    """Shard files of a curated dir (or a single shard path), sorted."""
    if os.path.isdir(path_or_dir):
        paths = sorted(glob.glob(os.path.join(path_or_dir, SHARD_GLOB)))
        if not paths and not os.path.exists(os.path.join(path_or_dir, "report.json")):
            raise FileNotFoundError(f"{path_or_dir}: no {SHARD_GLOB} shards and no report.json")
        return paths
    if not os.path.exists(path_or_dir):
        raise FileNotFoundError(f"{path_or_dir}: no such curated dir or shard")
    return [path_or_dir]


def read_compiled(path_or_dir) -> Iterator[dict]:
    """Yield compiled examples (id, input_ids, loss_mask, eligible_mask, provenance, turn_spans)."""
    from array_record.python.array_record_module import ArrayRecordReader

    for path in compiled_paths(path_or_dir):
        reader = ArrayRecordReader(path)
        try:
            n = reader.num_records()
            for start in range(0, n, 1024):
                for blob in reader.read(start, min(n, start + 1024)):
                    yield decode_example(blob)
        finally:
            reader.close()


class ShardWriter:
    """Writes encoded examples into out_dir/compiled-NNNNN.array_record, `per_shard` each; each
    shard's {path, examples} is appended to `shards` (the report's list)."""

    def __init__(self, out_dir: str, per_shard: int, shards: list):
        self.out_dir, self.per_shard, self.shards = out_dir, per_shard, shards
        self.writer, self.count, self.index = None, 0, 0

    def write(self, blob: bytes):
        from array_record.python.array_record_module import ArrayRecordWriter

        if self.writer is None:
            path = os.path.join(self.out_dir, shard_name(self.index))
            self.writer = ArrayRecordWriter(path, SHARD_OPTIONS)
            self.shards.append({"path": os.path.basename(path), "examples": 0})
        self.writer.write(blob)
        self.count += 1
        self.shards[-1]["examples"] += 1
        if self.count == self.per_shard:
            self.close()

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.writer, self.count, self.index = None, 0, self.index + 1
