"""Bootstrap of a sandboxed child: `python -I -S -c <this file's text> <params dict literal>`.

Runs before any untrusted code, while the child is still root (when the host is): it isolates
itself, drops to a throw-away uid, installs an audit hook, then executes `main.py` from its
temporary directory. Stdlib only, and no rossjax import, so the child starts in ~15 ms.

Layers, each a backstop for the others:
  1. new network namespace (no interfaces but a down loopback) and a private mount namespace in
     which /tmp, /var/tmp and /dev/shm are read-only except the sandbox's own directory;
  2. an unprivileged per-sandbox uid/gid (root-owned files become unwritable, the host and the
     other sandboxes cannot be signalled) with rlimits on CPU, address space, processes, file size;
  3. a Python audit hook refusing sockets, process creation, signals, ctypes and file access
     outside the temp dir and the stdlib; each refusal is also reported on stderr so the host
     fails the run even if the program swallows the exception.
"""

import os
import resource
import sys

P = eval(sys.argv[1], {"__builtins__": {}})  # a dict literal written by the host; json would cost 15 ms
TMP = P["tmp"]
MARK = P["mark"]  # prefix of a refusal line on stderr; the host looks for it
layers = []


def _mounts(params):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)

    def call(fn, *args):
        args = [a.encode() if isinstance(a, str) else a for a in args]
        if fn(*args) != 0:
            raise OSError(ctypes.get_errno(), "sandbox setup failed")

    MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
    CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWUSER = 0x00020000, 0x40000000, 0x10000000
    if os.getuid() != 0:
        # Unprivileged: a user namespace lets us at least own an empty network namespace.
        try:
            call(libc.unshare, CLONE_NEWUSER | CLONE_NEWNET)
            layers.append("netns")
        except OSError:
            pass
        return False
    try:
        call(libc.unshare, CLONE_NEWNS | CLONE_NEWNET)
    except OSError:
        return False
    layers.append("netns")
    call(libc.mount, None, "/", None, MS_REC | MS_PRIVATE, None)
    hidden, prefix, stage = params["hidden"], params["prefix"], params["stage"]
    if hidden:
        # The interpreter lives under a directory the sandbox uid cannot enter (e.g. /root/.pyenv):
        # show only the interpreter's prefix there, on an empty read-only tmpfs.
        call(libc.mount, prefix, stage, None, MS_BIND | MS_REC, None)
        call(libc.mount, "sandbox", hidden, "tmpfs", 0, "mode=755,size=64k")
        os.makedirs(prefix, exist_ok=True)
        call(libc.mount, stage, prefix, None, MS_BIND | MS_REC, None)
        call(libc.mount, None, prefix, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
        call(libc.mount, None, hidden, None, MS_REMOUNT | MS_RDONLY, "mode=755")
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d) and not os.path.islink(d):
            call(libc.mount, d, d, None, MS_BIND | MS_REC, None)
            call(libc.mount, None, d, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
    call(libc.mount, TMP, TMP, None, MS_BIND, None)
    call(libc.mount, None, TMP, None, MS_BIND | MS_REMOUNT, None)  # rw again, only here
    layers.append("mountns")
    return True


mounted = _mounts(P) if P["isolate"] else False
os.chdir(TMP)  # after the mounts: the old cwd points below the read-only bind

lim = P["limits"]
resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))
resource.setrlimit(resource.RLIMIT_AS, (lim["memory_bytes"], lim["memory_bytes"]))
resource.setrlimit(resource.RLIMIT_FSIZE, (lim["file_bytes"], lim["file_bytes"]))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if P["uid"] is not None and (mounted or not P["hidden"]):
    resource.setrlimit(resource.RLIMIT_NPROC, (lim["procs"], lim["procs"]))
    os.setgroups([])
    os.setgid(P["uid"])
    os.setuid(P["uid"])
    layers.append("uid")
# Without a private uid, RLIMIT_NPROC would count all of the host user's processes: fork then
# stays refused by the audit hook alone (the host forces allow_fork off in that case).
layers.append("rlimits")

for _name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
    del sys.modules[_name]  # a later `import ctypes` must go through the (refused) import event


