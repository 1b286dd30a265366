"""The checker of a suite run (`sandbox.run_pytest`): pytest over trusted test files, with the
untrusted package behind proxies; text that runs inside the sandbox (after sandbox_harness.py,
before sandbox_boot.py; no imports at module level, no rossjax imports).

The program process imports the package (the patched or fixed repository's own code) and serves
it: `__rj_import__(name)` answers a module's attribute table as plain values ({attr: ("f", None)
for a callable, ("v", value) for a plain value, ("m", name) for a submodule}) and adds one
callable per function under the name "<module>.<attr>". This process — the checker — never
imports the package: an import meta path finder makes every module under the package's
top-level names a proxy module built from that table, whose functions forward their calls over
the wire (sandbox_harness.harness_channel: arguments and results cross as exact builtin values;
an exception raised in the program comes back as the builtin exception of that name, so
`pytest.raises(ValueError)` works). pytest (trusted code, from the host's site-packages, plugin
autoloading off) runs in this process over the clean test files (the host wrote them to a
directory only the host can write), and this process's own hooks write each test's outcome on
the report descriptor, which only it holds:

    r t <OUTCOME> <node id>\t<detail>   one per test and per failed collector (PASSED, FAILED,
                                        ERROR, SKIPPED, XFAIL, XPASS; the worst phase wins)
    r broken <why>                      the program exited, hung up, sent a malformed reply or a
                                        value that cannot cross (its calls failed from then on)
    r exit <N>                          pytest's exit status
    done                                last, once pytest returned
"""

TYPE_CHECKING = False
if TYPE_CHECKING:  # in the sandbox these come from the texts run before this one
    from rossjax.verify.sandbox_harness import harness_channel, harness_report
    from rossjax.verify.sandbox_wire import wire_dec


def harness_pytest(spec_fd, req_fd, rep_fd, report_fd, cap, tests_dir):
    import os
    import sys

    report = harness_report(report_fd)
    with open(spec_fd, "rb", closefd=True) as f:
        spec = wire_dec(f.read())
    call, receive, flags, ProgramFailed = harness_channel(req_fd, rep_fd, cap)
    try:
        hello = receive("before the package could be imported")
    except ProgramFailed:
        report("r broken " + flags[0])
        report("done")
        return
    if not (type(hello) is tuple and len(hello) == 2 and hello[0] == "ready"
            and type(hello[1]) is list and "__rj_import__" in hello[1]):
        report("r broken the program did not announce __rj_import__")
        report("done")
        return
    tops = frozenset(spec["modules"])
    sys.path[:0] = list(spec["site"])
    sys.dont_write_bytecode = True  # nothing is written: the checker has no writable dir
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    sys.meta_path.insert(0, _proxy_finder(tops, call))
    import pytest

    plugin = _Outcomes()
    os.chdir(tests_dir)
    try:
        code = pytest.main(list(spec["args"]), plugins=[plugin])
    except ProgramFailed:
        code = 3
    for nodeid in sorted(plugin.seen):
        outcome, detail = plugin.seen[nodeid]
        report(f"r t {outcome} {nodeid}\t{detail}")
    if flags:
        report("r broken " + flags[0])
    report(f"r exit {int(code)}")
    report("done")


def _proxy_finder(tops, call):
    """A meta path finder that answers every module below `tops` with a proxy module."""
    import importlib.abc
    import importlib.machinery
    import importlib.util

    def proxy(module, attr):
        def forward(*args, **kwargs):
            return call(f"{module}.{attr}", args, kwargs)
        forward.__name__ = forward.__qualname__ = attr
        forward.__module__ = module
        return forward

    class Loader(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            name = module.__name__
            table = call("__rj_import__", (name,), {})
            if type(table) is not dict:
                raise ImportError(f"the program answered no attribute table for {name}")
            module.__path__ = []  # a package, so `import name.sub` asks the finder again
            for attr, entry in sorted(table.items()):
                if type(attr) is not str or type(entry) is not tuple or len(entry) != 2:
                    continue
                kind, value = entry
                if attr.startswith("__") and attr not in ("__all__", "__version__", "__doc__"):
                    continue  # never the module's own machinery (__path__, __spec__, ...)
                if kind == "f":
                    setattr(module, attr, proxy(name, attr))
                elif kind == "v":
                    setattr(module, attr, value)
                elif (kind == "m" and type(value) is str
                      and value.split(".")[0] in tops and value != name):
                    setattr(module, attr, importlib.import_module(value))

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] not in tops:
                return None
            return importlib.machinery.ModuleSpec(fullname, Loader(), is_package=True)

    return Finder()


class _Outcomes:
    """pytest hooks: each test's outcome as `pytest -rA` names it (the worst phase wins)."""

    RANK = {"PASSED": 0, "XFAIL": 0, "XPASS": 0, "SKIPPED": 1, "FAILED": 2, "ERROR": 3}

    def __init__(self):
        self.seen = {}

    def put(self, nodeid, outcome, report):
        old = self.seen.get(nodeid)
        if old is None or self.RANK[outcome] > self.RANK[old[0]]:
            detail = ""
            if outcome in ("FAILED", "ERROR"):
                text = str(getattr(report, "longreprtext", "") or "").strip().splitlines()
                detail = (text[-1] if text else "")[:300].replace("\t", " ")
            self.seen[nodeid] = (outcome, detail)

    def pytest_runtest_logreport(self, report):
        xfail = hasattr(report, "wasxfail")
        if report.when == "call":
            if xfail:
                outcome = "XFAIL" if report.skipped else "XPASS"
            else:
                outcome = {"passed": "PASSED", "failed": "FAILED"}.get(report.outcome, "SKIPPED")
            self.put(report.nodeid, outcome, report)
        elif report.failed:
            self.put(report.nodeid, "ERROR", report)
        elif report.skipped:
            self.put(report.nodeid, "XFAIL" if xfail else "SKIPPED", report)

    def pytest_collectreport(self, report):
        if report.failed:
            self.put(report.nodeid or "<collection>", "ERROR", report)
