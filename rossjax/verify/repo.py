"""A small repository as plain data: its regular files read into memory, copied to a scratch
directory, compared, and written as a unified diff.

Only regular files count. A symlink, fifo or device anywhere in a tree is refused with its path
(a link copied or read by the host would let a tree's author point the host at its own files;
a fifo would hang the copy); so is a tree over `max_bytes` or `max_files`, and a file that is
not UTF-8 text (a diff of it would not round-trip). Caches (`__pycache__`, `.pytest_cache`,
`*.pyc`) are not part of a tree.
"""

from __future__ import annotations

import atexit
import difflib
import os
import shutil
import stat
import sys
import tempfile
import threading
import warnings

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
    """A git-style unified diff (a `diff --git` line per file, a/ b/ prefixes, /dev/null and a
    file mode for added and deleted files), which `git apply --recount -p1` (verify/swe.py) and
    `patch -p1` apply to `before`. The per-file header is what lets --recount, which ignores the
    @@ counts, tell the next file's `--- a/...` from a removed line."""
    out = []
    for rel in sorted(set(before) | set(after)):
        a, b = before.get(rel), after.get(rel)
        if a == b:
            continue
        out.append(f"diff --git a/{rel} b/{rel}\n")
        if a is None or b is None:
            out.append(f"{'new' if a is None else 'deleted'} file mode 100644\n")
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
    """What a command over a repository may read besides the interpreter and /usr/bin: an
    episode runtime (`runtime_root`) holding only pytest and what it needs. Never the running
    venv: in a wheel install that holds rossjax itself and its data/swe clean sources, which an
    episode would copy over its bug (`cp .../data/swe/textkit/textkit/core.py ...`)."""
    return (runtime_root(),)


PYTEST_DISTS = ("pytest",)  # the runtime's distributions (with their requirements' closure)
_RT_LOCK = threading.Lock()
_RT: dict = {}  # "path", "pid", "sig" of this process's runtime


def runtime_root() -> str:
    """A minimal venv the host builds once per process in a fresh private folder outside /tmp
    (the root mode keeps /tmp the sandbox's own): `bin/python` (links to the base interpreter),
    `pyvenv.cfg`, `bin/pytest`, and copies of the files of pytest's distributions and their
    requirements, nothing else. It is read-only to every sandbox (a bind or Landlock read rule;
    no write rule), and the run_suite checker imports pytest from it, so every call checks
    that no file of it changed (inode, size, mtime, ctime: no unprivileged process can reset a
    ctime) and builds a fresh one if one did."""
    with _RT_LOCK:
        if _RT.get("pid") == os.getpid():
            if _signature(_RT["path"]) == _RT["sig"]:
                return _RT["path"]
            warnings.warn(f"rossjax: the episode runtime {_RT['path']} changed after it was "
                          "built; building a fresh one", RuntimeWarning, stacklevel=2)
        path = _build_runtime()
        _RT.update(path=path, pid=os.getpid(), sig=_signature(path))
        atexit.register(_remove_runtime, path, os.getpid())
        return path


def _remove_runtime(path: str, pid: int):
    if os.getpid() == pid:  # never a forked child's exit
        shutil.rmtree(path, ignore_errors=True)


def _signature(root: str) -> dict:
    out = {}
    for d, dirs, files in os.walk(root, followlinks=False):
        for name in [""] + dirs + files:
            p = os.path.join(d, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out[p] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode,
                      st.st_uid)
    return out


def _closure(names) -> list:
    """The installed distributions `names` and, recursively, the requirements they need here."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen, todo, out = set(), list(names), []
    while todo:
        key = todo.pop().lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(key)
        except metadata.PackageNotFoundError:
            continue  # an optional or platform-only requirement that is not installed
        out.append(dist)
        for r in dist.requires or ():
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return out


def _build_runtime() -> str:
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK | os.X_OK) else tempfile.gettempdir()
    root = tempfile.mkdtemp(prefix="rossjax-runtime-", dir=base)
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = os.path.join(root, "lib", ver, "site-packages")
    os.makedirs(site)
    os.makedirs(os.path.join(root, "bin"))
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    for name in ("python", "python3", ver):
        os.symlink(exe, os.path.join(root, "bin", name))
    with open(os.path.join(root, "pyvenv.cfg"), "w") as f:
        f.write(f"home = {os.path.dirname(exe)}\ninclude-system-site-packages = false\n"
                f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
    with open(os.path.join(root, "bin", "pytest"), "w") as f:
        f.write(f"#!{root}/bin/python\nimport sys\nfrom pytest import console_main\n"
                "sys.exit(console_main())\n")
    os.chmod(os.path.join(root, "bin", "pytest"), 0o755)
    for dist in _closure(PYTEST_DISTS):
        src = os.path.realpath(str(dist.locate_file("")))
        for rel in dist.files or ():
            path = os.path.realpath(os.path.join(src, str(rel)))
            if not path.startswith(src + os.sep) or not os.path.isfile(path):
                continue  # a console script in ../../bin, a file that is gone
            target = os.path.join(site, os.path.relpath(path, src))
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            shutil.copy2(path, target)  # keeps mtimes: the copied .pyc stay valid
            os.chmod(target, 0o644)
    for d, dirs, _ in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(d, name), 0o755)
    os.chmod(root, 0o755)
    return root


def package_exposed(roots) -> str | None:
    """The first of `roots` (folders a sandbox may read) holding this package, whose data/swe
    clean sources an episode would copy over its bug; None when none does."""
    pkg = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for r in roots:
        r = os.path.realpath(r)
        if pkg == r or pkg.startswith(r.rstrip(os.sep) + os.sep):
            return r
    return None


def shell_env(read_roots=()) -> dict:
    """The environment of such a command: the venvs' bin first on PATH; no bytecode and no
    pytest cache written into the repository (they would show up as changes)."""
    bins = [os.path.join(r, "bin") for r in read_roots if os.path.isdir(os.path.join(r, "bin"))]
    return {"PATH": ":".join(bins + ["/usr/bin", "/bin"]), "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_ADDOPTS": "-p no:cacheprovider", "NO_COLOR": "1", "TERM": "dumb",
            "COLUMNS": "200"}
