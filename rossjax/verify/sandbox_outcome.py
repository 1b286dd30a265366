"""What a sandbox run came to, on the host side (sandbox.py starts the run): `RunResult`, the
reading of the program's stdout and stderr and the bootstrap's status and report pipes under the
wall-time deadline and the output cap (`_collect`), the kill of the process group, and `_judge`,
which turns the exit statuses, the audit hook's refusal lines and the checker's final report into
one `reason`. A checked run passes only on the checker's own `done` (sandbox.py's module doc says
why a program cannot forge it).
"""

from __future__ import annotations

import math
import os
import selectors
import signal
import subprocess
import time
from typing import NamedTuple

_MARK = "\x1b[sandbox]\x1b "  # prefix of the audit hook's refusal lines on stderr
_REFUSED = 113  # exit status of a process the audit hook ended (sandbox_hook.REFUSED)
_SETUP_FAILED = 114  # a child could not build its walls (sandbox_boot.SETUP_FAILED)


class RunResult(NamedTuple):
    ok: bool
    stdout: str
    stderr: str
    reason: str | None  # "<code>: <detail>", None when ok
    returncode: int | None = None  # the program process's exit status (-N: killed by signal N)
    wall_s: float = 0.0
    isolation: str = ""  # active layers, e.g. "netns,pidns,ipcns,mountns,rootfs,...,audit"


def _status_of(got) -> dict:
    status = {}
    for line in got["status"].decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        status[key] = value
    return status


def _collect(proc, deadline: float, cap: int, status_fd: int, report_fd: int):
    """Read stdout, stderr and the status and report pipes until EOF, the deadline or `cap`
    bytes of output; returns ({name: bytes}, killed)."""
    sel = selectors.DefaultSelector()
    names = {proc.stdout.fileno(): "out", proc.stderr.fileno(): "err", status_fd: "status"}
    if report_fd >= 0:
        names[report_fd] = "report"
    bufs = {n: bytearray() for n in names.values()}
    for fd in names:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    killed, total, exited_at = None, 0, None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                killed = "timeout"
                break
            if proc.poll() is not None:
                # Without a pid namespace, grandchildren may hold the pipes open: stop soon.
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
                name = names[key.fd]
                if name in ("out", "err"):
                    total += len(chunk)
                    if total > cap:
                        killed = "output_limit"
                        break
                elif len(bufs[name]) + len(chunk) > cap:  # only trusted code writes these
                    killed = "output_limit"
                    break
                bufs[name] += chunk
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
    return {n: bytes(b) for n, b in bufs.items()}, killed


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exit_reason(rc, last, wall, timeout_s, lim, cpu=None) -> str | None:
    """Why a process with exit status `rc` (and `last` its last stderr line, `cpu` the CPU
    seconds it used) failed."""
    if rc is None:
        return None
    if rc < 0:
        sig = -rc
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        cpu_s = lim.cpu_s or math.ceil(timeout_s)
        # SIGXCPU is the soft CPU limit; SIGKILL is the hard one (cpu_s + 1) only when the CPU
        # time says so: any other SIGKILL (the OOM killer, the program's own) is a kill
        if sig == signal.SIGXCPU or sig == signal.SIGKILL and cpu is not None and cpu >= cpu_s:
            return f"cpu_limit: killed by {name} after the {cpu_s} s CPU limit"
        if sig == signal.SIGXFSZ:
            return f"file_size_limit: a file grew past {lim.file_mb} MB"
        return f"signal: killed by {name}"
    if rc != 0:
        if last.startswith("MemoryError"):
            return f"memory_limit: MemoryError under the {lim.memory_mb} MB address-space limit"
        if "[Errno 27]" in last:  # EFBIG: Python ignores SIGXFSZ, so RLIMIT_FSIZE shows up here
            return f"file_size_limit: a file grew past {lim.file_mb} MB"
        if "[Errno 28]" in last:  # ENOSPC on the size-capped scratch tmpfs
            return f"disk_limit: the run's files outgrew {lim.disk_mb} MB or {lim.files} files"
        return f"exit_code: {rc}; {last[:300]}"
    return None


def _exit_of(value: str):
    """A status line's 'EXIT CPU_S' as (int exit status or None, float CPU seconds or None)."""
    parts = value.split()
    rc = int(parts[0]) if parts and parts[0].lstrip("-").isdigit() else None
    try:
        return rc, float(parts[1]) if len(parts) > 1 else None
    except ValueError:
        return rc, None


def _judge(got, status, killed, wall, timeout_s, lim, checked) -> RunResult:
    stdout = got["out"].decode("utf-8", "replace")
    lines, refusals = [], []
    for line in got["err"].decode("utf-8", "replace").split("\n"):
        if line.startswith(_MARK):
            refusals.append(line[len(_MARK):])
        else:
            lines.append(line)
    stderr = "\n".join(lines)
    last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
    layers = status.get("layers")
    prog, prog_cpu = _exit_of(status.get("program", ""))
    chk, chk_cpu = _exit_of(status.get("checker", ""))
    reports = got.get("report", b"").decode("utf-8", "replace").splitlines()
    final = reports[-1] if reports else ""
    if killed == "output_limit":
        reason = f"output_limit: more than {lim.output_bytes} bytes of output"
    elif killed == "timeout":
        reason = f"timeout: still running after {timeout_s:g} s wall time"
    elif layers is None:
        reason = f"sandbox_error: the sandbox did not start ({last or 'no status'})"
    elif _SETUP_FAILED in (prog, chk):
        reason = f"sandbox_error: the sandbox's walls could not be built ({last})"
    elif _REFUSED in (prog, chk):
        # The hook's own line, when the program left stderr open; the last one, as the hook
        # ends the process right after writing it.
        reason = "sandbox_violation: " + (refusals[-1] if refusals else
                                          "a refused operation (its message was hidden: the "
                                          "program closed or redirected stderr)")
    elif not checked:
        if prog is None:
            reason = "sandbox_error: the sandbox ended without the program's exit status"
        else:
            reason = _exit_reason(prog, last, wall, timeout_s, lim, prog_cpu)
    elif final == "done":
        reason = None
    elif final.startswith("error "):
        reason = "checker_error: " + final[len("error "):]
    else:
        why = final[len("fail "):] if final.startswith("fail ") else "the checker did not finish"
        if "the program exited" in why and prog not in (None, 0):
            why = _exit_reason(prog, last, wall, timeout_s, lim, prog_cpu) or why
        elif chk not in (None, 0):
            why += f" (checker {_exit_reason(chk, last, wall, timeout_s, lim, chk_cpu)})"
        reason = why if why.split(":")[0] in _CODES else f"check_failed: {why}"
    rc = prog
    return RunResult(reason is None, stdout, stderr, reason, rc, wall, layers or "")


_CODES = ("cpu_limit", "file_size_limit", "memory_limit", "disk_limit", "signal", "exit_code")
