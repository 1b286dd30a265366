"""The audit hook of a sandboxed process, as text that runs inside the sandbox (after
sandbox_harness.py, before sandbox_boot.py, which installs it; stdlib only).

A second line behind the kernel's walls (sandbox_boot.py): it refuses sockets, process creation,
signals, ctypes and file access outside the scratch dir and the stdlib. A refusal is written to
stderr and ends the process with exit status REFUSED at once, so it cannot be caught, and
closing stderr only hides its message. Paths are resolved the way the kernel resolves them
(each symlink against its own folder), with functions captured before the program runs.
"""

import os
import sys

REFUSED = 113  # also sandbox_outcome.py's _REFUSED


def _make_hook(tmp, read_roots, allow_fork, mark, max_files):
    """The audit hook, a second line behind the kernel's walls: it refuses sockets, process
    creation, signals, ctypes and file access outside the scratch dir and the stdlib. A refusal
    is written to stderr and ends the process (status REFUSED) at once: it cannot be caught.
    `max_files` (when the scratch dir is no size-limited tmpfs) caps files and dirs created, so
    disk use stays under max_files x RLIMIT_FSIZE."""
    # Everything the hook uses is captured here: user code may monkeypatch os, os.path or
    # builtins, and must not be able to change how the hook resolves a path.
    import posix
    getcwd, write, exit_, fspath, stat_, readlink, listdir = (
        posix.getcwd, posix.write, posix._exit, os.fspath, posix.stat, posix.readlink,
        posix.listdir)
    isinstance_, str_, bytes_, int_, len_, type_ = isinstance, str, bytes, int, len, type
    enumerate_, range_ = enumerate, range
    enc = sys.getfilesystemencoding()
    write_roots = (os.path.realpath(tmp),)
    read_roots = tuple(os.path.realpath(p) for p in read_roots) + write_roots
    devices = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
    blocked = ("socket.", "ctypes.", "subprocess.", "os.system", "os.exec", "os.posix_spawn",
               "os.spawn", "os.kill", "os.killpg", "signal.pthread_kill", "os.forkpty", "pty.",
               "gc.get_", "resource.setrlimit", "resource.prlimit", "sys._current_frames",
               "os.setuid", "os.setgid")
    if not allow_fork:
        blocked += ("os.fork",)
    blocked_imports = ("ctypes", "_ctypes", "_posixsubprocess", "_socket", "socket", "mmap")
    write_events = ("os.mkdir", "os.remove", "os.rmdir", "os.rename", "os.link", "os.symlink",
                    "os.truncate", "os.chmod", "os.chown", "os.utime", "os.chflags",
                    "os.setxattr", "os.removexattr", "shutil.")
    read_events = ("os.listdir", "os.scandir", "glob.glob", "os.listxattr", "os.getxattr",
                   "os.chdir")
    # (path, dir_fd) argument positions of the events that take a dir_fd (-1: none given)
    dir_fds = {"os.mkdir": ((0, 2),), "os.remove": ((0, 1),), "os.rmdir": ((0, 1),),
               "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)),
               "os.symlink": ((1, 2),), "os.chmod": ((0, 2),), "os.chown": ((0, 3),),
               "os.utime": ((0, 3),), "shutil.rmtree": ((0, 1),)}
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    created = [0]
    bad = "/\0unresolvable"  # inside no root: what cannot be resolved is refused

    def text(path):
        # The bytes the kernel gets: str and bytes subclasses through the base type's own
        # methods (a subclass's startswith/split must not steer the check); other path-likes
        # through fspath (a pathlib path; one that answers differently per call is a residual
        # gap the README names)
        if isinstance_(path, str_):
            return str_.__str__(path)
        if isinstance_(path, bytes_):
            return bytes_.decode(path, enc, "surrogateescape")
        p = fspath(path)
        return text(p) if isinstance_(p, (str_, bytes_)) else bad

    def fd_path(fd):
        # Where a descriptor points now, as the kernel says (/proc/self/fd); None if nowhere
        try:
            p = readlink("/proc/self/fd/" + int_.__repr__(int_.__index__(fd)))
        except (OSError, ValueError, TypeError):
            return None
        return p if p.startswith("/") and not p.endswith(" (deleted)") else None

    def dir_fd_bases():
        # Every directory this process holds a descriptor of: os.open(..., dir_fd=fd) is
        # resolved against one of them, and the "open" event does not say which.
        try:
            fds = listdir("/proc/self/fd")
        except OSError:  # no /proc listing: probe the descriptors one by one
            fds = [int_.__repr__(i) for i in range_(4096)]
        out = []
        for name in fds:
            try:
                if stat_("/proc/self/fd/" + name).st_mode & 0o170000 != 0o040000:
                    continue
            except OSError:
                continue
            p = fd_path(int_(name))
            if p is None:
                return None
            out.append(p)
        return out

    def normalize(path, base=None):
        # Resolves symlinks the way the kernel will (each link against its own folder), with
        # readlink captured above: a lexical check against the cwd is fooled by relative links.
        p = text(path)
        if not p.startswith("/"):
            p = (base or getcwd()) + "/" + p
        todo, out, links = p.split("/")[::-1], [], 0
        while todo:
            c = todo.pop()
            if c == "" or c == ".":
                continue
            if c == "..":
                if out:
                    out.pop()
                continue
            out.append(c)
            try:
                target = readlink("/" + "/".join(out))
            except (OSError, ValueError):
                continue
            links += 1
            if links > 40:
                return "/\0too-many-links"
            out.pop()
            if target.startswith("/"):
                out = []
            todo.extend(target.split("/")[::-1])
        return "/" + "/".join(out)

    def under(p, roots):
        if p in devices and (roots is read_roots or p == "/dev/null"):
            return True
        for r in roots:
            if p == r or p.startswith(r + "/"):
                return True
        return False

    def inside(path, roots, dir_fd=-1, any_dir=False):
        """`path` as the kernel resolves it (an fd: where it points; relative: against
        `dir_fd`, or with `any_dir` against the cwd and every directory held open) is below
        `roots`."""
        if isinstance_(path, int_):
            p = fd_path(path)
            return p is not None and under(normalize(p), roots)
        if path is None:
            path = "."
        if isinstance_(dir_fd, int_) and dir_fd >= 0 and not text(path).startswith("/"):
            base = fd_path(dir_fd)
            return base is not None and under(normalize(path, base), roots)
        if not under(normalize(path), roots):
            return False
        if any_dir and not text(path).startswith("/"):
            bases = dir_fd_bases()
            if bases is None:
                return False
            for base in bases:
                if not under(normalize(path, base), roots):
                    return False
        return True

    def refuse(what):
        try:
            write(2, ("\n" + mark + "sandbox refused " + what + "\n").encode("utf-8", "replace"))
        except OSError:
            pass
        exit_(REFUSED)

    def count_new(path):
        if max_files is None or isinstance_(path, int_):
            return
        try:
            stat_(path)
            return
        except OSError:
            pass
        created[0] += 1
        if created[0] > max_files:
            refuse(f"creating more than {max_files} files (the sandbox's disk cap)")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance_(path, int_):  # an open descriptor: already checked
                return
            w = bool(mode and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
            w = w or bool((flags or 0) & wflags)
            if not inside(path, write_roots if w else read_roots, any_dir=True):
                refuse(f"open({path!r}) for {'writing' if w else 'reading'} outside the sandbox")
            if w:
                count_new(path)
        elif event.startswith(blocked):
            refuse(event)
        elif event == "import" and args[0].split(".")[0] in blocked_imports:
            refuse("import " + args[0])
        elif event.startswith(write_events):
            pairs = dir_fds.get(event, ())
            checked = []
            for i, j in pairs:
                if i < len_(args) and not inside(args[i], write_roots,
                                                 args[j] if j < len_(args) else -1):
                    refuse(f"{event}({args[i]!r}) outside the sandbox")
                checked.append(i)
            if event == "os.symlink" and len_(args) >= 3:  # the target, from the link's folder
                base = fd_path(args[2]) if isinstance_(args[2], int_) and args[2] >= 0 else ""
                if base is None:
                    refuse(f"os.symlink({args[1]!r}) in a folder that cannot be resolved")
                folder = normalize(args[1], base or None).rsplit("/", 1)[0] or "/"
                if not under(normalize(args[0], folder), write_roots):
                    refuse(f"os.symlink({args[0]!r}) pointing outside the sandbox")
                checked.append(0)
            for i, a in enumerate_(args):
                if i in checked or i >= 1 and not isinstance_(a, (str_, bytes_)):
                    continue
                if (isinstance_(a, (str_, bytes_, int_)) or i == 0) and not inside(
                        a, write_roots):
                    refuse(f"{event}({a!r}) outside the sandbox")
            if event == "os.mkdir":
                count_new(args[0])
        elif event.startswith(read_events):
            if event == "os.listdir" and args and type_(args[0]) is str_ and (
                    args[0] == "/proc/self/fd"):
                return  # dir_fd_bases (inside this hook): its own descriptor numbers only
            if args and not inside(args[0], read_roots):
                refuse(f"{event}({args[0]!r}) outside the sandbox")

    return hook
