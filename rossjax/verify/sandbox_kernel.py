"""The kernel interfaces of a sandbox, as text that runs inside it (after sandbox_hook.py,
before sandbox_boot.py, which uses them; stdlib only, no rossjax import).

Namespaces and the root file system the sandbox sees (`_unshare`, `_build_root`,
`_scratch_tmpfs`), Landlock rulesets (`_landlock`), capabilities, the seccomp filter, rlimits and
descriptor hygiene (`_limit`, `_keep_fds`). Called from the bootstrap's processes before any
untrusted code runs (sandbox.py says what each mode guarantees).
"""

import ctypes  # the kernel interfaces below have no os wrapper in Python 3.11
import os
import resource

_libc = ctypes.CDLL(None, use_errno=True)
_ARCH = os.uname().machine
_SYS = {"x86_64": {"pivot_root": 155, "capset": 126},
        "aarch64": {"pivot_root": 41, "capset": 91}}.get(_ARCH, {})
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38


def _call(fn, *args):
    args = [a.encode() if isinstance(a, str) else a for a in args]
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{getattr(fn, '__name__', 'syscall')}: {os.strerror(err)}")


def _prctl(option, value):
    _call(_libc.prctl, option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
          ctypes.c_ulong(0))


def _mount(src, dst, fstype, flags, data=None):
    _call(_libc.mount, src, dst, fstype, ctypes.c_ulong(flags), data)


def _write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _unshare(root):
    """'root' or 'user' (which namespaces were made) or '' when the kernel refuses them."""
    base = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    try:
        if root:
            _call(_libc.unshare, base)
            return "root"
        uid, gid = os.geteuid(), os.getegid()
        _call(_libc.unshare, base | CLONE_NEWUSER)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        return "user"
    except OSError:
        return ""


def _bind_ro(src, dst, is_dir=True):
    if is_dir:
        os.makedirs(dst, exist_ok=True)
    else:
        os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(src, dst, None, MS_BIND | MS_REC)
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID
           | (0 if not is_dir else MS_NODEV))


