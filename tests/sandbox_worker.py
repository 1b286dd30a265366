"""Runs sandbox attacks in one mode and reports what happened (tests/test_faults_sandbox.py).

    python tests/sandbox_worker.py SPEC.json OUT.json

SPEC: {"attacks": {name: {"kind": "run"|"tests"|"checked"|"kill_host"|"poison"|"race"|"orphans",
"program": src, "tests": src, "checker": src, "limits": {...}}}}. Programs may use {SECRET}, {VICTIM}, {VICTIM_PID}, {HOST_PID}, {SOCK}: a
world-readable file holding a token, a path the attack must not create, the pid of a sleeping
process of this worker's uid, this worker's pid and a unix socket it listens on. OUT: per attack the sandbox's verdict and
what the host saw afterwards (token seen in the output, victim file created, victim process
alive). Run as root it is the root mode; as an unprivileged uid, Landlock (or rlimits only).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from rossjax.verify import sandbox
from rossjax.verify.sandbox import Limits


def sandbox_pids(marker: str) -> list[int]:
    """Live processes whose command line contains `marker` (a sandbox's base dir)."""
    out = []
    for e in os.scandir("/proc"):
        if not e.name.isdigit() or int(e.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{e.name}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{e.name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and b"-c" not in cmd.split(b"\0")[:2] and state != "Z":
            out.append(int(e.name))
    return out


def kill_host(program: str, limits: dict, want: int) -> dict:
    """Start a host process running `program` in the sandbox, wait until `want` sandbox processes
    exist, SIGKILL the host, and count the sandbox's processes still alive 3 s later."""
    tmp = tempfile.mkdtemp(prefix="rj-host-", dir=os.environ.get("TMPDIR"))
    code = ("import sys\nfrom rossjax.verify import sandbox\n"
            f"sandbox.run(sys.argv[1], timeout_s=30, limits=sandbox.Limits(**{limits!r}))\n")
    host = subprocess.Popen([sys.executable, "-c", code, program], env={**os.environ, "TMPDIR": tmp})
    marker = os.path.join(tmp, "rossjax-sandbox-")
    deadline, seen = time.monotonic() + 20, []
    while time.monotonic() < deadline and len(seen) < want:
        seen = sandbox_pids(marker)
        time.sleep(0.05)
    host.kill()
    host.wait()
    deadline, left = time.monotonic() + 3, seen
    while time.monotonic() < deadline and left:
        time.sleep(0.05)
        left = sandbox_pids(marker)
    return {"seen": len(seen), "left": len(left)}


WRONG = "def add(a, b):\n    return 0\n"
ADD_TESTS = "def check(candidate):\n    assert candidate(2, 3) == 5\n"


def wrong_passes_in_new_process() -> bool | None:
    """run_tests of a wrong program in a fresh host process (a poisoned cache would show there)."""
    code = ("import sys\nfrom rossjax.verify import sandbox\n"
            f"print(sandbox.run_tests({WRONG!r}, {ADD_TESTS!r}, 'add').passed)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return {"True": True, "False": False}.get(out.stdout.strip().splitlines()[-1:][0]
                                              if out.stdout.strip() else "", None)


def race(program: str, limits: Limits, rounds: int = 10) -> list:
    """`program` runs in one sandbox (for a few seconds) while this process checks a wrong
    program `rounds` times in others: what those verdicts were."""
    t = threading.Thread(target=sandbox.run, args=(program,), kwargs={"timeout_s": 6,
                                                                       "limits": limits})
    t.start()
    time.sleep(0.5)
    got = [sandbox.run_tests(WRONG, ADD_TESTS, "add").passed for _ in range(rounds)]
    t.join()
    return got


def pytest_site() -> list[str]:
    """Where pytest is installed (the SWE suites' runtime venv)."""
    from rossjax.verify import repo, swe
    return swe._site(repo.default_read_roots())[:1]


def main(spec_path: str, out_path: str):
    with open(spec_path) as f:
        spec = json.load(f)
    home = tempfile.mkdtemp(prefix="rj-worker-", dir=os.environ.get("TMPDIR"))
    os.chmod(home, 0o755)
    token = os.urandom(8).hex()
    secret = os.path.join(home, "secret.txt")
    with open(secret, "w") as f:
        f.write(f"TOKEN-{token}\n")
    os.chmod(secret, 0o644)
    sock_path, reached = os.path.join(home, "sock"), []
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(sock_path)
    srv.listen(8)

    def accept():
        while True:
            conn, _ = srv.accept()
            reached.append(1)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    results = {}
    for name, a in spec["attacks"].items():
        reached.clear()
        victim = os.path.join(home, f"victim-{name}")
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                    f"TOKEN-{token}"])
        src = (a["program"].replace("{SECRET}", secret).replace("{VICTIM}", victim)
               .replace("{VICTIM_PID}", str(sleeper.pid)).replace("{HOST_PID}", str(os.getpid()))
               .replace("{SOCK}", sock_path))
        lim = Limits(**a.get("limits", {}))
        if a["kind"] == "kill_host":
            res = kill_host(src, a.get("limits", {}), a.get("want", 3))
        elif a["kind"] == "checked":
            r, reports = sandbox.run_checked(src, a["checker"], a.get("entry", "add"),
                                             timeout_s=a.get("timeout", 5), limits=lim)
            res = {"ok": r.ok, "reason": r.reason, "reports": reports}
        elif a["kind"] == "poison":  # a run that tries to poison what later runs trust
            r = sandbox.run(src, timeout_s=a.get("timeout", 5), limits=lim)
            res = {"ok": r.ok, "reason": r.reason, "stdout": r.stdout[-2000:],
                   "wrong_passes": sandbox.run_tests(WRONG, ADD_TESTS, "add").passed,
                   "wrong_passes_new_process": wrong_passes_in_new_process()}
        elif a["kind"] == "race":
            res = {"verdicts": race(src, lim)}
        elif a["kind"] == "orphans":  # processes of the run still alive once run() returned
            r = sandbox.run(src, timeout_s=a.get("timeout", 5), limits=lim)
            marker = os.path.join(sandbox.get_host().base, "run-")
            time.sleep(0.5)
            left = sandbox_pids(marker)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            res = {"ok": r.ok, "reason": r.reason, "stdout": r.stdout[-2000:],
                   "isolation": r.isolation, "left": len(left)}
        elif a["kind"] == "pytest":  # a suite run: trusted test files, the package behind proxies
            tests = {k: v.replace("{TOKEN}", token) for k, v in a["tests"].items()}
            r, reports = sandbox.run_pytest(src, tests, ["rjpkg"], timeout_s=a.get("timeout", 20),
                                            limits=Limits(**{"procs": 64, "memory_mb": 2048,
                                                             **a.get("limits", {})}),
                                            site=pytest_site())
            res = {"ok": r.ok, "reason": r.reason, "reports": reports, "stdout": r.stdout[-2000:],
                   "isolation": r.isolation, "token_seen": token in r.stdout + r.stderr}
        elif a["kind"] == "tests":
            v = sandbox.run_tests(src, a["tests"], a.get("entry", "add"), timeout_s=a.get("timeout", 5),
                                  limits=lim, prefix=a.get("prefix"))
            res = {"passed": v.passed, "reason": v.evidence}
        else:
            r = sandbox.run(src, timeout_s=a.get("timeout", 5), limits=lim)
            res = {"ok": r.ok, "reason": r.reason, "stdout": r.stdout[-2000:],
                   "stderr": r.stderr[-2000:], "isolation": r.isolation,
                   "token_seen": token in r.stdout + r.stderr}
        res["victim_created"] = os.path.exists(victim)
        res["victim_alive"] = sleeper.poll() is None
        time.sleep(0.05 if "socket" in name else 0)  # let the accept thread see a connection
        res["socket_reached"] = bool(reached)
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
        results[name] = res
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
