"""Suite time (make test must stay within its budget on the slowest machine kind):

  - order: test modules run slowest first (tests/durations.json, seconds per module measured by
    an earlier run), so the two xdist workers finish together instead of one running a long test
    alone at the end. A module keeps its own order (module-scoped fixtures are set up once per
    worker), and a module not in the file runs first (new tests are the ones nobody timed).
  - what it costs: every worker counts XLA compilations in its process (count, seconds, hits of
    the persistent compilation cache that tests/conftest.py turns on) and the summary adds them
    up, so a run shows how much of its time went to compiling; CLI subprocesses are not counted.
  - CPU: each test's CPU seconds (its process and the children it waited for, getrusage) go to
    build/test-cpu.json per module, and the summary lists the modules that cost the most CPU:
    unlike wall time, this holds when other work shares the machine.
  - compiles per module: the XLA compile seconds (and count; persistent-cache hits count as
    cheap compilations) each module's tests spent in the test processes go to
    build/test-compile.json, and the summary lists the costliest.
  - refresh: each run updates build/test-durations.json (the same form as tests/durations.json);
    copy it over after tests were added or moved.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD = os.path.join(os.path.dirname(_HERE), "build")
_STATS_ENV = "ROSSJAX_SUITE_STATS"
_DURATIONS: dict | None = None  # module -> seconds, on the controller only
_CPU: dict = {}  # module -> CPU seconds, on the controller only
_COMPILE: dict = {}  # module -> [XLA compilations, seconds] in the test processes, on the controller
_CPU_START: dict = {}  # nodeid -> (CPU s, compilations, compile s) before its setup, in its process
_T0 = 0.0


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session, config, items):
    try:
        with open(os.path.join(_HERE, "durations.json"), encoding="utf-8") as f:
            known = json.load(f)
    except (OSError, ValueError):
        return
    first_seen = {}
    for i, item in enumerate(items):
        first_seen.setdefault(_module(item.nodeid), i)
    unknown = float("inf")
    # Stable sort: equal keys (one module's tests) keep their collected order.
    items.sort(key=lambda it: (-known.get(_module(it.nodeid), unknown),
                               first_seen[_module(it.nodeid)]))


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        return  # a worker: the controller made the folder and put it in the environment
    folder = os.path.join(_BUILD, "suite-stats", f"{int(time.time())}-{os.getpid()}")
    os.makedirs(folder, exist_ok=True)
    os.environ[_STATS_ENV] = folder  # xdist workers are started after this and inherit it
    global _DURATIONS, _T0
    _DURATIONS, _T0 = {}, time.monotonic()


class _Compiles:
    """XLA compilations of this process, counted once jax has been imported by a test."""

    def __init__(self):
        self.n = self.secs = self.hits = 0
        self.on = False

    def attach(self):
        if self.on or "jax" not in sys.modules:
            return
        from jax import monitoring

        def duration(event, secs, **kw):
            if event == "/jax/core/compile/backend_compile_duration":
                self.n += 1
                self.secs += secs

        def count(event, **kw):
            if event == "/jax/compilation_cache/cache_hits":
                self.hits += 1

        monitoring.register_event_duration_secs_listener(duration)
        monitoring.register_event_listener(count)
        self.on = True


_COMPILES = _Compiles()


def _cpu_now() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_runtest_setup(item):
    _COMPILES.attach()
    _CPU_START[item.nodeid] = (_cpu_now(), _COMPILES.n, _COMPILES.secs)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    start = _CPU_START.pop(item.nodeid, None) if call.when == "teardown" else None
    if start is not None:  # rides to the controller with the teardown report (xdist sends it)
        props = outcome.get_result().user_properties
        props.append(("cpu_s", _cpu_now() - start[0]))
        props.append(("compiles", (_COMPILES.n - start[1], _COMPILES.secs - start[2])))


def pytest_runtest_teardown(item):
    _COMPILES.attach()  # a test that imported jax itself: its later compiles still count


def pytest_runtest_logreport(report):
    # On the controller every worker's reports arrive here (setup, call and teardown each).
    if _DURATIONS is not None:
        mod = _module(report.nodeid)
        _DURATIONS[mod] = _DURATIONS.get(mod, 0.0) + report.duration
        for key, value in getattr(report, "user_properties", ()):
            if key == "cpu_s":
                _CPU[mod] = _CPU.get(mod, 0.0) + value
            elif key == "compiles":
                c = _COMPILE.setdefault(mod, [0, 0.0])
                c[0], c[1] = c[0] + value[0], c[1] + value[1]


def pytest_sessionfinish(session, exitstatus):
    folder = os.environ.get(_STATS_ENV)
    if not folder:
        return
    name = getattr(session.config, "workerinput", {}).get("workerid", "main")
    with open(os.path.join(folder, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump({"compiles": _COMPILES.n, "compile_s": _COMPILES.secs,
                   "cache_hits": _COMPILES.hits}, f)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    folder = os.environ.get(_STATS_ENV)
    if hasattr(config, "workerinput") or not folder:
        return
    n = secs = hits = 0
    for fn in os.listdir(folder):
        with open(os.path.join(folder, fn), encoding="utf-8") as f:
            s = json.load(f)
        n, secs, hits = n + s["compiles"], secs + s["compile_s"], hits + s["cache_hits"]
    wall = time.monotonic() - _T0
    terminalreporter.write_line(
        f"suite: {wall:.0f} s wall; XLA in the test processes: {n} compilations, {secs:.0f} s "
        f"(persistent-cache hits {hits}; CLI subprocesses not counted)")
    if _CPU:
        top = sorted(_CPU.items(), key=lambda kv: -kv[1])
        terminalreporter.write_line(
            f"suite CPU: {sum(_CPU.values()):.0f} s in the test processes and their CLI "
            f"subprocesses; most: " + ", ".join(f"{m.split('/')[-1]} {v:.0f}" for m, v in top[:12]))
        _merge(os.path.join(_BUILD, "test-cpu.json"), _CPU)
    if _COMPILE:  # which modules to look at first when the suite's compile time grows
        top = sorted(_COMPILE.items(), key=lambda kv: -kv[1][1])
        terminalreporter.write_line(
            "suite XLA compile s (compilations) by module: " + ", ".join(
                f"{m.split('/')[-1]} {s:.0f} ({n})" for m, (n, s) in top[:12]))
        _merge(os.path.join(_BUILD, "test-compile.json"), {m: s for m, (n, s) in top})
    # Merged into what earlier runs wrote: make test's second pytest run (the beam module) must
    # not replace the first's table.
    _merge(os.path.join(_BUILD, "test-durations.json"), _DURATIONS)


def _merge(path: str, new: dict):
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError):
        table = {}
    table.update({k: round(v, 1) for k, v in new.items()})
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(dict(sorted(table.items(), key=lambda kv: -kv[1])), f, indent=0)
    os.replace(path + ".tmp", path)
