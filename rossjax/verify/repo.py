"""A small repository as plain data: its regular files read into memory, copied to a scratch
directory, compared, and written as a unified diff.

Only regular files count. A symlink, fifo or device anywhere in a tree is refused with its path
(a link copied or read by the host would let a tree's author point the host at its own files;
a fifo would hang the copy); so is a tree over `max_bytes` or `max_files`, and a file that is
not UTF-8 text (a diff of it would not round-trip). Caches (`__pycache__`, `.pytest_cache`,
`*.pyc`) are not part of a tree.
"""

from __future__ import annotations

import difflib
import os
import shutil
import stat
import sys

from rossjax.errors import InputError

SKIP_DIRS = frozenset({"__pycache__", ".pytest_cache", ".git"})
MAX_BYTES, MAX_FILES = 16 << 20, 2000


class RepoError(InputError):
    """A tree that cannot be used as a repository (the message names the path)."""


def _entries(root: str, max_files: int):
    """(relative path, lstat) of every regular file below `root`, links never followed."""
    out = []
    def unreadable(e: OSError):
        raise RepoError(f"{root}: {os.path.relpath(e.filename, root)} cannot be listed "
                        f"({e.strerror})")

    for d, dirs, files in os.walk(root, onerror=unreadable, followlinks=False):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        for name in sorted(dirs + files):
            path = os.path.join(d, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                raise RepoError(f"{root}: {rel} is a symlink (only regular files are allowed)")
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise RepoError(f"{root}: {rel} is not a regular file")
            if name.endswith(".pyc"):
                continue
            out.append((rel, st))
            if len(out) > max_files:
                raise RepoError(f"{root}: more than {max_files} files")
    return out


def read_tree(root: str, *, max_bytes: int = MAX_BYTES, max_files: int = MAX_FILES
              ) -> dict[str, str]:
    """{relative path: text} of every regular file of `root` (see the module doc for refusals)."""
    if not os.path.isdir(root) or os.path.islink(root):
        raise RepoError(f"{root}: not a directory")
    files, total = {}, 0
    for rel, st in _entries(root, max_files):
        total += st.st_size
        if total > max_bytes:
            raise RepoError(f"{root}: the files are over {max_bytes} bytes in total")
        try:
            fd = os.open(os.path.join(root, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise RepoError(f"{root}: {rel} cannot be read ({e.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            raw = f.read(max_bytes + 1)
        try:
            files[rel] = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RepoError(f"{root}: {rel} is not UTF-8 text") from None
    return files


def copy_tree(src: str, dst: str, *, max_files: int = MAX_FILES) -> None:
    """Copy the regular files of `src` (modes kept) into a new directory `dst`."""
    entries = _entries(src, max_files)
    os.makedirs(dst)
    for rel, st in entries:
        target = os.path.join(dst, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(src, rel), target, follow_symlinks=False)
        os.chmod(target, stat.S_IMODE(st.st_mode) & 0o777)  # never a setuid/setgid bit


def write_tree(files: dict[str, str], dst: str) -> None:
    """Write {relative path: text} into a new directory `dst` (paths must stay inside it)."""
    os.makedirs(dst)
    for rel, text in files.items():
        norm = os.path.normpath(rel)
        if os.path.isabs(rel) or norm.startswith(".."):
            raise RepoError(f"path {rel!r} leaves the repository")
        target = os.path.join(dst, norm)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)


def unified_diff(before: dict[str, str], after: dict[str, str]) -> str:
    """A git-style unified diff (a/ b/ prefixes, /dev/null for added and deleted files), which
    `patch -p1` applies to `before`."""
    out = []
    for rel in sorted(set(before) | set(after)):
        a, b = before.get(rel), after.get(rel)
        if a == b:
            continue
        lines = difflib.unified_diff(
            (a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
            "/dev/null" if a is None else f"a/{rel}", "/dev/null" if b is None else f"b/{rel}")
        for line in lines:
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def changed(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """{path: "added" | "deleted" | "modified"} for every file that differs."""
    out = {}
    for rel in sorted(set(before) | set(after)):
        if rel not in before:
            out[rel] = "added"
        elif rel not in after:
            out[rel] = "deleted"
        elif before[rel] != after[rel]:
            out[rel] = "modified"
    return out


def default_read_roots() -> tuple[str, ...]:
    """What a command over a repository may read besides the interpreter and /usr/bin: the
    running venv (its site-packages hold pytest), when there is one."""
    same = os.path.realpath(sys.prefix) == os.path.realpath(sys.base_prefix)
    return () if same else (sys.prefix,)


def shell_env(read_roots=()) -> dict:
    """The environment of such a command: the venvs' bin first on PATH; no bytecode and no
    pytest cache written into the repository (they would show up as changes)."""
    bins = [os.path.join(r, "bin") for r in read_roots if os.path.isdir(os.path.join(r, "bin"))]
    return {"PATH": ":".join(bins + ["/usr/bin", "/bin"]), "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_ADDOPTS": "-p no:cacheprovider", "NO_COLOR": "1", "TERM": "dumb",
            "COLUMNS": "200"}
