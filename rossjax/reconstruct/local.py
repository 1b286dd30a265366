"""`rossjax serve` as a subprocess on 127.0.0.1 (a free port), so `:runlocal` reconstructs
offline with nothing started by hand. The server is a separate process (it runs the jax engine;
this package is the CPU half and never imports it) and is stopped when the run ends, however
it ends. Its stdout and stderr go to a log file whose tail is quoted if it fails to start.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time

from rossjax.errors import ConfigError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: str, n: int = 600) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return " ".join(f.read()[-n:].split())
    except OSError:
        return "(no log)"


class LocalServer:
    """Start with `with LocalServer(model, ...) as s:`; `s.url`, `s.model_id`."""

    def __init__(self, model: str, log_path: str, *, max_len: int, slots: int,
                 model_id: str = "local", startup_s: float = 300.0,
                 where: str = "config.serve"):
        # where: what the errors name as the source of the server's settings
        self.model, self.log_path, self.model_id, self.where = model, log_path, model_id, where
        self.max_len, self.slots, self.startup_s = max_len, slots, startup_s
        self.proc, self.port = None, None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self):
        self.port = free_port()
        cmd = [sys.executable, "-m", "rossjax.cli", "serve", f"--model={self.model}",
               "--host=127.0.0.1", f"--port={self.port}", f"--max_len={self.max_len}",
               f"--slots={self.slots}", f"--model_id={self.model_id}"]
        env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
        # A user's ROSSJAX_API_KEY (meant for a server they expose) would make this loopback
        # server answer 401 to its own clients, which send no key.
        env.pop("ROSSJAX_API_KEY", None)
        self._log = open(self.log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)
        try:
            self._wait()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait(self):
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConfigError(f"{self.where}: rossjax serve --model={self.model} exited with "
                                  f"code {self.proc.returncode} before serving: "
                                  f"{_tail(self.log_path)}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/v1/models")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
                conn.close()
            except OSError:
                pass
            time.sleep(0.5)
        raise ConfigError(f"{self.where}: rossjax serve did not answer within "
                          f"{self.startup_s:g} s ({self.where}.startup_s): {_tail(self.log_path)}")

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # the process this run started, by its own handle
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()
