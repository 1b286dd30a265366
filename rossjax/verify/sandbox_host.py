"""The host side's per-process state for sandbox.py: its base dir, the bootstrap compiled once,
which host dirs the sandbox may see, and the throw-away uids (two per run, program and checker)
held with flock so concurrent processes never share one.

Nothing a sandboxed process could have written is trusted: the bootstrap is compiled from the
installed package's source into a sealed memfd of this process (`sealed`: no process, this one
included, can change its bytes), never cached on disk where a run without kernel file walls
could overwrite it (issue 36: a poisoned `boot-*.pyc` passed every later run of the user).
"""

from __future__ import annotations

import fcntl
import marshal
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time

_UID_BASE, _UID_SLOTS = 2_100_000_000, 4096  # throw-away uids (two per slot), far from accounts
_KILL = shutil.which("kill", path="/bin:/usr/bin") or "/bin/kill"
_HERE = os.path.dirname(os.path.abspath(__file__))
# Texts run inside the sandbox before sandbox_boot.py, in this order (each defines names only).
BOOT_PARTS = ("sandbox_wire.py", "sandbox_harness.py", "sandbox_pytest.py", "sandbox_hook.py",
              "sandbox_kernel.py")


class _Host:
    """Per-process facts and resources: base dir, uid slots held with flock, the interpreter."""

    def __init__(self):
        self.lock = threading.Lock()
        self.root = os.geteuid() == 0
        self.base = os.path.join(tempfile.gettempdir(), f"rossjax-sandbox-{os.geteuid()}")
        os.makedirs(self.base, mode=0o711, exist_ok=True)
        st = os.lstat(self.base)
        if st.st_uid != os.geteuid() or not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"sandbox dir {self.base} is not a directory owned by this user")
        os.chmod(self.base, 0o711)
        self.stage = os.path.join(self.base, "stage")  # the new root's mount point (root mode)
        os.makedirs(self.stage, mode=0o755, exist_ok=True)
        self.locks = os.path.join(self.base, "locks")
        os.makedirs(self.locks, mode=0o700, exist_ok=True)
        prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
        zone = ["/usr/share/zoneinfo"] if os.path.isdir("/usr/share/zoneinfo") else []
        self.hook_reads = sorted(prefixes) + zone + sorted(  # sys.path may name the prefix
            {p for p in (sys.base_prefix, sys.base_exec_prefix) if p not in prefixes})
        # Shared libraries of the stdlib's extension modules (libssl, libz, libffi...).
        libs, self.links = set(), {}
        for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64"):
            if os.path.islink(d):
                self.links[d] = os.readlink(d)
            elif os.path.isdir(d):
                libs.add(d)
        self.ro_dirs = _outermost(prefixes | libs | set(zone))
        self.hidden = any(_hidden_ancestor(p) for p in prefixes)
        self.read_roots = sorted(self.ro_dirs)
        with open(os.path.join(_HERE, "sandbox_boot.py"), encoding="utf-8") as f:
            boot = f.read()
        parts = []
        for name in BOOT_PARTS:
            with open(os.path.join(_HERE, name), encoding="utf-8") as f:
                parts.append(f.read())
        code = marshal.dumps(compile("\n".join(parts + [boot]), "sandbox_boot", "exec"))
        self.boot_fd, self.boot_len = sealed(code), len(code)
        self.free: list[int] = []
        self.held: dict[int, int] = {}
        self.next_slot = (os.getpid() * 7919) % _UID_SLOTS

    def boot_argv(self) -> list[str]:
        """`python -c` that runs the compiled bootstrap from the sealed memfd (compiling its
        text would cost every start more than the interpreter's own startup) and closes it."""
        fd = self.boot_fd
        return ["-c", f"import marshal, posix\nc = marshal.loads(posix.pread({fd}, "
                      f"{self.boot_len}, 0))\nposix.close({fd})\ndel marshal, posix\nexec(c)\n"]

    def acquire_uid(self) -> int | None:
        """The program uid of a free slot (the checker's is the next one), or None (not root)."""
        if not self.root:
            return None
        with self.lock:
            if self.free:
                return self.free.pop()
            for _ in range(_UID_SLOTS):
                slot, self.next_slot = self.next_slot, (self.next_slot + 1) % _UID_SLOTS
                if slot in self.held:
                    continue
                fd = os.open(os.path.join(self.locks, str(slot)), os.O_CREAT | os.O_RDWR, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self.held[slot] = fd  # released by the kernel when this process dies
                break
            else:
                raise RuntimeError("no free sandbox uid slot")
        uid = _UID_BASE + 2 * slot
        if not (_kill_uid(uid) and _kill_uid(uid + 1)):  # a dead holder may have left processes
            return self.acquire_uid()  # keep the slot locked (quarantined) and take another
        return uid

    def release_uid(self, uid: int | None, pidns: bool):
        # With a pid namespace the kernel has killed every process of the run with its init.
        if uid is not None and (pidns or (_kill_uid(uid) and _kill_uid(uid + 1))):
            with self.lock:
                self.free.append(uid)
        # else: processes of this uid outlived SIGKILL; the slot stays held, never reused.


def sealed(data: bytes) -> int:
    """A memfd holding `data`, sealed against any write, growth or shrinking: what a sandbox
    reads from it is what the host wrote, whoever else holds the descriptor."""
    fd = os.memfd_create("rossjax-sandbox", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _hidden_ancestor(path: str) -> str | None:
    """The first directory on `path` that others cannot enter (e.g. /root), or None."""
    cur = "/"
    for part in path.strip("/").split("/"):
        cur = os.path.join(cur, part)
        if not os.stat(cur).st_mode & stat.S_IXOTH:
            return cur
    return None


def _outermost(paths) -> list[str]:
    """Paths not below another one of them (a bind of /usr/lib already holds /usr/lib/x)."""
    out = []
    for p in sorted(paths):
        if not any(p.startswith(q + "/") for q in out):
            out.append(p)
    return out


_host: _Host | None = None
_host_lock = threading.Lock()


def get_host() -> _Host:
    global _host
    with _host_lock:
        if _host is None or _host.pid != os.getpid():  # re-init after fork: flocks are per process
            _host = _Host()
            _host.pid = os.getpid()
        return _host


def _uid_pids(uid: int) -> list[int]:
    pids = []
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                if e.stat(follow_symlinks=False).st_uid == uid:
                    pids.append(int(e.name))
            except FileNotFoundError:
                pass
    return pids


def _kill_uid(uid: int, patience_s: float = 3.0) -> bool:
    """Kill every process of the sandbox uid (including ones that left the process group with
    setsid()) and wait until they are gone; False if some survive `patience_s`."""
    deadline = time.monotonic() + patience_s
    while _uid_pids(uid):
        if time.monotonic() > deadline:
            return False
        # `kill -9 -1` run *as* the sandbox uid can reach exactly that uid's processes.
        subprocess.run([_KILL, "-9", "-1"], user=uid, group=uid, extra_groups=[],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, close_fds=True, check=False)
        time.sleep(0.005)
    return True