def _build_root(p, program, uid):
    """As root: a read-only tmpfs root holding read-only binds of the interpreter, its shared
    libraries and /usr/share/zoneinfo, four device nodes, a /proc of the new pid namespace and a
    size-limited tmpfs /sandbox (the only writable place); pivot_root into it and detach the
    host's tree, so nothing else exists (no path check involved)."""
    new = p["stage"]
    lim = p["limits"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("rossjax-root", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=755")
    for d in p["ro_dirs"]:
        _bind_ro(d, new + d)
    for link, target in p["links"].items():
        os.makedirs(os.path.dirname(new + link), exist_ok=True)
        os.symlink(target, new + link)
    os.makedirs(new + "/dev")
    for dev in ("null", "zero", "urandom", "random"):
        # Read-only binds; writes to /dev/null still work (the node, not the mount, takes them).
        _bind_ro("/dev/" + dev, new + "/dev/" + dev, is_dir=False)
    os.makedirs(new + "/proc")
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    os.makedirs(new + "/sandbox")
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    _mount("rossjax-scratch", new + "/sandbox", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
           f"size={lim['disk_bytes']},nr_inodes={lim['files']},mode=700{owner}")
    if not os.path.lexists(new + "/tmp"):
        os.symlink("/sandbox", new + "/tmp")
    # else a read-only dir already holds /tmp/... binds (a venv or checkout under /tmp, as in a
    # CI clone): /tmp stays read-only and TMPDIR (= /sandbox) is where temporary files go
    if p.get("suite"):  # a suite run: the checker mounts its test files here (_private_tests)
        os.makedirs(new + "/checker")
    _put_program(new + "/sandbox/main.py", program, uid)
    if p.get("shell"):  # run_shell: the caller's scratch copy of a repository, writable at /repo
        os.makedirs(new + "/repo")
        _mount(p["repo"], new + "/repo", None, MS_BIND | MS_REC)
        _mount(None, new + "/repo", None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV)
    os.makedirs(new + "/.old")
    if _libc.syscall(_SYS["pivot_root"], new.encode(), (new + "/.old").encode()) != 0:
        raise OSError(ctypes.get_errno(), "pivot_root failed")
    os.chdir("/")
    _call(_libc.umount2, "/.old", 2)  # MNT_DETACH: the host's mounts are gone from this tree
    os.rmdir("/.old")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    return "/sandbox"


def _scratch_tmpfs(p, program, layers):
    """In a user namespace: the scratch dir becomes a size-limited tmpfs (total disk cap)."""
    lim = p["limits"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("rossjax-scratch", p["work"], "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
           f"size={lim['disk_bytes']},nr_inodes={lim['files']},mode=700")
    _put_program(p["work"] + "/main.py", program, None)
    try:  # a /proc of the new pid namespace: no host process is visible
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        layers.append("proc")
    except OSError:
        pass  # e.g. a container whose /proc is partly masked: Landlock still denies it
    return p["work"]


def _private_tests(d, tests, uid, ns):
    """A suite's trusted files ({relative path: text}) below `d`, where only the checker (this
    process, before its walls) reaches them: with namespaces a read-only tmpfs in a mount
    namespace of its own (the program's has only the empty dir); without, a dir of mode 0700
    handed to the checker's private `uid`, or one the Landlock walls keep from the program.
    Never a host file another process of the host's uid could rewrite while the run starts."""
    if ns:
        _call(_libc.unshare, CLONE_NEWNS)
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        size = 2 * sum(len(t.encode("utf-8", "surrogateescape")) for t in tests.values()) + (1 << 20)
        owner = f",uid={uid},gid={uid}" if uid is not None else ""
        _mount("rossjax-tests", d, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
               f"size={size},nr_inodes={4 * len(tests) + 64},mode=700{owner}")
    for rel, text in tests.items():
        path = d + "/" + rel
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, text.encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
    if ns:
        _mount(None, d, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    elif uid is not None:
        os.chown(d, uid, uid)  # mode 0700: the program's uid cannot enter


def _put_program(path, program, uid):
    with open(path, "wb") as f:
        f.write(program)
    if uid is not None:
        os.chown(path, uid, uid)


# Landlock (kernel >= 5.13): a ruleset handling every right this ABI knows, with rules granting
# reads of `read` dirs, everything below `write`, and read/write of the device nodes.
_LL_FS_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1,
              5: (1 << 16) - 1}
_LL_READ = (1 << 2) | (1 << 3)  # READ_FILE | READ_DIR
_LL_FILE = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)  # rights valid on a file


def landlock_abi():
    abi = _libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return abi if abi > 0 else 0


def _landlock(abi, read, write, devices, execute=False):
    fs = _LL_FS_ABI.get(abi, (1 << 16) - 1)
    net = 3 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP, no rule: no TCP at all
    scoped = 3 if abi >= 6 else 0  # ABSTRACT_UNIX_SOCKET | SIGNAL: nothing outside the domain
    attr = (ctypes.c_uint64 * 3)(fs, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    rfd = _libc.syscall(444, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rfd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")

    class Beneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    def allow(path, rights):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            rule = Beneath(rights, fd)
            if _libc.syscall(445, rfd, 1, ctypes.byref(rule), 0) != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule {path} failed")
        finally:
            os.close(fd)

    for d in read:  # a shell execs binaries (and their ELF interpreter) from the read roots
        allow(d, (_LL_READ | (1 if execute else 0)) & fs)
    for w in [write] if isinstance(write, str) else write or ():
        allow(w, fs)
    for d in devices:
        allow(d, (_LL_FILE & fs) & ~1)
    if not execute:  # the audit hook lists its own descriptors (dir_fd resolution), no more
        allow("/proc/self/fd", (1 << 3) & fs)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if _libc.syscall(446, rfd, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(rfd)


def _drop_caps():
    """In a user namespace: drop every capability (the program must not mount or ptrace)."""
    head = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    if _libc.syscall(_SYS["capset"], ctypes.byref(head), ctypes.byref(data)) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


# audit arch, then the numbers of socket, unshare, clone, clone3, then syscalls refused outright
# (mknod, mknodat: no audit event sees a fifo or node made with dir_fd; ptrace,
# process_vm_readv/writev, pidfd_open, pidfd_getfd, pidfd_send_signal, tkill: another
# process's memory, descriptors or signals, which a program of the host's own uid could reach
# without namespaces or Landlock), refused without fork (fork, vfork; aarch64 has only clone),
# and the signal calls whose first argument must then be the program's own pid (kill,
# rt_sigqueueinfo, tgkill, rt_tgsigqueueinfo: raise() and os.kill(os.getpid()) still work)
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 272, 56, 435,
                            (133, 259, 101, 310, 311, 434, 438, 424, 200), (57, 58),
                            (62, 129, 234, 297)),
                 "aarch64": (0xC00000B7, 198, 97, 220, 435,
                             (33, 117, 270, 271, 434, 438, 424, 130), (), (129, 138, 131, 240))}
CLONE_THREAD = 0x00010000


def _seccomp(no_fork=False):
    """A seccomp filter: socket(AF_UNIX) fails with EPERM (namespaces and Landlock leave the host
    user's pathname unix sockets reachable; socketpair still works); so do unshare() and clone()
    with CLONE_NEWUSER (a nested user namespace gives a program capabilities over new namespaces:
    kernel attack surface it never needs), mknod/mknodat, ptrace and the other calls on another
    process (see _SECCOMP_ARCH); with `no_fork` also a signal to any process but itself, and
    fork, vfork and clone without CLONE_THREAD (threads only: the kernel, not the audit hook, refuses new
    processes in every mode, whatever module makes them); clone3 answers ENOSYS (its flags sit
    in memory a filter cannot read; libc falls back to clone). False when this architecture has
    no entry."""
    if _ARCH not in _SECCOMP_ARCH:
        return False
    arch, nr_socket, nr_unshare, nr_clone, nr_clone3, refused, forks, signals = (
        _SECCOMP_ARCH[_ARCH])
    refused = refused + (forks if no_fork else ())
    signals = signals if no_fork else ()  # with fork allowed, a private uid confines signals
    me = os.getpid()
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000  # SECCOMP_RET_ALLOW, SECCOMP_RET_KILL_PROCESS
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ERRNO | errno
    # (code, jump-if-true label, jump-if-false label, k); labels resolve to relative offsets.
    prog = [("", ld, None, None, 4), ("", jeq, "nr", "kill", arch),
            ("kill", ret, None, None, kill), ("nr", ld, None, None, 0)]
    if _ARCH == "x86_64":  # x32 numbers (bit 30) reach the same kernel code: refuse them
        prog.append(("", jge, "deny", None, 0x40000000))
    prog += [("", jeq, "sock", None, nr_socket), ("", jeq, "deny", None, nr_unshare),
             ("", jeq, "clone", None, nr_clone), ("", jeq, "enosys", None, nr_clone3)]
    prog += [("", jeq, "deny", None, nr) for nr in refused]
    prog += [("", jeq, "self", None, nr) for nr in signals]
    prog += [("", ret, None, None, allow),
             ("self", ld, None, None, 16), ("", jeq, None, "deny", me),  # args[0] == own pid
             ("", ret, None, None, allow),
             ("sock", ld, None, None, 16), ("", jeq, "deny", None, 1),  # args[0] == AF_UNIX
             ("", ret, None, None, allow),
             ("clone", ld, None, None, 16), ("", jset, "deny", None, 0x10000000)]
    if no_fork:  # clone's flags (args[0]) must make a thread
        prog += [("", jset, None, "deny", CLONE_THREAD)]
    prog += [("", ret, None, None, allow),  # (classic BPF jumps only forward)
             ("deny", ret, None, None, eperm), ("enosys", ret, None, None, enosys)]
    where = {label: i for i, (label, *_) in enumerate(prog) if label}

    def off(i, label):
        return 0 if label is None else where[label] - i - 1

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Insn))]

    insns = (Insn * len(prog))(*[Insn(code, off(i, t), off(i, f), k)
                                 for i, (_, code, t, f, k) in enumerate(prog)])
    fprog = Prog(len(prog), insns)
    _call(_libc.prctl, 22, ctypes.c_ulong(2), ctypes.byref(fprog), ctypes.c_ulong(0),
          ctypes.c_ulong(0))  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    return True


def _limit(lim, uid):
    resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (lim["memory_bytes"], lim["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim["file_bytes"], lim["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if uid is not None:
        # RLIMIT_NPROC counts a real uid's processes system-wide: only with a private uid.
        resource.setrlimit(resource.RLIMIT_NPROC, (lim["procs"], lim["procs"]))
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _keep_fds(keep):
    prev = 3
    for fd in sorted(keep):
        if fd >= prev:
            os.closerange(prev, fd)
            prev = fd + 1
    os.closerange(prev, 1 << 16)
