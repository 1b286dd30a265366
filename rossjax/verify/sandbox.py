"""Run untrusted, model-written Python in a separate process that the kernel confines.

`run(program, stdin, timeout_s)` -> RunResult (stdin/stdout style: the caller compares stdout;
an exit status of 0 alone proves nothing); `run_tests(program, tests, entry_point)` -> Verdict
(HumanEval style); `run_checked(program, checker, entry_point)` -> (RunResult, reports), the
general form both use: a trusted `checker` source runs against proxies of the program's
functions. Each run is a fresh `python -I -S` (stdlib only) started by the host, which enforces
wall time and an output cap and kills the process tree when either runs out. `run_shell(command,
workdir)` runs `bash -c command` instead, over a writable scratch copy of a repository (the
agents' `bash` environment, the SWE verifier's `patch`): kernel walls only, no audit hook.
`run_pytest(program, tests, modules)` runs trusted test files under pytest in the checker
against proxy modules of the program's package (the SWE suite; sandbox_pytest.py). This module
starts each run; sandbox_outcome.py reads its pipes and judges what it came to.

Verdicts a program cannot forge (checked runs). The bootstrap (sandbox_boot.py, trusted, before
any untrusted code) forks a *program* process, which runs the model's code and then serves calls
of its functions over pipes, and a *checker* process, which runs the trusted tests with
`candidate` a proxy. Every return value crosses as a plain value (sandbox_wire.py: exact builtin
types; the program's own classes and builtin subclasses are refused), rebuilt by the checker
from builtins, so an always-true `__eq__` never reaches a comparison. Only the checker holds the
report descriptor; it is a different uid (root) or another Landlock domain, and non-dumpable, so
the program can neither signal, ptrace nor open it through /proc. The host passes only when the
checker's final `done` arrives: `sys.exit(0)`, `os._exit(0)`, atexit hooks, a replaced
`sys.excepthook`, closed or redirected stdout/stderr and fake lines on any descriptor change
nothing, and a program that exits, hangs or is refused mid-call fails. The tests reach the
checker through a descriptor opened before the sandbox is built: the program cannot read them.

Confinement, by mode (`RunResult.isolation` names the active layers):
  - root: network, IPC, mount and pid namespaces; the sandbox sees a read-only tmpfs root with
    read-only binds of only the interpreter prefix, the shared-library dirs and zoneinfo, four
    device nodes, its own /proc (only its own processes exist) and a size-capped tmpfs /sandbox
    (the only writable place; `Limits.disk_mb` and `files` cap it in total), entered with
    pivot_root and the host tree detached; per-sandbox uids (program and checker each their own;
    RLIMIT_NPROC per sandbox). No host file is readable or writable and no host process is
    visible or signalable whatever paths or links a program uses.
  - Landlock (not root; kernel >= 5.13, ABI >= 6 for the scopes): reads only below the interpreter
    prefix, library dirs and zoneinfo, writes only below the scratch dir; no TCP (ABI >= 4);
    signals and abstract unix sockets scoped to the sandbox (ABI >= 6). Where unprivileged user
    namespaces work (also here): network, pid and IPC namespaces, their own /proc and a
    size-capped tmpfs scratch dir.
  - rlimits only (`Limits(landlock=False)`, or neither of the above; isolation "hook-only", and
    a warning): rlimits and the audit hook, plus the user namespaces if available; files are
    confined by the hook alone (it resolves links, dir_fd and descriptor paths like the kernel,
    but a racing thread can still swap a link between check and use). `Limits.require` (or
    $ROSSJAX_SANDBOX_REQUIRE) refuses such a run: SandboxUnavailable. A suite run (run_pytest)
    is refused here (sandbox_error) when the program has the host's own uid.
In every mode: the bootstrap, the program, its stdin and the checker's spec (a suite's test
files too) come from sealed memfds (sandbox_host.sealed), never from a file a run could
rewrite; the host reads status and report over socket pairs (a pipe can be opened again for
writing through /proc/PID/fd); seccomp also refuses ptrace, process_vm_*, the pidfd calls and
signals to any process but the program's own (sandbox_kernel._SECCOMP_ARCH); a seccomp filter refusing
socket(AF_UNIX) (Landlock up to ABI 7 and namespaces leave the host user's pathname unix
sockets reachable; socketpair still works), nested user namespaces (unshare, clone with
CLONE_NEWUSER; clone3 answers ENOSYS), mknod/mknodat and, unless `allow_fork`, every new
process (fork, vfork, clone without CLONE_THREAD: RLIMIT_NPROC could not, without a private
uid, as it counts the user's processes everywhere); a noexec scratch
dir where it is a tmpfs; rlimits on CPU, address space, file size and core dumps; an audit hook
as a second line (sockets, process creation, signals, ctypes, files outside the scratch dir
and the stdlib), whose refusal ends the process at once (it cannot be caught or hidden); every
process dies on
timeout and with the host (PR_SET_PDEATHSIG down the chain; as init of the pid namespace the
bootstrap's death kills every process of the sandbox). A row's timeout is capped by
`Limits.max_timeout_s`. This is defence in depth for verifier workloads, not a jail for
adversaries with kernel exploits.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

from rossjax.errors import InputError
from rossjax.verify.helper_names import parses, unbound
from rossjax.verify.sandbox_host import _outermost, get_host, sealed
from rossjax.verify.sandbox_outcome import (
    _MARK,
    RunResult,
    _collect,
    _judge,
    _kill_group,
    _status_of,
)
from rossjax.verify.sandbox_wire import wire_enc
from rossjax.verify.verdict import Verdict

_REPLY_CAP = 64 << 20  # bytes of one reply from the program to the checker


@dataclass(frozen=True)
class Limits:
    cpu_s: int | None = None  # default: ceil(timeout_s)
    memory_mb: int = 1024  # RLIMIT_AS
    procs: int = 16  # RLIMIT_NPROC for the sandbox uid (threads count too)
    file_mb: int = 16  # RLIMIT_FSIZE
    disk_mb: int = 64  # all files of one run together (tmpfs size, where there is one)
    files: int = 512  # files and dirs of one run (tmpfs inodes, else counted by the audit hook)
    output_bytes: int = 4 << 20  # stdout + stderr
    max_timeout_s: float = 60.0  # a longer timeout_s is refused (rows carry their own)
    allow_fork: bool = False  # seccomp and the hook refuse new processes unless set (uid layer)
    audit: bool = True  # False only to test the other layers on their own
    landlock: bool = True  # False forces Landlock off (the rlimits-only mode, for tests)
    namespaces: bool = True  # False: no namespaces either (tests of the other layers)
    # "landlock": refuse to run without a kernel file wall (Landlock, or the root mode's own
    # root); "namespaces": without pid/mount namespaces. Default: $ROSSJAX_SANDBOX_REQUIRE.
    require: str | None = field(
        default_factory=lambda: os.environ.get("ROSSJAX_SANDBOX_REQUIRE") or None)

    def __post_init__(self):
        if self.require not in (None, "landlock", "namespaces"):
            raise InputError(f"sandbox require {self.require!r} must be 'landlock', "
                             "'namespaces' or unset")


class SandboxUnavailable(InputError):
    """The machine cannot give the isolation `Limits.require` asks for (one sentence)."""


_warned = []


def _warn_hook_only(layers: str):
    """Once per process: a run whose files only the audit hook guards says so, loudly."""
    if "hook-only" in layers.split(",") and not _warned:
        _warned.append(1)
        msg = ("rossjax sandbox: no kernel file wall here (hook-only: neither Landlock nor "
               "namespaces with the root mode's own root): files are confined by the audit hook "
               "alone, which a Python-level bypass defeats; "
               "set ROSSJAX_SANDBOX_REQUIRE=landlock (or Limits(require=...)) to refuse such runs")
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        logging.getLogger("rossjax.sandbox").warning(msg)


def _check_timeout(timeout_s, lim: Limits) -> float:
    t = float(timeout_s)
    if not (t > 0 and math.isfinite(t)):
        raise InputError(f"sandbox timeout_s {timeout_s!r} must be a positive number of seconds")
    if t > lim.max_timeout_s:
        raise InputError(f"sandbox timeout_s {t:g} is over the cap of {lim.max_timeout_s:g} s "
                         "(Limits.max_timeout_s)")
    return t


def run(program: str, stdin: str = "", timeout_s: float = 10.0, *,
        limits: Limits | None = None) -> RunResult:
    """Run `program` (Python source) with `stdin`; ok iff it exits 0 within every limit without
    a refused operation. The caller judges stdout; ok alone proves nothing about correctness."""
    return _run(program, stdin, timeout_s, limits or Limits(), None, "", None)[0]


_ISOLATION: dict = {}


def isolation(limits: Limits | None = None) -> str:
    """The layers a run gets on this machine with `limits` (RunResult.isolation of one trivial
    run, cached per process): what a report records as the mode its verdicts came from."""
    lim = limits or Limits()
    key = repr(lim)
    if key not in _ISOLATION:
        _ISOLATION[key] = run("pass", limits=lim).isolation
    return _ISOLATION[key]


def run_checked(program: str, checker: str, entry_point: str, timeout_s: float = 10.0, *,
                limits: Limits | None = None, prefix: str | None = None
                ) -> tuple[RunResult, list[str]]:
    """Run `program`, then the trusted `checker` source in its own process with `entry_point`
    (alone: no other function of the program) bound to a proxy; `prefix` (trusted, e.g. the
    task's prompt) runs in the checker first, so the tests use its helpers. Returns the run and
    the texts the checker passed to `_rj_report`; ok iff the checker finished ("done")."""
    if not entry_point.isidentifier():
        raise InputError(f"entry_point {entry_point!r} is not a Python identifier")
    return _run(program, "", timeout_s, limits or Limits(), checker, entry_point, prefix)


def run_tests(program: str, tests: str, entry_point: str, timeout_s: float = 10.0, *,
              limits: Limits | None = None, prefix: str | None = None) -> Verdict:
    """HumanEval style: `program` defines `entry_point`; `tests` defines `check(candidate)`,
    called with the proxy in the checker process (see the module doc). Only the entry point is
    the program's: a helper the tests call (HumanEval's `encode_cyclic`, `poly`) comes from
    the tests or the trusted `prefix` (the task's prompt), and tests calling a name that
    neither defines make the task invalid (Verdict None, naming it), never judged by the
    program's own copy."""
    pre = None
    if prefix is not None:  # a signature with no body yet (a stub) is completed for the checker
        prefix = next((p for p in (prefix, prefix.rstrip() + "\n    pass\n")
                       if parses(p) is not None), prefix)
        pre = parses(prefix)
    tests_tree = parses(tests)  # tests that do not parse: the checker says so
    missing = [] if tests_tree is None else unbound(tests_tree, pre, entry_point)
    if missing:
        return Verdict(None, f"task_invalid: the tests call {', '.join(missing[:5])}, which "
                       "neither they nor the trusted prefix define (only the entry point comes "
                       "from the program)")
    res, _ = run_checked(program, f"{tests}\n\ncheck({entry_point})\n", entry_point, timeout_s,
                         limits=limits, prefix=prefix)
    if res.ok:
        return Verdict(True, f"check({entry_point}) passed in {res.wall_s:.2f} s")
    if res.reason.startswith(("sandbox_error", "checker_error")):
        return Verdict(None, res.reason)
    return Verdict(False, res.reason)


def run_shell(command: str, workdir: str, timeout_s: float = 10.0, *,
              limits: Limits | None = None, read_roots=(), env: dict | None = None,
              stdin: str = "") -> RunResult:
    """`bash -c command` in the sandbox with `workdir` (the caller's scratch copy of a
    repository, written in place: never pass an original) as its writable cwd: /repo as root
    (bound into the sandbox's own root), its own path under Landlock. Everything else is as for
    `run` plus /usr/bin and `read_roots` readable and executable (e.g. a venv with pytest); no
    audit hook (bash is not Python), so it refuses to start without the kernel's file walls
    (sandbox_error). ok iff exit 0; `returncode` is the shell's status. As root the tree is
    handed to the run's uid for the run and back to the host's after, links never followed."""
    workdir = os.path.realpath(workdir)
    if not os.path.isdir(workdir):
        raise InputError(f"run_shell workdir {workdir!r} is not a directory")
    extra = ["/usr/bin"] + [os.path.realpath(r) for r in read_roots]
    links = {"/bin": os.readlink("/bin")} if os.path.islink("/bin") else {}  # usr-merged
    extra += [] if links else ["/bin"]
    missing = [r for r in extra if not os.path.isdir(r)]
    if missing:
        raise InputError(f"run_shell read root {missing[0]!r} is not a directory")
    shell = {"repo": workdir, "extra": extra, "env": dict(env or {}), "links": links}
    return _run(command, stdin, timeout_s, limits or Limits(), None, "", None, shell)[0]


def run_pytest(program: str, tests: dict, modules, timeout_s: float = 30.0, *,
               limits: Limits | None = None, site=(), args=("-q",)) -> tuple[RunResult, list[str]]:
    """A suite run: `program` (Python source; it imports the package and defines
    `__rj_import__`, see sandbox_pytest.py) runs in the program process, and pytest, imported
    from the `site` dirs, runs the trusted `tests` ({relative path: text}: test files and
    pytest config; in the sealed spec, put by the checker where the program cannot reach them,
    sandbox_kernel._private_tests; refused with no kernel wall: sandbox_error) in the checker,
    where every module below the top-level names `modules` is a proxy of the program's. Returns
    the run and the checker's report lines (sandbox_pytest.py), ok iff pytest returned."""
    site = [os.path.realpath(d) for d in site]
    missing = [d for d in site if not os.path.isdir(d)]
    if missing:
        raise InputError(f"run_pytest site dir {missing[0]!r} is not a directory")
    spec = {"modules": sorted(modules), "site": site, "tests": _test_files(tests),
            "args": ["-p", "no:cacheprovider", "--capture=sys", "--color=no", *args]}
    suite = {"site": site, "spec": spec}
    return _run(program, "", timeout_s, limits or Limits(), "", "", None, suite=suite)


def _test_files(tests: dict) -> dict:
    """{normalized relative path: text} of a suite's trusted files (InputError for a path that
    leaves the test dir). They reach the sandbox in the sealed spec memfd, never as host files
    a program of this uid could read or rewrite (sandbox_kernel._put_tests places them)."""
    out = {}
    for rel, text in tests.items():
        norm = os.path.normpath(str(rel))
        if os.path.isabs(norm) or norm.split(os.sep)[0] in ("..", ".", ""):
            raise InputError(f"run_pytest test path {rel!r} leaves the test dir")
        out[norm] = str(text)
    return out


def _channel() -> tuple[int, int]:
    """(read fd, write fd) of a one-way channel from the bootstrap to the host: a unix stream
    socket pair, not a pipe, since a pipe can be opened again for writing through
    /proc/PID/fd/N by any process that may look at the host's descriptors (a run as root
    without namespaces wrote a final `done` into the host's report pipe that way); a
    socket there cannot be opened at all."""
    import socket

    r, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r.shutdown(socket.SHUT_WR)
    w.shutdown(socket.SHUT_RD)
    return r.detach(), w.detach()


def _own_tree(root: str, uid: int):
    """lchown every entry below `root` (links are changed, never followed)."""
    os.lchown(root, uid, uid)
    for d, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            os.lchown(os.path.join(d, name), uid, uid)


def _run(program, stdin, timeout_s, lim, checker, entry, prefix, shell=None, suite=None):
    timeout_s = _check_timeout(timeout_s, lim)
    host = get_host()
    uid = host.acquire_uid()
    tmp = tempfile.mkdtemp(prefix="run-", dir=host.base)
    t0 = time.monotonic()
    fds, proc, got = [], None, None
    ro_dirs, read_roots, links = host.ro_dirs, host.read_roots, host.links
    if shell:
        ro_dirs = read_roots = _outermost(set(host.ro_dirs) | set(shell["extra"]))
        links = {**links, **shell["links"]}
    try:
        work = os.path.join(tmp, "work")
        os.mkdir(work, 0o700)
        # The program, its stdin and the checker's spec reach the sandbox in sealed memfds,
        # never as files in the run's folder, which other runs of this uid could rewrite.
        fds.append(sealed(program.encode("utf-8", "surrogateescape")))
        program_fd = fds[-1]
        spec_fd = -1
        if checker is not None:
            fds.append(sealed(wire_enc(suite["spec"] if suite else (checker, prefix or ""))))
            spec_fd = fds[-1]
        fds.append(sealed(stdin.encode("utf-8", "surrogateescape")))
        stdin_fd = fds[-1]
        if suite:
            os.chmod(tmp, 0o711)  # the checker's uid reaches its test dir (modes keep the rest)
            os.mkdir(os.path.join(tmp, "checker"), 0o700)  # filled inside (_put_tests)
            ro_dirs = _outermost(set(ro_dirs) | set(suite["site"]))
        status_r, status_w = _channel()
        fds += [status_r, status_w]
        report_r, report_w = _channel() if checker is not None else (-1, -1)
        fds += [report_r, report_w] if checker is not None else []
        params = {
            "tmp": tmp, "work": work, "mark": _MARK, "uid": uid,
            "cuid": None if uid is None else uid + 1, "stage": host.stage,
            "ro_dirs": ro_dirs, "links": links, "read_roots": read_roots,
            "hook_reads": host.hook_reads, "allow_fork": lim.allow_fork, "audit": lim.audit,
            "landlock": lim.landlock, "namespaces": lim.namespaces, "host_pid": os.getpid(),
            "require": lim.require,
            "hidden": host.hidden,
            "status_fd": status_w, "report_fd": report_w, "checked": checker is not None,
            "program_fd": program_fd, "spec_fd": spec_fd,
            "entry": entry, "cap": _REPLY_CAP, "shell": bool(shell),
            "repo": shell and shell["repo"], "shell_env": None,
            "suite": suite and {"dir": os.path.join(tmp, "checker"),
                                "reads": suite["site"] + [os.path.join(tmp, "checker")]},
            "limits": {"cpu_s": int(lim.cpu_s or math.ceil(timeout_s)),
                       "memory_bytes": lim.memory_mb << 20, "file_bytes": lim.file_mb << 20,
                       "disk_bytes": lim.disk_mb << 20, "files": lim.files,
                       "procs": lim.procs},
        }
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "HOME": "/sandbox" if host.root else work,
               "TMPDIR": "/sandbox" if host.root else work}
        if shell:
            params["shell_env"] = {**env, "USER": "sandbox", **shell["env"]}
            if uid is not None:
                _own_tree(shell["repo"], uid)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", *host.boot_argv(), repr(params)],
            stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp, env=env,
            start_new_session=True, close_fds=True,
            pass_fds=[fd for fd in (status_w, report_w, program_fd, spec_fd, host.boot_fd)
                      if fd >= 0])
        for fd in (status_w, report_w, program_fd, spec_fd, stdin_fd):
            if fd >= 0:
                os.close(fd)
                fds.remove(fd)
        got, killed = _collect(proc, t0 + timeout_s, lim.output_bytes, status_r, report_r)
        wall = time.monotonic() - t0
    finally:
        if proc is not None:
            _kill_group(proc)
        for fd in fds:
            os.close(fd)
        status = _status_of(got) if got is not None else {}
        host.release_uid(uid, "pidns" in status.get("layers", ""))
        if shell and uid is not None:
            _own_tree(shell["repo"], os.geteuid())
        shutil.rmtree(tmp, ignore_errors=True)
    if "refused" in status:
        raise SandboxUnavailable(status["refused"][0].upper() + status["refused"][1:] + ".")
    _warn_hook_only(status.get("layers", ""))
    res = _judge(got, status, killed, wall, timeout_s, lim, checker is not None)
    reports = got.get("report", b"").decode("utf-8", "replace").splitlines()
    return res, [line[2:] for line in reports if line.startswith("r ")]
