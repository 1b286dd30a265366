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
    getcwd, write, exit_, fspath, stat_, readlink = (posix.getcwd, posix.write, posix._exit,
                                                     os.fspath, posix.stat, posix.readlink)
    isinstance_, str_, bytes_, int_, len_ = isinstance, str, bytes, int, len
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
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    created = [0]

    def normalize(path, base=None):
        # Resolves symlinks the way the kernel will (each link against its own folder), with
        # readlink captured above: a lexical check against the cwd is fooled by relative links.
        p = path if isinstance_(path, str_) else bytes_.decode(path, enc, "surrogateescape")
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

    def inside(path, roots, base=None):
        if isinstance_(path, int_):
            return True
        p = normalize(path if isinstance_(path, (str_, bytes_)) else fspath(path), base)
        if p in devices and (roots is read_roots or p == "/dev/null"):
            return True
        for r in roots:
            if p == r or p.startswith(r + "/"):
                return True
        return False

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
            if path is None:
                return
            w = bool(mode and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
            w = w or bool((flags or 0) & wflags)
            if not inside(path, write_roots if w else read_roots):
                refuse(f"open({path!r}) for {'writing' if w else 'reading'} outside the sandbox")
            if w:
                count_new(path)
        elif event.startswith(blocked):
            refuse(event)
        elif event == "import" and args[0].split(".")[0] in blocked_imports:
            refuse("import " + args[0])
        elif event.startswith(write_events):
            if event == "os.symlink" and len_(args) >= 2 and isinstance_(args[1], (str_, bytes_)):
                link = normalize(args[1])
                if not inside(args[0], write_roots, link.rsplit("/", 1)[0] or "/"):
                    refuse(f"os.symlink({args[0]!r}) pointing outside the sandbox")
            for a in args:
                if isinstance_(a, (str_, bytes_)) and not inside(a, write_roots):
                    refuse(f"{event}({a!r}) outside the sandbox")
            if event == "os.mkdir":
                count_new(args[0])
        elif event.startswith(read_events):
            if args and isinstance_(args[0], (str_, bytes_)) and not inside(args[0], read_roots):
                refuse(f"{event}({args[0]!r}) outside the sandbox")

    return hook
