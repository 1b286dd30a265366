"""Bootstrap of a sandbox: `python -I -S -c LOADER <params dict literal>`, where LOADER runs the
texts of sandbox_wire, sandbox_harness, sandbox_pytest, sandbox_hook, sandbox_kernel and this
file, compiled once by the host into a sealed memfd (sandbox_host.BOOT_PARTS, sealed).

Trusted code only, before any untrusted code runs; stdlib only, no rossjax import (startup
matters). Processes (see sandbox.py for what each mode guarantees):

  P0  the process the host started. Dies with the host (PR_SET_PDEATHSIG, checked against the
      host's pid). Unshares network, mount, pid, IPC namespaces (as root directly; otherwise
      inside a new user namespace that maps only the host's own uid), then forks P1 and waits.
  P1  init of the new pid namespace (when there is one: its death kills every process of the
      sandbox, by the kernel), dies with P0. Builds the file system the sandbox sees, reports
      the active layers on the status descriptor, forks the children below, reaps everything,
      and reports each child's exit status. Non-dumpable; never runs untrusted code.
  checker (checked runs only) runs the trusted tests against proxies of the program's functions
      (sandbox_harness.py; pytest over trusted test files, sandbox_pytest.py) and alone holds
      the report descriptor. Its own uid as root, its own
      Landlock domain otherwise; non-dumpable, so no other process can ptrace it or open its
      descriptors through /proc.
  program runs the model's code under the program uid / Landlock domain, rlimits and the audit
      hook; in checked runs it then serves the checker's calls.
Both children: no descriptors but their own, no capabilities (user namespace), no_new_privs, a
seccomp filter refusing socket(AF_UNIX), PR_SET_PDEATHSIG, rlimits.

A refusal by the audit hook is reported on stderr and then ends the process at once with exit
status REFUSED: a program cannot swallow it, and closing stderr only hides the message.
"""

import os
import resource
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # in the sandbox these come from the texts run before this one
    from rossjax.verify.sandbox_harness import harness_check, harness_serve
    from rossjax.verify.sandbox_hook import _make_hook
    from rossjax.verify.sandbox_kernel import (
        _ARCH,
        _SECCOMP_ARCH,
        PR_SET_DUMPABLE,
        PR_SET_NO_NEW_PRIVS,
        PR_SET_PDEATHSIG,
        _build_root,
        _drop_caps,
        _keep_fds,
        _landlock,
        _limit,
        _prctl,
        _private_tests,
        _put_program,
        _scratch_tmpfs,
        _seccomp,
        _unshare,
        landlock_abi,
    )
    from rossjax.verify.sandbox_pytest import harness_pytest
    from rossjax.verify.sandbox_wire import wire_dec

P = eval(sys.argv[1], {"__builtins__": {}})  # a dict literal written by the host
REFUSED = 113  # exit status of a process the audit hook ended (sandbox_hook.py)
SETUP_FAILED = 114  # a child could not build its walls (sandbox_outcome.py: sandbox_error)


