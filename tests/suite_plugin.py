"""Suite time (make test must stay within its budget on the slowest machine kind):

  - order: test modules run slowest first (tests/durations.json, seconds per module measured by
    an earlier run), so the two xdist workers finish together instead of one running a long test
    alone at the end. A module keeps its own order (module-scoped fixtures are set up once per
    worker), and a module not in the file runs first (new tests are the ones nobody timed).
  - what it costs: every worker counts XLA compilations in its process (count, seconds, hits of
    the persistent compilation cache that tests/conftest.py turns on) and the summary adds them
    up, so a run shows how much of its time went to compiling; CLI subprocesses are not counted.
  - refresh: each run updates build/test-durations.json (the same form as tests/durations.json);
    copy it over after tests were added or moved.
"""

from __future__ import annotations

import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD = os.path.join(os.path.dirname(_HERE), "build")
_STATS_ENV = "ROSSJAX_SUITE_STATS"
_DURATIONS: dict | None = None  # module -> seconds, on the controller only
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


def pytest_runtest_setup(item):
    _COMPILES.attach()


def pytest_runtest_teardown(item):
    _COMPILES.attach()  # a test that imported jax itself: its later compiles still count


def pytest_runtest_logreport(report):
    # On the controller every worker's reports arrive here (setup, call and teardown each).
    if _DURATIONS is not None:
        mod = _module(report.nodeid)
        _DURATIONS[mod] = _DURATIONS.get(mod, 0.0) + report.duration


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
    # Merged into what earlier runs wrote: make test's second pytest run (the beam module) must
    # not replace the first's table.
    path = os.path.join(_BUILD, "test-durations.json")
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError):
        table = {}
    table.update({k: round(v, 1) for k, v in _DURATIONS.items()})
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(dict(sorted(table.items(), key=lambda kv: -kv[1])), f, indent=0)
    os.replace(path + ".tmp", path)
