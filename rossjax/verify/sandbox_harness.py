"""The two sides of a checked run, as text that runs inside the sandbox (after sandbox_wire.py,
before sandbox_boot.py; no imports at module level, no rossjax imports).

`harness_serve` runs in the program process after the model's code: it announces the
program's top-level functions, then answers each call the checker asks for with the wire
encoding of the return value (or the exception's name and message, or a refusal of a value
that is not a plain builtin). The program controls this process completely — it may patch this
very function — so nothing it sends is trusted beyond being decodable into plain values.

`harness_check` runs in the checker process (another uid, or another Landlock domain, and
non-dumpable): it executes the trusted prefix, then the trusted test source, with the entry
point alone bound to a proxy that makes those calls (the program's other functions never reach
the tests), and writes what it found on the report descriptor,
which only it holds: `r <text>` lines a test source emits with `_rj_report`, then exactly one
final `done` or `fail <why>` / `error <why>` line. A refusal, a malformed reply or the program
exiting mid-call marks the run failed even if a test catches the exception.
"""

TYPE_CHECKING = False  # no `typing` import: it would slow every sandbox start
if TYPE_CHECKING:  # in the sandbox these names come from sandbox_wire.py's text, run before this
    from rossjax.verify.sandbox_wire import (
        WireError,
        WireRefused,
        wire_dec,
        wire_enc,
        wire_recv,
        wire_send,
    )


def harness_serve(main_dict, req_fd, rep_fd, cap):
    # Any callable but a class: `@functools.lru_cache` or `f = lambda ...` entry points too.
    names = [n for n, v in list(main_dict.items())
             if type(n) is str and callable(v) and not isinstance(v, type)]
    wire_send(rep_fd, wire_enc(("ready", names)))
    while True:
        msg = wire_recv(req_fd, cap)
        if msg is None:
            return  # the checker is finished
        name, args, kwargs = wire_dec(msg)
        try:
            value = main_dict[name](*args, **kwargs)
        except Exception as e:
            try:
                text = str(e)[:300]
            except Exception:
                text = "(unprintable)"
            reply = ("raise", type(e).__name__, text)
        else:
            reply = ("ok", value)
        try:
            payload = wire_enc(reply)
        except WireRefused as e:
            payload = wire_enc(("refused", f"{name}() returned {e}"))
        wire_send(rep_fd, payload)


def harness_channel(req_fd, rep_fd, cap):
    """The checker's side of the pipes: (call, receive, flags, ProgramFailed). `call(name, args,
    kwargs)` returns the program's plain value or raises a builtin exception rebuilt from its
    name; anything else (a refusal, a malformed reply, the program gone) appends to `flags`
    and raises ProgramFailed, and every later call raises it at once."""
    import builtins

    flags = []  # the first thing that makes the run fail, whatever the tests do about it

    class ProgramFailed(BaseException):  # not an Exception: `except Exception` in tests misses it
        pass

    def failed(why):
        flags.append(why)
        raise ProgramFailed(why)

    def receive(what):
        try:
            msg = wire_recv(rep_fd, cap)
        except (WireError, OSError) as e:
            failed(f"{what}: {e}")
        if msg is None:
            failed(f"the program exited {what}")
        try:
            return wire_dec(msg)
        except WireError as e:
            failed(f"{what}: {e}")

    def call(name, args, kwargs):
        if flags:
            raise ProgramFailed(flags[0])
        try:
            req = wire_enc((name, args, kwargs))
        except WireRefused as e:
            flags.append(f"checker_error: the tests pass {e} to {name}(); it cannot be sent")
            raise ProgramFailed(flags[-1])
        try:
            wire_send(req_fd, req)
        except OSError:
            failed(f"the program exited before the call {name}()")
        reply = receive(f"during the call {name}()")
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "ok":
            return reply[1]
        if (type(reply) is tuple and len(reply) == 3 and reply[0] == "raise"
                and type(reply[1]) is str and type(reply[2]) is str):
            cls = getattr(builtins, reply[1], None)
            exc = None
            # StopIteration would end the tests' own loops silently (`all(map(candidate, xs))`
            # is then True): it and its async twin arrive as RuntimeError, like PEP 479's
            if (isinstance(cls, type) and issubclass(cls, Exception)
                    and not issubclass(cls, (StopIteration, StopAsyncIteration))):
                try:
                    exc = cls(reply[2])
                except Exception:
                    exc = None
            if exc is None:
                exc = RuntimeError(f"{reply[1]}: {reply[2]}")
            exc.rj_name = reply[1]
            raise exc
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "refused":
            failed(f"refused: {str(reply[1])[:300]}")
        failed(f"malformed reply to {name}()")

    return call, receive, flags, ProgramFailed


