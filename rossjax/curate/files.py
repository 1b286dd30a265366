"""Reading rollout files: which files an input spec names, their JSON lines (decoded one line at a
time, so a bad byte spoils only its own line) and their Parquet rows. No schema check here
(schema.iter_records adds it; retrogen has its own)."""

from __future__ import annotations

import glob
import gzip
import json
import os
import zlib
from typing import Iterator, NamedTuple

from rossjax.errors import InputError


class SchemaError(InputError):
    """A rollout file that cannot be read at all (not a row: a bad row is bucketed, never raised)."""


class Line(NamedTuple):
    row: int  # 1-based line number
    record: object  # the parsed JSON value, None when the line could not be read
    reason: str | None


ROLLOUT_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet")


def parquet_rows(path: str) -> Iterator[object]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:  # not Parquet at all: nothing can be read
        raise SchemaError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    for batch in pf.iter_batches(batch_size=1024):
        for rec in batch.to_pylist():
            # Parquet has no "absent": drop nulls so optional fields read like JSON's missing keys.
            yield _drop_nulls(rec)


def _drop_nulls(x):
    if isinstance(x, dict):
        return {k: _drop_nulls(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_nulls(v) for v in x]
    return x


def _json_rows(path: str) -> Iterator[bytes]:
    # Bytes, decoded one line at a time by the caller: a bad byte spoils only its own line.
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        yield from f


def iter_json_lines(path: str) -> Iterator[Line]:
    """One `Line(line number, parsed JSON value, None)` per non-blank line of a .jsonl[.gz] file,
    or `Line(k, None, reason)` for a line that is not UTF-8 or not JSON (the next lines are still
    read); a truncated .gz ends the file with one such row. No schema check (`iter_records`
    adds it; retrogen has its own)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    name = os.path.basename(path)
    k = 0
    it = _json_rows(path)
    while True:
        try:
            raw = next(it)
        except StopIteration:
            return
        except (EOFError, OSError, zlib.error) as e:
            # A truncated or corrupt .gz cannot be read past this point: the rows read so far
            # still count, and the break itself is one invalid row, so the report adds up.
            yield Line(k + 1, None, f"{name} row {k + 1}: the compressed file is truncated or "
                                   f"corrupt here, so no further rows could be read ({e})")
            return
        k += 1
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield Line(k, None, f"{name} row {k}: line is not valid UTF-8 (byte "
                                f"0x{raw[e.start]:02x} at byte {e.start}: {e.reason})")
            continue
        if line.endswith("\n"):
            line = line[:-1]
        if not line.strip():  # blank lines are not rows; `row` stays the line number
            continue
        try:
            yield Line(k, json.loads(line), None)
        except json.JSONDecodeError as e:
            yield Line(k, None, f"{name} row {k}: line is not valid JSON ({e.msg} at column {e.colno})")


def expand_inputs(spec) -> list[str]:
    """The rollout files `spec` names: a file, a directory (its rollout files), a glob pattern,
    or several of these joined by commas; sorted within each part, parts in the order given."""
    files = []
    for part in (p.strip() for p in os.fspath(spec).split(",")):
        if not part:
            continue
        if any(ch in part for ch in "*?["):
            hits = sorted(glob.glob(part))
            if not hits:
                raise FileNotFoundError(f"{part}: no file matches this pattern")
        elif os.path.isdir(part):
            hits = sorted(os.path.join(part, n) for n in os.listdir(part)
                          if n.endswith(ROLLOUT_SUFFIXES))
            if not hits:
                raise FileNotFoundError(f"{part}: the directory holds no .jsonl, .jsonl.gz or "
                                        f".parquet rollout files")
        elif os.path.exists(part):
            hits = [part]
        else:
            raise FileNotFoundError(f"{part}: no such rollout file")
        files.extend(hits)
    if not files:
        raise FileNotFoundError("no rollout file given (the input is empty)")
    return files


