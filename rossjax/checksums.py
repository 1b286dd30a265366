"""sha256 manifests of a folder's files: written once the folder is complete, verified before
it is read, so a flipped bit or a truncated file on disk is one sentence naming the file
instead of NaN weights or wrong activations.

Used by orbax checkpoints (`train/checkpoint.py`: one manifest per step folder, written after
the save completes) and by activation stores (`probes/store.py`: the manifest's `files`).
Paths go through etils.epath, so a folder may be `gs://...`. Files are hashed on a few threads
(hashlib releases the GIL), so verification runs at about disk speed. A listed file that is a
symbolic link is refused (issue 36): a link makes the folder's bytes live elsewhere, where they
can change without the folder changing. CPU-only (no jax).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os

from etils import epath

from rossjax.errors import InputError

_BLOCK = 1 << 22


class ChecksumError(InputError):
    """A file is missing, has another size, or another sha256 than its manifest says."""


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with epath.Path(path).open("rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _files(root: epath.Path, exclude: tuple[str, ...]) -> list[str]:
    out = []
    for folder, _, names in root.walk():
        for name in names:
            rel = os.fspath((epath.Path(folder) / name).relative_to(root))
            if rel not in exclude:
                out.append(rel)
    return sorted(out)


def _hash_all(root: epath.Path, rels, threads: int) -> dict[str, list]:
    def one(rel):
        p = root / rel
        return rel, [_size(p), file_sha256(p)]

    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as ex:
        return dict(ex.map(one, rels))


def digest_folder(root, *, exclude: tuple[str, ...] = (), threads: int = 8) -> dict[str, list]:
    """{relative path: [size, sha256]} of every file under `root` but `exclude` (relative paths)."""
    root = epath.Path(root)
    return _hash_all(root, _files(root, exclude), threads)


def verify_folder(root, files: dict, *, what: str, threads: int = 8, extra_ok: bool = True):
    """Raise ChecksumError (one sentence) unless every file of `files` ({rel: [size, sha256]})
    is under `root` with that size and digest. `extra_ok`: files the manifest does not list are
    allowed (written later by something else); otherwise one is an error too."""
    root = epath.Path(root)
    for rel, (size, _) in sorted(files.items()):
        p = root / rel
        if "://" not in os.fspath(root) and os.path.islink(p):  # the folder's own file, or none
            raise ChecksumError(f"{what}: {p} is a symbolic link, not the file its checksum "
                                f"manifest lists; restore the file (rossjax never follows a link "
                                f"it did not write).")
        if not p.exists():
            raise ChecksumError(f"{what}: {p} is missing (listed in its checksum manifest).")
        got = _size(p)
        if got != int(size):
            raise ChecksumError(f"{what}: {p} has {got} bytes but its checksum manifest says "
                                f"{size}; the file is truncated or was replaced.")
    for rel, (size, sha) in sorted(_hash_all(root, list(files), threads).items()):
        if sha != files[rel][1]:
            raise ChecksumError(f"{what}: {root / rel} does not match its sha256 in the checksum "
                                f"manifest (the file changed on disk after it was written).")
    if not extra_ok:
        extra = sorted(set(_files(root, ())) - set(files))
        if extra:
            raise ChecksumError(f"{what}: {root / extra[0]} is not in the checksum manifest.")


def _size(p: epath.Path) -> int:
    return int(p.stat().length)
