"""Run untrusted, model-written Python in a separate, locked-down process.

`run(program, stdin, timeout_s)` -> RunResult(ok, stdout, stderr, reason); `run_tests(program,
tests, entry_point)` -> Verdict (HumanEval style: program, then tests, then `check(entry_point)`).

Each run is a fresh `python -I -S` child (stdlib only, ~15 ms to start) in a fresh temp dir.
The host enforces wall time and an output cap (it reads both pipes with a byte budget and kills
the process group — and every process of the sandbox uid — when either runs out). The child's
bootstrap (sandbox_boot.py) adds, before running the program: a new network namespace, a private
mount namespace with /tmp, /var/tmp, /dev/shm read-only except its own dir, a per-sandbox
unprivileged uid (so concurrent sandboxes cannot touch each other, and RLIMIT_NPROC — which Linux
does not enforce for root — counts only this sandbox), rlimits on CPU, address space, processes
and file size, and an audit hook that refuses sockets, process creation, signals, ctypes and file
access outside the temp dir and the stdlib. Namespaces and the uid need root (or user
namespaces); without them the rlimits and the audit hook still hold, and `RunResult.isolation`
says which layers were active. This is defence in depth for verifier workloads, not a jail for
adversaries with kernel exploits.
"""

from __future__ import annotations

import fcntl
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

from rossjax.errors import InputError
from rossjax.verify.verdict import Verdict

_MARK = "\x1b[sandbox]\x1b "  # prefix of the bootstrap's own lines on stderr
_UID_BASE, _UID_SLOTS = 2_100_000_000, 4096  # throw-away uids, far from real accounts
_KILL = shutil.which("kill", path="/bin:/usr/bin") or "/bin/kill"
_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_boot.py")


class RunResult(NamedTuple):
    ok: bool
    stdout: str
    stderr: str
    reason: str | None  # "<code>: <detail>", None when ok
    returncode: int | None = None
    wall_s: float = 0.0
    isolation: str = ""  # layers that were active, e.g. "netns,mountns,uid,rlimits,audit"


@dataclass(frozen=True)
class Limits:
    cpu_s: int | None = None  # default: ceil(timeout_s)
    memory_mb: int = 1024  # RLIMIT_AS
    procs: int = 16  # RLIMIT_NPROC for the sandbox uid (threads count too)
    file_mb: int = 16  # RLIMIT_FSIZE
    output_bytes: int = 4 << 20  # stdout + stderr
    allow_fork: bool = False  # the audit hook refuses os.fork unless set (needs the uid layer)
    audit: bool = True  # False only to test the other layers on their own


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
        self.stage = os.path.join(self.base, "stage")  # mount point used inside child namespaces
        os.makedirs(self.stage, mode=0o755, exist_ok=True)
        self.locks = os.path.join(self.base, "locks")
        os.makedirs(self.locks, mode=0o700, exist_ok=True)
        self.prefix = os.path.realpath(sys.base_prefix)
        self.hidden = _first_hidden_ancestor(self.prefix) if self.root else None
        self.read_roots = sorted({self.prefix, os.path.realpath(sys.base_exec_prefix),
                                  "/usr/share/zoneinfo"})
        with open(_BOOT, encoding="utf-8") as f:
            self.boot = f.read()
        self.free: list[int] = []
        self.held: dict[int, int] = {}
        self.next_slot = (os.getpid() * 7919) % _UID_SLOTS

    def acquire_uid(self) -> int | None:
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
        uid = _UID_BASE + slot
        if not _kill_uid(uid):  # a previous holder that died may have left processes behind
            return self.acquire_uid()  # keep the slot locked (quarantined) and take another
        return uid

    def release_uid(self, uid: int | None):
        if uid is not None and _kill_uid(uid):
            with self.lock:
                self.free.append(uid)
        # else: processes of this uid outlived SIGKILL; the slot stays held, never reused.


def _first_hidden_ancestor(path: str) -> str | None:
    """The first directory on `path` that others cannot enter (e.g. /root), or None."""
    cur = "/"
    for part in path.strip("/").split("/"):
        cur = os.path.join(cur, part)
        if not os.stat(cur).st_mode & stat.S_IXOTH:
            return cur
    return None


_host: _Host | None = None
_host_lock = threading.Lock()


def _get_host() -> _Host:
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


