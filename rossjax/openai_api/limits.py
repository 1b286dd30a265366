"""What the server can hold, read once per client, so a `max_tokens` bigger than the model's
context is lowered instead of refused (issue 42: review's 2048 against `rossjax serve
--max_len=2048` was an HTTP 400 on every request).

`GET {base}/models` carries `max_model_len` on vLLM and `rossjax serve`; OpenAI and most others
carry none, and then nothing changes. When a request's max_tokens could overflow it, the prompt
is counted with the server's `POST /tokenize` (vLLM's and rossjax serve's, at the server root)
and max_tokens lowered to max_model_len minus the prompt (to max_model_len when the server
cannot count), with one note on stderr naming whose endpoint it is. A failed or odd answer to
either request means "unknown": the chat request goes as it was and the server's own error, if
any, is what the user sees.
"""

from __future__ import annotations

import json
import sys
import threading

from rossjax.openai_api import transport

_META_TIMEOUT_S = 10.0
_META_BYTES = 1 << 20


def _positive_int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


class Limits:
    """max_model_len of `client.model` (read on first use) and the fit of each request."""

    def __init__(self, client):
        self.client = client
        self._lock = threading.Lock()
        self._read = False
        self.max_model_len: int | None = None
        self.noted = False
        base = client._path[:-len("/chat/completions")]
        self._models_path = base + "/models"
        self._tokenize_path = (base[:-3] if base.endswith("/v1") else base) + "/tokenize"

    def _meta(self, method: str, path: str, body: dict | None):
        """The parsed JSON of one metadata request, or None on any failure (no retries)."""
        c = self.client
        conn = transport.Connection(c._scheme, c._host, c._port,
                                    min(c.timeout_s, _META_TIMEOUT_S), _META_BYTES)
        headers = {"Accept": "application/json"}
        if c._auth:
            headers["Authorization"] = c._auth
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode("utf-8", "surrogatepass")
        try:
            status, raw, _, _ = conn.post(path, data, headers, method=method)
            return json.loads(raw) if status == 200 else None
        except Exception:  # a refused, odd or hostile answer: unknown, never fatal
            return None
        finally:
            conn.close()

    def limit(self) -> int | None:
        with self._lock:
            if not self._read:
                self._read = True
                obj = self._meta("GET", self._models_path, None)
                data = obj.get("data") if isinstance(obj, dict) else None
                for m in data if isinstance(data, list) else []:
                    if isinstance(m, dict) and m.get("id") == self.client.model:
                        self.max_model_len = _positive_int(m.get("max_model_len"))
        return self.max_model_len

    def prompt_tokens(self, messages) -> int | None:
        obj = self._meta("POST", self._tokenize_path,
                         {"model": self.client.model, "messages": messages})
        return _positive_int(obj.get("count")) if isinstance(obj, dict) else None

    def fit(self, payload: dict) -> dict:
        """`payload` with max_tokens lowered to what the server holds after the prompt."""
        want = _positive_int(payload.get("max_tokens"))
        limit = self.limit() if want else None
        if limit is None:
            return payload
        # a prompt is at most one token per byte (byte-level BPE) plus the template's few
        # special tokens per turn: below that bound nothing can overflow and nothing is counted
        bound = len(json.dumps(payload.get("messages"), ensure_ascii=False).encode(
            "utf-8", "surrogatepass")) + 64
        if want + bound <= limit:
            return payload
        count = self.prompt_tokens(payload.get("messages"))
        allowed = limit - count if count is not None else limit
        if allowed < 1 or want <= allowed:
            return payload   # fits, or a prompt too long for any answer: the server says so
        with self._lock:
            first, self.noted = not self.noted, True
        if first:
            c = self.client
            why = "max_model_len minus the prompt's tokens" if count is not None else \
                "max_model_len: the server counts no prompts (no /tokenize)"
            print(f"note: {c.name} endpoint {c.base_url} serves {c.model} with "
                  f"max_model_len={limit} (GET /v1/models); max_tokens={want} is lowered to what each prompt leaves "
                  f"({why}); set the {c.name}'s max_tokens lower to silence this.",
                  file=sys.stderr)
        return {**payload, "max_tokens": allowed}