def _make_hook(tmp, read_roots, allow_fork, mark):
    # Everything the hook uses is captured here as a local: user code may monkeypatch os, os.path
    # or builtins, and must not be able to change how the hook resolves a path.
    import posix
    getcwd, write, fspath, isinstance_, str_, bytes_, int_ = (
        posix.getcwd, posix.write, os.fspath, isinstance, str, bytes, int)
    enc = sys.getfilesystemencoding()
    write_roots = (os.path.realpath(tmp),)
    read_roots = tuple(os.path.realpath(p) for p in read_roots) + write_roots
    devices = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
    blocked = ("socket.", "ctypes.", "subprocess.", "os.system", "os.exec", "os.posix_spawn",
               "os.spawn", "os.kill", "os.killpg", "signal.pthread_kill", "os.forkpty", "pty.",
               "gc.get_", "resource.setrlimit", "resource.prlimit", "sys._current_frames")
    if not allow_fork:
        blocked += ("os.fork",)
    blocked_imports = ("ctypes", "_ctypes", "_posixsubprocess", "_socket", "socket", "mmap")
    write_events = ("os.mkdir", "os.remove", "os.rmdir", "os.rename", "os.link", "os.symlink",
                    "os.truncate", "os.chmod", "os.chown", "os.utime", "os.chflags",
                    "os.setxattr", "os.removexattr", "shutil.")
    read_events = ("os.listdir", "os.scandir", "glob.glob", "os.listxattr", "os.getxattr")
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def normalize(path):
        # Lexical normalisation (no symlink lookups, which user code could fake); links that
        # leave the temp dir cannot be made because os.symlink/os.link are checked below.
        p = path if isinstance_(path, str_) else bytes_.decode(path, enc, "surrogateescape")
        if not p.startswith("/"):
            p = getcwd() + "/" + p
        parts = []
        for c in p.split("/"):
            if c == "..":
                if parts:
                    parts.pop()
            elif c and c != ".":
                parts.append(c)
        return "/" + "/".join(parts)

    def inside(path, roots):
        if isinstance_(path, int_):
            return True
        p = normalize(path if isinstance_(path, (str_, bytes_)) else fspath(path))
        if roots is read_roots and p in devices:
            return True
        for r in roots:
            if p == r or p.startswith(r + "/"):
                return True
        return False

    def refuse(what):
        msg = "sandbox refused " + what
        try:
            write(2, ("\n" + mark + msg + "\n").encode("utf-8", "replace"))
        except OSError:
            pass
        raise PermissionError(msg)

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if path is None:
                return
            w = bool(mode and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
            w = w or bool((flags or 0) & wflags)
            if not inside(path, write_roots if w else read_roots):
                refuse(f"open({path!r}) for {'writing' if w else 'reading'} outside the sandbox")
        elif event.startswith(blocked):
            refuse(event)
        elif event == "import" and args[0].split(".")[0] in blocked_imports:
            refuse("import " + args[0])
        elif event.startswith(write_events):
            for a in args:
                if isinstance_(a, (str_, bytes_)) and not inside(a, write_roots):
                    refuse(f"{event}({a!r}) outside the sandbox")
        elif event.startswith(read_events):
            if args and isinstance_(args[0], (str_, bytes_)) and not inside(args[0], read_roots):
                refuse(f"{event}({args[0]!r}) outside the sandbox")

    return hook


if P["audit"]:
    sys.addaudithook(_make_hook(TMP, P["read_roots"], P["allow_fork"] and "uid" in layers, MARK))
    layers.append("audit")
del _make_hook
os.write(2, f"{MARK}layers {','.join(layers)}\n".encode())  # also tells the host we started
del P, resource, mounted, lim
sys.argv = ["main.py"]
_main = type(sys)("__main__")  # user code gets a fresh __main__, not the bootstrap's namespace
_main.__file__ = "main.py"
sys.modules["__main__"] = _main
with open("main.py", encoding="utf-8") as _f:
    _code = compile(_f.read(), "main.py", "exec")
del _f
exec(_code, _main.__dict__)
