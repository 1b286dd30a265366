"""One run per workdir: `rossjax train`, `grpo` and `extract` hold an exclusive lock on
`DIR/run.lock` while they run, so a second run on the same folder is refused instead of writing
the same steps (or activation rows) as the first.

The lock is `flock` on the file, and the file's body (JSON: host, pid, start time, command) says
who holds it. The kernel drops a flock when its holder dies, however it dies, so on one host a
lock is never stale: a body left by a killed run is taken over, with a note naming the dead run.
On a network file system flock reaches other hosts where the file system supports it (NFSv4,
Lustre with `flock`); the note says when the previous holder was on another host. A `gs://`
workdir has no file locks: it is not locked, and `acquire` says so once.

No link is followed (issue 36): the lock file is opened with O_NOFOLLOW and must be a regular
file, so a planted `run.lock -> somefile` is refused in one sentence instead of overwriting and
truncating the file it points to. `open_nofollow`, `read_nofollow` and `write_atomic` give the
same rule to the records and manifests other modules keep (resume.json, report.json, ...).

CPU-only (no jax): the device half and the CPU half may both lock a folder.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import stat
import sys

from rossjax.errors import InputError

LOCK_NAME = "run.lock"


class LockHeld(InputError):
    """Another live process holds the folder's lock (one sentence naming its host and pid)."""


class LinkRefused(InputError):
    """A lock, record or manifest path is a symbolic link or not a regular file."""


def open_nofollow(path: str, flags: int, mode: int = 0o644, *, what: str) -> int:
    """os.open of a regular file that is not a symbolic link (the last component; the folders
    above may be links, as a workdir often is). LinkRefused (one sentence) otherwise."""
    try:  # O_NONBLOCK: a planted FIFO must not block the open; it is refused just below
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        try:
            to = f" (to {os.readlink(path)})"
        except OSError:
            to = ""
        raise LinkRefused(f"{path} is a symbolic link{to}; rossjax never follows a link for "
                          f"{what}, since it would write the file the link points to; remove the "
                          f"link.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LinkRefused(f"{path} is not a regular file; rossjax keeps {what} there; remove it.")
    os.set_blocking(fd, True)
    return fd


def refuse_link(path: str, what: str) -> None:
    """LinkRefused when `path` is a symbolic link (a folder rossjax clears or writes into)."""
    if os.path.islink(path):
        raise LinkRefused(f"{path} is a symbolic link (to {os.readlink(path)}); rossjax never "
                          f"follows a link for {what}; remove the link.")


def read_nofollow(path: str, *, what: str) -> bytes:
    """The bytes of `path`, refusing a symbolic link (open_nofollow)."""
    with os.fdopen(open_nofollow(path, os.O_RDONLY, what=what), "rb") as f:
        return f.read()


def write_atomic(path: str, data: bytes, *, what: str) -> None:
    """Write `path` as PATH.tmp, then rename it over PATH: a link at PATH.tmp is removed, never
    followed (O_EXCL), and the rename replaces a link at PATH itself, never its target."""
    tmp = path + ".tmp"
    try:
        os.unlink(tmp)  # a stale temporary file, or a planted link (unlink never follows)
    except FileNotFoundError:
        pass
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, what=what)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class RunLock:
    """An exclusive flock on DIR/run.lock; `release()` (or process death) frees it."""

    def __init__(self, directory: str, fd: int, body: dict):
        self.directory, self.fd, self.body = directory, fd, body

    @property
    def path(self) -> str:
        return os.path.join(self.directory, LOCK_NAME)

    def release(self):
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)  # an empty body: released cleanly, nothing to take over
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False


def _describe(body: dict) -> str:
    cmd = body.get("command") or "a run"
    return (f"`{cmd}` (host {body.get('host', '?')}, pid {body.get('pid', '?')}, started "
            f"{body.get('started', '?')})")


def _read_body(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:  # a body cut short by a crash mid-write: still a previous holder
        return {"command": "an unknown run (its lock file is unreadable)"}
    return body if isinstance(body, dict) else {}


def acquire(directory: str, command: str, *, log=None) -> RunLock | None:
    """Lock `directory` (created if missing) for this process, or raise LockHeld naming the
    holder. A lock left by a dead run is taken over with a note on `log` (stderr). Returns None
    for a remote (`scheme://`) folder, which cannot be locked."""
    log = log or sys.stderr
    if "://" in os.fspath(directory):
        print(f"{command}: note: {directory} is not on a local or network file system, so it is "
              f"not locked against a second run; give each run its own folder.", file=log)
        return None
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_NAME)
    fd = open_nofollow(path, os.O_RDWR | os.O_CREAT, 0o644, what="a run lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_body(fd)
            raise LockHeld(f"{directory} is in use by {_describe(holder)}; wait for it to end, "
                           f"stop it, or give another folder ({path}).") from None
        old = _read_body(fd)
        body = {"host": socket.gethostname(), "pid": os.getpid(),
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "command": command, "argv": sys.argv[1:]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(body) + "\n").encode(), 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    if old:
        where = "" if old.get("host") == body["host"] else (
            "; it ran on another host: if it is still running there, this file system does not "
            "share locks between hosts and the two runs will mix")
        print(f"{command}: note: took over the lock of {directory} from {_describe(old)}, which "
              f"ended without releasing it (killed or crashed){where}.", file=log)
    return RunLock(directory, fd, body)


# The locks this process holds, by folder: a run that failed during its set-up is released by
# `release`, and a later run in this process on the same folder takes the lock over.
_HELD: dict[str, RunLock] = {}


def hold(directory: str, command: str, *, log=None) -> RunLock | None:
    """`acquire`, remembered for `release(directory)`; a folder this process already holds is
    released and locked again (a run that ended without releasing, in this process)."""
    key = os.path.realpath(directory) if "://" not in os.fspath(directory) else directory
    if key in _HELD:
        _HELD.pop(key).release()
    lock = acquire(directory, command, log=log)
    if lock is not None:
        _HELD[key] = lock
    return lock


def release(directory: str):
    """Release this process's lock on `directory` (no-op if it holds none)."""
    key = os.path.realpath(directory) if "://" not in os.fspath(directory) else directory
    lock = _HELD.pop(key, None)
    if lock is not None:
        lock.release()