def run(program: str, stdin: str = "", timeout_s: float = 10.0, *,
        limits: Limits | None = None) -> RunResult:
    """Run `program` (Python source) with `stdin`; ok iff it exits 0 within every limit without
    a refused operation."""
    lim = limits or Limits()
    host = _get_host()
    uid = host.acquire_uid()
    tmp = tempfile.mkdtemp(prefix="run-", dir=host.base)
    t0 = time.monotonic()
    try:
        with open(os.path.join(tmp, "main.py"), "w", encoding="utf-8") as f:
            f.write(program)
        with open(os.path.join(tmp, "stdin.txt"), "w", encoding="utf-8") as f:
            f.write(stdin)
        if uid is not None:
            for p in (tmp, os.path.join(tmp, "main.py"), os.path.join(tmp, "stdin.txt")):
                os.chown(p, uid, uid)
        os.chmod(tmp, 0o700)
        params = {
            "tmp": tmp, "mark": _MARK, "isolate": True, "uid": uid, "hidden": host.hidden,
            "prefix": host.prefix, "stage": host.stage, "read_roots": host.read_roots,
            "allow_fork": lim.allow_fork, "audit": lim.audit,
            "limits": {"cpu_s": int(lim.cpu_s or math.ceil(timeout_s)),
                       "memory_bytes": lim.memory_mb << 20, "file_bytes": lim.file_mb << 20,
                       "procs": lim.procs},
        }
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": tmp,
               "TMPDIR": tmp}
        with open(os.path.join(tmp, "stdin.txt"), "rb") as stdin_f:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", host.boot, repr(params)],
                stdin=stdin_f, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp, env=env,
                start_new_session=True, close_fds=True)
        out, err, killed = _collect(proc, t0 + timeout_s, lim.output_bytes)
        wall = time.monotonic() - t0
    finally:
        if "proc" in locals():
            _kill_group(proc)
        host.release_uid(uid)
        shutil.rmtree(tmp, ignore_errors=True)
    return _judge(proc.returncode, out, err, killed, wall, timeout_s, lim)


def _collect(proc, deadline: float, cap: int):
    """Read stdout/stderr until EOF, the deadline or `cap` bytes; returns (out, err, killed)."""
    sel = selectors.DefaultSelector()
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    for f in (proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
        sel.register(f.fileno(), selectors.EVENT_READ)
    killed, total, exited_at = None, 0, None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                killed = "timeout"
                break
            if proc.poll() is not None:
                # Grandchildren may hold the pipes open after the program exited: stop soon.
                exited_at = exited_at or now
                if now - exited_at > 0.2:
                    break
            for key, _ in sel.select(timeout=min(0.05, deadline - now)):
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                total += len(chunk)
                if total > cap:
                    killed = "output_limit"
                    break
                bufs[key.fd] += chunk
            if killed:
                break
    finally:
        sel.close()
        if killed:
            _kill_group(proc)
        proc.stdout.close()
        proc.stderr.close()
        try:
            proc.wait(timeout=max(0.5, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed = killed or "timeout"
            _kill_group(proc)
            proc.wait()
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), killed


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _judge(rc, out: bytes, err: bytes, killed, wall, timeout_s, lim) -> RunResult:
    stdout = out.decode("utf-8", "replace")
    lines, refusals, layers = [], [], ""
    for line in err.decode("utf-8", "replace").split("\n"):
        if line.startswith(_MARK):
            body = line[len(_MARK):]
            if body.startswith("layers "):
                layers = body[len("layers "):]
            else:
                refusals.append(body)
        else:
            lines.append(line)
    stderr = "\n".join(lines)
    last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
    if killed == "output_limit":
        reason = f"output_limit: more than {lim.output_bytes} bytes of output"
    elif killed == "timeout":
        reason = f"timeout: still running after {timeout_s:g} s wall time"
    elif refusals:
        reason = f"sandbox_violation: {refusals[0]}"
    elif not layers:
        reason = f"sandbox_error: the sandbox did not start ({last or f'exit {rc}'})"
    elif rc is not None and rc < 0:
        sig = -rc
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig in (signal.SIGXCPU, signal.SIGKILL) and wall < timeout_s:
            reason = f"cpu_limit: killed by {name} after the {lim.cpu_s or math.ceil(timeout_s)} s CPU limit"
        elif sig == signal.SIGXFSZ:
            reason = f"file_size_limit: a file grew past {lim.file_mb} MB"
        else:
            reason = f"signal: killed by {name}"
    elif rc != 0:
        if last.startswith("MemoryError"):
            reason = f"memory_limit: MemoryError under the {lim.memory_mb} MB address-space limit"
        elif "[Errno 27]" in last:  # EFBIG: Python ignores SIGXFSZ, so RLIMIT_FSIZE shows up here
            reason = f"file_size_limit: a file grew past {lim.file_mb} MB"
        else:
            reason = f"exit_code: {rc}; {last[:300]}"
    else:
        reason = None
    return RunResult(reason is None, stdout, stderr, reason, rc, wall, layers)


def run_tests(program: str, tests: str, entry_point: str, timeout_s: float = 10.0, *,
              limits: Limits | None = None) -> Verdict:
    """HumanEval style: `program`, then `tests` (which define `check`), then check(entry_point)."""
    if not entry_point.isidentifier():
        raise InputError(f"entry_point {entry_point!r} is not a Python identifier")
    source = f"{program}\n\n{tests}\n\ncheck({entry_point})\n"
    res = run(source, timeout_s=timeout_s, limits=limits)
    if res.ok:
        return Verdict(True, f"check({entry_point}) passed in {res.wall_s:.2f} s")
    if res.reason.startswith("sandbox_error"):
        return Verdict(None, res.reason)
    return Verdict(False, res.reason)
