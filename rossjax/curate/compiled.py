"""The compiled example format: what `rossjax curate` writes and training, select, mix and
inspect read.

Record encoding inside the ArrayRecord shards (one record per example, stdlib + numpy only):
    b"RJX1" | uint32 little-endian header length | JSON header | array bytes
with header {"id", "provenance", "turn_spans", "n", "arrays": [[name, dtype], ...]} and the arrays
(input_ids int32, loss_mask uint8, eligible_mask uint8, each n long) concatenated in that order.
`read_compiled(DIR)` and `decode_example(bytes)` read it back.

A curated folder is exactly the shards its report.json lists (issue 36): curate records each
shard's size and whole-file sha256 as it writes it, and `compiled_paths` (every reader's way in:
training, select, mix, inspect, export, probes) opens those shards and no others, refusing a
folder where one is extra (another run's), missing, or holds other bytes, in one sentence naming
the file. A report that lists shards without hashes (the Beam runner, mix) is checked for the
exact set of names; a folder whose report lists no shards at all (select) is read as found.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
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
    """Shard files of a curated dir (those its report.json lists, checked: module docstring), or
    a single shard path."""
    if os.path.isdir(path_or_dir):
        on_disk = sorted(glob.glob(os.path.join(path_or_dir, SHARD_GLOB)))
        report = os.path.join(path_or_dir, "report.json")
        if not os.path.lexists(report):
            if not on_disk:
                raise FileNotFoundError(f"{path_or_dir}: no {SHARD_GLOB} shards and no report.json")
            return on_disk
        listed = listed_shards(path_or_dir)
        if listed is None:
            return on_disk
        names = [e["path"] for e in listed]
        extra = sorted(set(map(os.path.basename, on_disk)) - set(names))
        if extra:
            raise ShardMismatch(
                f"{os.path.join(path_or_dir, extra[0])} is not one of the {len(names)} shards its "
                f"report.json lists, so the folder mixes in another run's output; curate again "
                f"into a folder of its own (or remove the file).")
        for e in listed:
            _check_shard(os.path.join(path_or_dir, e["path"]), e)
        return [os.path.join(path_or_dir, n) for n in names]
    if not os.path.exists(path_or_dir):
        raise FileNotFoundError(f"{path_or_dir}: no such curated dir or shard")
    return [path_or_dir]


class ShardMismatch(InputError):
    """A curated folder's shards disagree with its report.json."""


def listed_shards(folder: str) -> list[dict] | None:
    """The shards report.json lists, as [{path, ...}] (a plain name becomes {path}); None when it
    lists none (no `shards` field). A report that is a link is refused (runlock.read_nofollow)."""
    from rossjax.runlock import read_nofollow

    report = os.path.join(folder, "report.json")
    try:
        rep = json.loads(read_nofollow(report, what="a curated folder's report"))
    except ValueError as e:
        raise InputError(f"{report}: the report is not valid JSON ({e}).") from None
    shards = rep.get("shards") if isinstance(rep, dict) else None
    if shards is None:
        return None
    out = [{"path": e} if isinstance(e, str) else e for e in shards]
    for e in out:  # a listed name outside the folder would read another folder's data
        name = e.get("path") if isinstance(e, dict) else None
        if not isinstance(name, str) or os.path.basename(name) != name or not fnmatch.fnmatchcase(
                name, SHARD_GLOB):
            raise InputError(f"{report} lists shard {name!r}, which is not a {SHARD_GLOB} file "
                             f"of that folder.")
    return out


# (real path, inode, size, mtime, ctime) -> sha256 of shards already checked by this process:
# every reader of a run (fingerprint, length census, loader) checks the same folder, and any
# write to a file changes its ctime, so a shard changed since is hashed again.
_CHECKED: dict[tuple, str] = {}


def _check_shard(path: str, entry: dict) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ShardMismatch(f"{path} is listed in its report.json but missing, so the folder is "
                            f"not the output curate wrote; curate it again.") from None
    if "bytes" in entry and st.st_size != entry["bytes"]:
        raise ShardMismatch(f"{path} has {st.st_size} bytes but its report.json records "
                            f"{entry['bytes']}; the file was truncated or replaced after curate "
                            f"wrote it; curate again.")
    if "sha256" not in entry:
        return
    key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _CHECKED:
        _CHECKED[key] = sha256_file(path)
    if _CHECKED[key] != entry["sha256"]:
        raise ShardMismatch(f"{path} does not match the sha256 its report.json records (the file "
                            f"changed after curate wrote it); curate again.")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def shard_digests(path_or_dir) -> dict[str, tuple[int, str]]:
    """{shard path: (bytes, sha256)} of a curated dir's shards: the sha256 curate recorded (and
    compiled_paths checked), else the whole file hashed now (resume's fingerprint)."""
    paths = compiled_paths(path_or_dir)
    recorded = {}
    if os.path.isdir(path_or_dir) and os.path.lexists(os.path.join(path_or_dir, "report.json")):
        recorded = {e["path"]: e.get("sha256") for e in listed_shards(path_or_dir) or []}
    return {p: (os.path.getsize(p), recorded.get(os.path.basename(p)) or sha256_file(p))
            for p in paths}


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
    shard's {path, examples, bytes, sha256} is appended to `shards` (the report's list). The
    hash is taken as each shard closes, while the run still holds its output's lock: the
    ArrayRecord writer takes a path, not a stream, so the bytes are read back (from the page
    cache, just written) rather than hashed on their way out."""

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
            path = os.path.join(self.out_dir, self.shards[-1]["path"])
            self.shards[-1].update(bytes=os.path.getsize(path), sha256=sha256_file(path))
            self.writer, self.count, self.index = None, 0, self.index + 1
