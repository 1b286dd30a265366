"""One HTTP exchange with an OpenAI-compatible endpoint that a hostile or broken server cannot
stretch: `Connection.post` sends a request on a kept-alive http.client connection and returns
(status, body, Retry-After) within ONE deadline for the whole exchange (connect, send, headers,
body), reading at most `max_bytes` of body. `Secrets` scrubs the API key and URL credentials
out of every text that could be printed.

Why a deadline thread: a socket timeout bounds each read, not the answer, so a server that drips
a byte every few seconds never trips it; the timer shuts the socket down, which wakes the
blocked read in the worker thread. http.client is the standard library's maintained HTTP/1.1
client (httpx is not a core dependency, and its timeouts are per read as well).
"""

from __future__ import annotations

import base64
import http.client
import socket
import threading
import time
import urllib.parse

_CHUNK = 1 << 16


class Timeout(OSError):
    """The whole exchange took longer than its deadline."""


class TooLarge(OSError):
    """The body is longer than the byte cap (the rest is never read)."""


class Secrets:
    """The API key and any credentials of the base URL; `scrub(text)` hides each in `text`."""

    def __init__(self, api_key: str, parts: urllib.parse.SplitResult):
        values = [api_key, parts.password or ""]
        if parts.username is not None:
            values.append(parts.netloc.rsplit("@", 1)[0])  # the raw userinfo, as in the URL
            if not parts.password:  # https://TOKEN@host: the user name is the secret
                values.append(parts.username)
        # short strings are not secrets worth mangling text for (vLLM's dummy key is "EMPTY")
        self._values = sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for v in self._values:
            if v in text:
                text = text.replace(v, "<redacted>")
        return text


def display_url(parts: urllib.parse.SplitResult) -> str:
    """The URL without credentials or query (what reports and error messages show)."""
    host = parts.netloc.rsplit("@", 1)[-1]
    netloc = ("<redacted>@" if "@" in parts.netloc else "") + host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def basic_auth(parts: urllib.parse.SplitResult) -> str | None:
    """An Authorization header value for user:password in the URL (None without them)."""
    if parts.username is None:
        return None
    raw = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(raw.encode("utf-8")).decode("ascii")


class _Deadline:
    """Shuts the connection's socket down when the exchange's time is up."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float):
        self.conn, self.expired, self.sock = conn, False, None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self):
        with self._lock:
            self.expired = True
            # the response keeps reading from a socket the connection may have let go of
            # (http.client drops conn.sock on a `Connection: close` response)
            sock = self.sock or self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the blocked recv returns at once
            except OSError:
                pass

    def hold(self, sock):
        with self._lock:
            self.sock = sock
        self.check()

    def check(self):
        with self._lock:
            if self.expired:
                raise Timeout("deadline passed")

    def cancel(self):
        self._timer.cancel()


class Connection:
    """One kept-alive connection (per worker thread) to scheme://host:port."""

    def __init__(self, scheme: str, host: str, port: int | None, timeout_s: float,
                 max_bytes: int):
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        self.conn = cls(host, port, timeout=timeout_s)
        self.timeout_s, self.max_bytes = timeout_s, max_bytes

    def close(self):
        self.conn.close()

    def post(self, path: str, data: bytes | None, headers: dict,
             method: str = "POST") -> tuple[int, bytes, str | None, bool]:
        """(status, body, Retry-After, reusable) of one POST (or `method`: GET with no data);
        raises Timeout past the deadline, TooLarge past the byte cap, and http.client / OSError
        errors as they come. The connection is closed after any raise."""
        deadline = _Deadline(self.conn, self.timeout_s)
        t0 = time.monotonic()
        try:
            if self.conn.sock is None:
                self.conn.connect()
            deadline.hold(self.conn.sock)
            self.conn.sock.settimeout(self.timeout_s)
            self.conn.request(method, path, body=data, headers=headers)
            resp = self.conn.getresponse()
            body = self._read(resp, deadline)
            deadline.check()
            return resp.status, body, resp.getheader("Retry-After"), not resp.will_close
        except Timeout:
            self.conn.close()
            raise
        except (http.client.HTTPException, OSError) as e:
            self.conn.close()
            if deadline.expired or time.monotonic() - t0 >= self.timeout_s:
                raise Timeout("deadline passed") from e
            raise
        finally:
            deadline.cancel()

    def _read(self, resp: http.client.HTTPResponse, deadline: _Deadline) -> bytes:
        length = resp.getheader("Content-Length")
        if length and length.strip().isdigit() and int(length) > self.max_bytes:
            raise TooLarge(f"Content-Length {int(length)}")
        chunks, n = [], 0
        while True:
            chunk = resp.read(_CHUNK)
            deadline.check()
            if not chunk:
                return b"".join(chunks)
            n += len(chunk)
            if n > self.max_bytes:
                raise TooLarge(f"more than {self.max_bytes} bytes")
            chunks.append(chunk)
