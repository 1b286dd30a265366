"""Reading rollout files: which files an input spec names, whether they can be read at all
(`check_readable`, before any output is touched), their JSON lines (decoded one line at a time,
so a bad byte spoils only its own line) and their Parquet rows. A break inside a file (a
truncated .gz, a corrupt Parquet page) keeps the rows before it and is one invalid row naming the
file; a row nested deeper than MAX_DEPTH is one invalid row. No schema check here
(schema.iter_records adds it; retrogen has its own)."""

from __future__ import annotations

import glob
import gzip
import json
import os
import stat
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


# Lists and objects a row may nest. Far above any rollout's (a tool call's arguments sit 7 deep),
# and far below Python's recursion limit, so no later step (validation, hashing, pickling to a
# worker) can hit it: a deeper row is one invalid row, never a RecursionError ending the run.
MAX_DEPTH = 128


def too_deep(obj) -> bool:
    """True when `obj` nests more than MAX_DEPTH lists and objects (iterative: any depth)."""
    stack = [(obj, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict):
            x = x.values()
        elif not isinstance(x, list):
            continue
        if d > MAX_DEPTH:
            return True
        stack.extend((v, d + 1) for v in x if isinstance(v, (dict, list)))
    return False


def _deep_reason(name: str, k: int) -> str:
    return (f"{name} row {k}: the row nests lists and objects more than {MAX_DEPTH} levels deep "
            f"(rollout rows nest a handful; deeper rows are refused)")


def _parquet_file(path: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not is_regular(path):
        raise SchemaError(f"{path}: a Parquet file must be a regular file (it is read from its "
                          f"footer back), not a pipe or device; copy it to a file first")
    try:  # page checksums, where the writer stored them, catch flipped bytes in a page
        return pq.ParquetFile(path, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as e:  # not Parquet at all: nothing can be read
        raise SchemaError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None


def parquet_rows(path: str) -> Iterator[Line]:
    """One `Line(row number, record, None)` per Parquet row, nulls dropped. A row group that
    breaks while being read (a corrupt page) keeps its rows before the break and the other row
    groups; each row it loses (the footer says how many) is `Line(k, None, reason)` naming the
    file, so the report still adds up to the file's rows."""
    import pyarrow as pa

    pf, name, k = _parquet_file(path), os.path.basename(path), 0
    for g in range(pf.num_row_groups):
        first, size = k, pf.metadata.row_group(g).num_rows
        try:
            for batch in pf.iter_batches(batch_size=1024, row_groups=[g]):
                for rec in batch.to_pylist():
                    k += 1
                    # Parquet has no "absent": drop nulls so optional fields read like JSON's
                    # missing keys.
                    yield Line(k, _drop_nulls(rec), None)
        except (pa.ArrowException, OSError) as e:
            why = (f": row group {g} (rows {first + 1}-{first + size}) is corrupt from row "
                   f"{k + 1} on, so its rows from there could not be read "
                   f"({str(e).splitlines()[0][:200]})")
            for r in range(k + 1, first + size + 1):
                yield Line(r, None, f"{name} row {r}{why}")
            k = first + size


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


def read_objects(path: str, *, id_field: str | None = "id") -> Iterator[tuple[int, dict]]:
    """(row number, object) for each line of a small .jsonl[.gz] input a command reads whole (a
    corpus, a label file, a task pool): strict, so the first bad line is an InputError naming the
    file and row; with `id_field`, every row needs a non-empty string id that no earlier row has."""
    seen = set()
    for k, obj, reason in iter_json_lines(path):
        if reason:
            raise InputError(f"{reason}.")
        if not isinstance(obj, dict):
            raise InputError(f"{path} row {k}: a JSON object is needed, got {type(obj).__name__}.")
        if id_field:
            rid = obj.get(id_field)
            if not isinstance(rid, str) or not rid:
                raise InputError(f"{path} row {k}: field '{id_field}' is missing or not a "
                                 f"non-empty string.")
            if rid in seen:
                raise InputError(f"{path} row {k}: field '{id_field}' {rid!r} repeats an earlier "
                                 f"row.")
            seen.add(rid)
        yield k, obj


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
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield Line(k, None, f"{name} row {k}: line is not valid JSON ({e.msg} at column {e.colno})")
            continue
        except RecursionError:
            yield Line(k, None, _deep_reason(name, k))
            continue
        # a line with few brackets cannot nest deeply: skip the walk (rows of token ids stay fast)
        if line.count("[") + line.count("{") > MAX_DEPTH and too_deep(obj):
            yield Line(k, None, _deep_reason(name, k))
            continue
        yield Line(k, obj, None)


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




def is_regular(path: str) -> bool:
    """True for a regular file (one that can be read twice); False for a pipe, a socket or a
    device, which can be read only once."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def check_readable(files: list[str]) -> None:
    """Every input can be opened and read (a Parquet file: its footer too), so a run stops in one
    sentence before it writes anything. A pipe or device is not opened here: opening and closing
    it would consume or end its stream; it is read once, by the run."""
    for path in files:
        if "://" in path:  # remote (Beam's FileSystems): checked where it is read
            continue
        try:
            st = os.stat(path)
        except OSError as e:
            raise InputError(f"{path}: the input cannot be read ({e.strerror})") from None
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{path}: the input is a directory inside a listed input, not a "
                             f"rollout file")
        if not stat.S_ISREG(st.st_mode):
            if path.endswith(".parquet"):
                _parquet_file(path)  # raises the sentence: Parquet needs a regular file
            if not os.access(path, os.R_OK):
                raise InputError(f"{path}: the input cannot be read (permission denied)")
            continue
        if not path.endswith(ROLLOUT_SUFFIXES):
            raise SchemaError(f"{path}: rollout files must be .jsonl, .jsonl.gz or .parquet")
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as e:
            raise InputError(f"{path}: the input cannot be read ({e.strerror})") from None
        if path.endswith(".parquet"):
            _parquet_file(path)