def harness_report(report_fd):
    """A writer of report lines on the checker's own descriptor."""
    import posix

    def report(line):
        line = line if line.startswith("r ") else line[:2000]
        data = (line.replace("\n", " ") + "\n").encode("utf-8", "replace")
        while data:
            data = data[posix.write(report_fd, data):]

    return report


def harness_check(spec_fd, req_fd, rep_fd, report_fd, entry, cap):
    import builtins

    report = harness_report(report_fd)
    with open(spec_fd, "rb", closefd=True) as f:
        tests, prefix = wire_dec(f.read())
    call, receive, flags, ProgramFailed = harness_channel(req_fd, rep_fd, cap)

    def proxy(name):
        def candidate(*args, **kwargs):
            return call(name, args, kwargs)
        candidate.__name__ = candidate.__qualname__ = name
        return candidate

    try:
        hello = receive("before its functions were ready")
    except ProgramFailed:
        report("fail " + flags[0])
        return
    if not (type(hello) is tuple and len(hello) == 2 and hello[0] == "ready"
            and type(hello[1]) is list):
        report("fail the program did not announce its functions")
        return
    names = [n for n in hello[1] if type(n) is str and n.isidentifier()]
    if entry not in names:
        report(f"fail the program defines no function {entry}()")
        return
    # Only the entry point is the program's: every other name the tests call (HumanEval's
    # `poly`, `encode_cyclic`) comes from the tests, the trusted prefix or the builtins, never
    # from the program, whose own copy of a helper would judge it (issue 36 item 4).
    ns = {"__name__": "__main__", "__builtins__": builtins}
    ns[entry] = proxy(entry)
    ns["_rj_report"] = lambda text: report("r " + str(text))
    ns["_rj_decode"] = wire_dec
    if prefix:
        # The task's own prompt (trusted, like the tests): its helpers, e.g. HumanEval's
        # `poly` or `encode_cyclic`, are what the tests call, not the program's copies.
        try:
            exec(compile(prefix, "prompt", "exec"), ns)
        except BaseException:
            pass
        ns[entry] = proxy(entry)
    try:
        exec(compile(tests, "tests", "exec"), ns)
    except ProgramFailed:
        pass
    except SyntaxError as e:
        report(f"error the tests do not compile: {e.msg} (line {e.lineno})")
        return
    except BaseException as e:
        if not flags:
            report("fail " + _harness_describe(e, tests))
            return
    if flags:
        kind = "error" if flags[0].startswith("checker_error") else "fail"
        report(f"{kind} {flags[0]}")
        return
    report("done")


def _harness_describe(e, tests):
    """`AssertionError (tests line 12: assert candidate(3) == 4)` for a failed test."""
    line, tb = None, e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "tests":
            line = tb.tb_lineno
        tb = tb.tb_next
    name = getattr(e, "rj_name", type(e).__name__)
    text = f"{name}: {str(e)[:200]}" if str(e) else name
    if line is not None:
        src = tests.splitlines()
        if 0 < line <= len(src):
            text += f" (tests line {line}: {src[line - 1].strip()[:160]})"
    return text