def _confine(uid, keep, write, ns, ll_abi, reads=None, no_fork=False):
    """A child's own walls, in an order where each step still has the rights it needs."""
    _keep_fds(keep)
    if ll_abi:  # before the uid change: the rules' paths are opened with the current rights
        _landlock(ll_abi, P["read_roots"] if reads is None else reads, write,
                  ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"), P.get("shell"))
    else:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _limit(P["limits"], uid)
    if ns == "user":
        _drop_caps()
    _seccomp(no_fork)
    _prctl(PR_SET_PDEATHSIG, 9)  # after the uid change, which clears it


def _status(fd, line):
    os.write(fd, (line + "\n").encode())


def _p0():
    _prctl(PR_SET_PDEATHSIG, 9)
    if os.getppid() != P["host_pid"]:  # the host died before the line above
        os._exit(1)
    ns = _unshare(os.geteuid() == 0) if P["namespaces"] else ""
    pid = os.fork()
    if pid == 0:
        _p1(ns)
        os._exit(0)
    for fd in (P["status_fd"], P["report_fd"], P["program_fd"], P["spec_fd"]):
        if fd >= 0:
            os.close(fd)
    _, st = os.waitpid(pid, 0)
    os._exit(min(255, max(0, os.waitstatus_to_exitcode(st))))


def _p1(ns):
    _prctl(PR_SET_PDEATHSIG, 9)
    _prctl(PR_SET_DUMPABLE, 0)
    status_fd, report_fd = P["status_fd"], P["report_fd"]
    layers = []
    if ns:
        layers += ["userns"] if ns == "user" else []
        layers += ["netns", "pidns", "ipcns"]
    # The host's sealed memfds: no file another run could have rewritten (sandbox_host.sealed)
    program = os.pread(P["program_fd"], os.fstat(P["program_fd"]).st_size, 0)
    os.close(P["program_fd"])
    spec_fd = P["spec_fd"]
    uid, cuid = P["uid"], P["cuid"]
    if ns == "root":
        scratch = _build_root(P, program, uid)
        layers += ["mountns", "rootfs", "scratch-tmpfs"]
    elif ns == "user":
        layers += ["mountns", "scratch-tmpfs"]
        scratch = _scratch_tmpfs(P, program, layers)
    else:
        scratch = P["work"]
        if P["hidden"]:  # root without namespaces: a uid could not reach the interpreter
            uid = cuid = None
        _put_program(scratch + "/main.py", program, uid)
        if uid is not None:
            os.chown(scratch, uid, uid)
    os.chdir(scratch)
    capped = ns in ("root", "user")
    ll_abi = landlock_abi() if P["landlock"] and ns != "root" else 0
    if ll_abi:
        layers.append(f"landlock{ll_abi}")
    if uid is not None:
        layers.append("uid")
    if _ARCH in _SECCOMP_ARCH:
        layers.append("seccomp")
    layers.append("rlimits")
    allow_fork = P["allow_fork"] and uid is not None
    if P["audit"] and not P.get("shell"):
        layers.append("audit")
    if not (ns == "root" or ll_abi):
        layers.append("hook-only")  # no kernel file wall: files are the audit hook's alone
    _status(status_fd, "layers " + ",".join(layers))
    need = P.get("require")
    if need == "landlock" and not (ns == "root" or ll_abi) or need == "namespaces" and not ns:
        _status(status_fd, f"refused the sandbox requires {need} (Limits.require, "
                           f"ROSSJAX_SANDBOX_REQUIRE) and this machine or these Limits give "
                           f"only {','.join(layers)}")
        os._exit(0)
    if P.get("suite") and not (ns == "root" or ll_abi or cuid is not None):
        # A suite's test files need a kernel wall between them and the program: the root
        # mode's own root, Landlock, or a private uid. Without one (rlimits only, the program
        # of the host's own uid) it could rename or remove their folder under the checker's
        # private mount and put its own tests there: no suite run (sandbox_error).
        os.write(2, b"sandbox setup failed: a suite run needs a kernel file wall (namespaces as "
                    b"root, Landlock or a private uid) to keep its test files from the program\n")
        _status(status_fd, f"checker {SETUP_FAILED} 0")
        os._exit(0)
    kids = {}
    req_r = req_w = rep_r = rep_w = -1
    if P["checked"]:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _checker(spec_fd, req_w, rep_r, report_fd, cuid, ns, ll_abi, scratch)
        kids[pid] = "checker"
        for fd in (spec_fd, req_w, rep_r, report_fd):
            os.close(fd)
    pid = os.fork()
    if pid == 0 and P.get("shell"):
        _shell(program, scratch, uid, ns, ll_abi)
    if pid == 0:
        _program(program, scratch, uid, {req_r, rep_w} - {-1}, ns, ll_abi, allow_fork, req_r,
                 rep_w, capped)
    kids[pid] = "program"
    if not P["checked"] and report_fd >= 0:
        os.close(report_fd)
    for fd in (req_r, rep_w):
        if fd >= 0:
            os.close(fd)
    _supervise(kids, status_fd)


def _checker(spec_fd, req_w, rep_r, report_fd, cuid, ns, ll_abi, scratch):
    """The checker process: its walls, then the trusted tests (a source with `check`, or
    pytest over the trusted test files of a suite run) against the program's proxies."""
    suite = P.get("suite")  # {"dir": the test files' dir, "reads": what pytest reads}
    tests_dir = suite and ("/checker" if ns == "root" else suite["dir"])  # in its root as root
    extra = suite["reads"] + [tests_dir] if suite else []
    reads = list(P["read_roots"]) + extra
    try:
        os.close(0)
        if suite:
            files = wire_dec(os.pread(spec_fd, os.fstat(spec_fd).st_size, 0))["tests"]
            _private_tests(tests_dir, files, cuid, ns)
            del files
        _confine(cuid, {spec_fd, req_w, rep_r, report_fd}, None, ns, ll_abi, reads)
        _prctl(PR_SET_DUMPABLE, 0)  # after the uid change, which resets it
    except BaseException as e:
        os.write(2, f"sandbox setup failed: {e}\n".encode())
        os._exit(SETUP_FAILED)
    try:
        if P["audit"] and not suite:
            # pytest imports socket and friends: a suite's checker (trusted code over plain
            # values only) keeps the kernel's walls and seccomp, not the hook
            sys.addaudithook(_make_hook(scratch, P["hook_reads"], False, P["mark"], None))
        if suite:
            harness_pytest(spec_fd, req_w, rep_r, report_fd, P["cap"], tests_dir)
        else:
            harness_check(spec_fd, req_w, rep_r, report_fd, P["entry"], P["cap"])
    finally:
        os._exit(0)


def _supervise(kids, status_fd):
    """Reap every process (orphans of the namespace too) until both children have ended; a
    program still running once the checker is finished is given a moment, then killed."""
    import time
    done, deadline = {}, None
    while len(done) < len(kids):
        flags = os.WNOHANG if deadline else 0
        try:
            pid, st, ru = os.wait4(-1, flags)
        except ChildProcessError:
            break
        if pid == 0:
            if time.monotonic() > deadline:
                for p, name in kids.items():
                    if name not in done:
                        os.kill(p, 9)
                deadline = None
            else:
                time.sleep(0.002)
            continue
        if pid in kids:
            done[kids[pid]] = os.waitstatus_to_exitcode(st)
            # the CPU time it used tells RLIMIT_CPU's SIGKILL from any other (sandbox_outcome)
            _status(status_fd, f"{kids[pid]} {done[kids[pid]]} {ru.ru_utime + ru.ru_stime:.3f}")
            if kids[pid] == "checker" and "program" not in done:
                deadline = time.monotonic() + 0.5


def _shell(command, scratch, uid, ns, ll_abi):
    """run_shell: `bash -c command` in the repository copy. No audit hook (bash is not Python):
    only kernel walls, so it refuses to run without a kernel file wall (the root mode's own
    root, or Landlock) and without a way to kill every process it starts (a pid namespace, or
    a private uid)."""
    repo = "/repo" if ns == "root" else P["repo"]
    try:
        if not (ns == "root" or ll_abi) or not (ns or uid is not None):
            raise RuntimeError("a shell needs namespaces as root or Landlock (for files) and a "
                               "pid namespace or a private uid (for processes)")
        _confine(uid, set(), [scratch, repo], ns, ll_abi)
        if ns == "user":  # with no private uid, RLIMIT_NPROC is charged to the user namespace
            n = P["limits"]["procs"]
            resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
        os.chdir(repo)
    except BaseException as e:
        os.write(2, f"sandbox setup failed: {e}\n".encode())
        os._exit(SETUP_FAILED)
    try:
        os.execve("/bin/bash", ["bash", "-c", command.decode("utf-8", "surrogateescape")],
                  P["shell_env"])
    except OSError as e:
        os.write(2, f"sandbox setup failed: /bin/bash: {e.strerror}\n".encode())
        os._exit(SETUP_FAILED)


def _program(program, scratch, uid, keep, ns, ll_abi, allow_fork, req_r, rep_w, capped):
    global P
    try:
        _confine(uid, keep, scratch, ns, ll_abi, no_fork=not allow_fork)
    except BaseException as e:
        os.write(2, f"sandbox setup failed: {e}\n".encode())
        os._exit(SETUP_FAILED)
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]  # a later `import ctypes` must go through the (refused) import event
    if P["audit"]:
        count = None if capped else P["limits"]["files"]
        sys.addaudithook(_make_hook(scratch, P["hook_reads"], allow_fork, P["mark"], count))
    checked, cap = P["checked"], P["cap"]
    del P
    sys.argv = ["main.py"]
    main = type(sys)("__main__")  # user code gets a fresh __main__, not the bootstrap's namespace
    main.__file__ = "main.py"
    sys.modules["__main__"] = main
    # The bytes P1 read from the host's memfd (main.py, which others might rewrite in a mode
    # without kernel file walls, is only there for tracebacks)
    code = compile(program.decode("utf-8"), "main.py", "exec")
    del program
    try:
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:  # the traceback from main.py on, without the bootstrap's frames
        try:
            import traceback
            traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        except BaseException:
            os.write(2, f"{type(e).__name__}: {e}\n".encode("utf-8", "replace"))
        sys.exit(1)
    if checked:
        harness_serve(main.__dict__, req_r, rep_w, cap)
        sys.stdout.flush()
    sys.exit(0)


_p0()
