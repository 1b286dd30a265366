"""Files for the Beam runs (curate/select with --config.runner=beam): input listing, reading one
rollout file on a worker, and the ordered, retry-safe writes of shards and row lists.

Every path goes through Beam's FileSystems, so gs:// (with apache-beam[gcp]) works like a local
path. A file is always written whole under its final, deterministic name (a local temp file,
then a rename or a copy), so a retried bundle overwrites its own output and never duplicates it.
Imports apache_beam lazily: this module is only used with the beam extra installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid

# Rows per block: the unit of ordering. Kept examples, list lines and fingerprints are grouped by
# row // BLOCK and sorted inside a group, so the outputs come out in input order.
BLOCK = 4096


def is_remote(path: str) -> bool:
    return "://" in path


def join(base: str, name: str) -> str:
    if is_remote(base):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.join(base, name)
    return os.path.join(base, name)


def input_files(spec: str) -> list[str]:
    """The rollout files `spec` names, in the order the local run reads them: local parts go
    through schema.expand_inputs; a remote part (gs://...) is a file, a glob, or a directory
    ending in "/" (its rollout files), matched through Beam's FileSystems and sorted."""
    from rossjax.curate.schema import ROLLOUT_SUFFIXES, expand_inputs

    files = []
    for part in (p.strip() for p in str(spec).split(",")):
        if not part:
            continue
        if not is_remote(part):
            files.extend(expand_inputs(part))
            continue
        from apache_beam.io.filesystems import FileSystems

        pattern = part + "*" if part.endswith("/") else part
        hits = sorted(m.path for r in FileSystems.match([pattern]) for m in r.metadata_list)
        if part.endswith("/"):
            hits = [h for h in hits if h.endswith(ROLLOUT_SUFFIXES)]
        if not hits:
            raise FileNotFoundError(f"{part}: no rollout file matches this path")
        files.extend(hits)
    if not files:
        raise FileNotFoundError("no rollout file given (the input is empty)")
    return files


@contextlib.contextmanager
def local_copy(path: str):
    """A local path with the same file name: `path` itself, or a temp copy of a remote file
    (so the schema reader, its .gz/.parquet handling and its reasons are exactly the local ones)."""
    if not is_remote(path):
        yield path
        return
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    tmp = tempfile.mkdtemp(prefix="rossjax-beam-")
    local = os.path.join(tmp, path.rstrip("/").rsplit("/", 1)[-1])
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as src, \
                open(local, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        yield local
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def local_temp(dest: str) -> str:
    """A fresh local path to build `dest` in: beside it when local (the rename is atomic)."""
    if is_remote(dest):
        fd, tmp = tempfile.mkstemp(prefix="rossjax-beam-")
        os.close(fd)
        return tmp
    return f"{dest}.tmp-{uuid.uuid4().hex[:8]}"


def publish(tmp: str, dest: str) -> None:
    """Move the finished local file `tmp` to `dest` (replacing any earlier attempt's file)."""
    if not is_remote(dest):
        os.replace(tmp, dest)
        return
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    try:
        with open(tmp, "rb") as src, FileSystems.create(
                dest, compression_type=CompressionTypes.UNCOMPRESSED) as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
    finally:
        os.remove(tmp)


def write_bytes(dest: str, data: bytes) -> None:
    tmp = local_temp(dest)
    with open(tmp, "wb") as f:
        f.write(data)
    publish(tmp, dest)


def read_bytes(path: str) -> bytes:
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def makedirs(path: str) -> None:
    if is_remote(path):
        return  # object stores have no directories
    os.makedirs(path, exist_ok=True)


def clear_dir(path: str) -> None:
    """Make `path` an empty directory (on an object store: delete every object under it)."""
    if is_remote(path):
        delete(matching(join(path, "**")))
        return
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)


def publish_dir(stage: str, out_dir: str) -> None:
    """Move a complete run's files from `stage` into `out_dir` as pipeline.publish does (the old
    outputs go first, report.json comes last); a crashed attempt's temp files and folders stay
    behind and are deleted with `stage`."""
    from rossjax.curate.compiled import SHARD_GLOB
    from rossjax.curate.ledger import OUTPUT_NAMES as OUTPUTS, publish

    if not is_remote(stage):
        for n in os.listdir(stage):
            p = os.path.join(stage, n)
            if os.path.isdir(p):
                shutil.rmtree(p)
            elif ".tmp-" in n:
                os.remove(p)
        publish(stage, out_dir)
        return
    from apache_beam.io.filesystems import FileSystems

    delete([join(out_dir, "report.json")])
    delete(matching(join(out_dir, SHARD_GLOB)) + [join(out_dir, n) for n in OUTPUTS])
    names = sorted((m.rsplit("/", 1)[-1] for m in matching(join(stage, "*"))),
                   key=lambda n: n == "report.json")
    for n in names:  # one at a time: report.json strictly after the rest
        FileSystems.rename([join(stage, n)], [join(out_dir, n)])
    delete(matching(join(stage, "**")))


def delete(paths: list[str]) -> None:
    from apache_beam.io.filesystems import FileSystems

    paths = [p for p in paths if FileSystems.exists(p)]
    if paths:
        FileSystems.delete(paths)


def matching(pattern: str) -> list[str]:
    from apache_beam.io.filesystems import FileSystems

    return sorted(m.path for r in FileSystems.match([pattern]) for m in r.metadata_list)


def concat(parts: list[str], dest: str) -> None:
    """Write the text files `parts`, in order, as one file `dest` (streamed; then delete them)."""
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    tmp = local_temp(dest)
    with open(tmp, "wb") as out:
        for p in parts:
            with FileSystems.open(p, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                shutil.copyfileobj(f, out, 1 << 22)
    publish(tmp, dest)
    delete(parts)
