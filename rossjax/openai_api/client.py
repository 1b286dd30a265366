"""A client for any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, TGI, llama.cpp
server, OpenAI, `rossjax serve`), spoken with http.client over kept-alive connections (one per
thread). Review's reviewer, reconstruct's model, the PROPEL solvers and agents' OpenAIPolicy all
talk through it.

    client = ChatClient(model="Qwen/Qwen3-32B", cache_dir="/tmp/c", name="reviewer")
    reply = client.ask([{"role": "user", "content": "..."}], stage="proposal")
    reply.text, reply.finish_reason, reply.usage, reply.cached
    raw = client.post(body, stage="policy")   # any request body; the parsed JSON answer

The endpoint is `base_url`, else $OPENAI_BASE_URL, else http://127.0.0.1:8000/v1; the API key is
`api_key`, else $OPENAI_API_KEY (sent as a Bearer token; never needed on the command line); a
user:password in the URL is sent as Basic auth when there is no key. Neither is ever printed:
messages and reports show the URL without credentials, and the key and URL credentials are
scrubbed from every text the server sends back (error bodies, answers) before it is shown,
logged or cached. `name` says whose endpoint it is in every message ("reviewer endpoint URL
failed ...": each caller passes its own). A max_tokens over the server's context (`max_model_len`
in GET /v1/models, vLLM's and rossjax serve's) is lowered to what the prompt leaves, with one
note (limits.py). `extra_body` fields (seed, top_p, chat_template_kwargs, ...) go into every `ask`
request body, as the official client's `extra_body` does; `response_format` may also come per
request (a JSON schema per stage).

A hostile server cannot stretch a request: `timeout_s` bounds the whole exchange (transport.py),
a body over `max_response_bytes` is not read, a body nested past the JSON parser's depth is a
bad response, and `usage` counts that are not finite non-negative numbers are ignored.
Transient failures (HTTP 408/409/425/429, 5xx, refused or dropped connections, timeouts) are
retried with jittered exponential backoff (Retry-After honoured, capped); any other 4xx raises
`ChatError` (status set), and a response that cannot be an answer (too large, not JSON, not
a chat completion, a text holding a lone UTF-16 surrogate) raises `ChatError` with `code`
set: a failure of this request, which the run records against its row. The codes keep their
`reviewer_` prefix: ledgers, reports and docs/review.md name rows by them. Every good `ask`
response is cached on disk next to the request that produced it, under sha256(request body),
written atomically: a killed run resumes without asking anything twice. `mark_failed(key, code)`
records that an answer failed its check; `reask="failed"` (default) asks such answers again
instead of replaying them, "none" replays every cached answer, "all" reads nothing from the
cache. `stats[stage]` counts requests, retries, cache hits, re-asked failed answers and tokens
(the answer's `usage`) per stage.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import random
import re
import threading
import time
import urllib.parse
from collections import Counter
from typing import NamedTuple

from rossjax.errors import ConfigError, InputError
from rossjax.openai_api import limits, transport

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
_RETRY_STATUS = (408, 409, 425, 429)  # plus every 5xx
_MAX_SLEEP_S = 60.0
_RESERVED = ("model", "messages", "stream", "n")  # extra_body may not change what we parse
REASK = ("failed", "none", "all")
# half of a UTF-16 pair (json.loads turns "\\ud800" into one): not a character, and no UTF-8
# file (this cache, a run's outputs) can hold it
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class ChatError(InputError):
    """The endpoint refused a request (`status`) or answered something that cannot be an answer
    (`code`, the withheld reason of the row that asked)."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


class Reply(NamedTuple):
    text: str  # choices[0].message.content ("" when the model gave none)
    finish_reason: str | None  # "length" means the answer was cut off at max_tokens
    usage: dict  # prompt_tokens / completion_tokens as the server counted them
    cached: bool  # read from the cache: nothing was asked
    key: str  # sha256 of the request body: the cache entry holding request and response


def _server_message(body: bytes) -> str:
    """The error text a server put in its body ({"error": {"message": ...}} or plain text)."""
    text = body[:4096].decode("utf-8", errors="replace").strip()
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(err, dict):
            text = str(err.get("message") or err.get("detail") or err)
        elif isinstance(err, str):
            text = err
    except (ValueError, RecursionError):
        pass
    return " ".join(text.split())[:300] or "no message"


def _count(v) -> int | None:
    """A token count as the server gave it, or None for anything that is not a finite
    non-negative integer-valued number (NaN, Infinity, -1, true, "12")."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        return None
    return int(v) if v >= 0 else None


def parse_extra_body(extra) -> dict:
    """`endpoint.extra_body` as a dict: a dict/ConfigDict, a JSON object string, or empty."""
    if extra is None or extra == "":
        return {}
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except ValueError as e:
            raise ConfigError(f"config.endpoint.extra_body is not a JSON object ({e})") from None
    if hasattr(extra, "to_dict"):
        extra = extra.to_dict()
    if not isinstance(extra, dict):
        raise ConfigError(f"config.endpoint.extra_body must be a JSON object, got "
                          f"{type(extra).__name__}")
    bad = [k for k in extra if k in _RESERVED]
    if bad:
        raise ConfigError(f"config.endpoint.extra_body may not set {', '.join(bad)} (the client "
                          "sets these itself)")
    return dict(extra)


class ChatClient:
    def __init__(self, base_url: str | None = None, model: str = "", api_key: str | None = None,
                 timeout_s: float = 120, max_retries: int = 4, temperature: float = 0.0,
                 max_tokens: int = 2048, cache_dir: str | None = None, backoff_s: float = 1.0,
                 extra_body=None, max_response_bytes: int = 8 << 20, reask: str = "failed",
                 name: str = "model"):
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        self.name = name  # whose endpoint, in every message
        if not model:
            raise ConfigError(f"{name} model is empty (config.endpoint.model): name the model "
                              "the endpoint serves")
        parts = urllib.parse.urlsplit(base_url)
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY", "")
        self.secrets = transport.Secrets(self.api_key, parts)
        self.base_url = transport.display_url(parts)  # never holds credentials
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{name} endpoint {self.base_url!r} is not an http(s) URL "
                              "(config.endpoint.base_url or $OPENAI_BASE_URL)")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ConfigError(f"config.endpoint.timeout_s must be a positive number of seconds, "
                              f"got {timeout_s}")
        if max_response_bytes < 1:
            raise ConfigError(f"config.endpoint.max_response_bytes must be >= 1, got "
                              f"{max_response_bytes}")
        if reask not in REASK:
            raise ConfigError(f"config.reask {reask!r} must be one of {', '.join(REASK)}")
        self.url = self.base_url + "/chat/completions"
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._path = parts.path.rstrip("/") + "/chat/completions"
        self._auth = f"Bearer {self.api_key}" if self.api_key else transport.basic_auth(parts)
        self.model = model
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.temperature, self.max_tokens = temperature, max_tokens
        self.max_response_bytes, self.reask = max_response_bytes, reask
        self.extra_body = parse_extra_body(extra_body)
        self.cache_dir = cache_dir
        if cache_dir:
            os.makedirs(cache_dir, exist_ok=True)
        self._lock = threading.Lock()
        self._local = threading.local()  # one kept-alive connection per worker thread
        self.stats: dict[str, Counter] = {}
        self.connections = 0
        self.limits = limits.Limits(self)  # the server's max_model_len, read on the first ask

    # -- accounting -------------------------------------------------------------------------
    def _count(self, stage: str, **kw):
        with self._lock:
            c = self.stats.setdefault(stage, Counter())
            for k, v in kw.items():
                c[k] += v

    def totals(self) -> dict:
        """requests, retries, cache_hits, reasked, prompt_tokens, completion_tokens over all
        stages."""
        out = Counter({"requests": 0, "retries": 0, "cache_hits": 0, "reasked": 0,
                       "prompt_tokens": 0, "completion_tokens": 0})
        for c in self.stats.values():
            out.update(c)
        return dict(out)

    # -- cache ------------------------------------------------------------------------------
    def payload(self, messages, response_format: dict | None = None) -> dict:
        """The exact request body: the model, messages, sampling fields, extra_body fields."""
        body = {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens}
        if response_format is not None and "response_format" not in self.extra_body:
            body["response_format"] = response_format
        body.update(self.extra_body)
        return body

    @staticmethod
    def cache_key(payload: dict) -> str:
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _cache_path(self, key: str) -> str | None:
        return os.path.join(self.cache_dir, key[:2], key + ".json") if self.cache_dir else None

    def _cache_read(self, key: str) -> dict | None:
        path = self._cache_path(key)
        if not path or not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
        except (OSError, ValueError, RecursionError):
            return None  # a torn or foreign file (the atomic write never leaves one): ask again
        return obj if isinstance(obj, dict) and isinstance(obj.get("response"), dict) else None

    def _cache_write(self, key: str, entry: dict):
        path = self._cache_path(key)
        if not path:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(entry, f, ensure_ascii=False)
        os.replace(tmp, path)  # atomic: a killed run never leaves half a response behind

    def mark_failed(self, key: str, code: str):
        """Record that the cached answer under `key` failed its check (`code`): with
        reask="failed" a later run asks the question again instead of replaying it."""
        entry = self._cache_read(key)
        if entry is not None and entry.get("failed") != code:
            self._cache_write(key, {**entry, "failed": code})

    # -- HTTP -------------------------------------------------------------------------------
    def _conn(self) -> transport.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = transport.Connection(self._scheme, self._host, self._port, self.timeout_s,
                                        self.max_response_bytes)
            self._local.conn = conn
            with self._lock:
                self.connections += 1
        return conn

    def _drop_conn(self):
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def post(self, payload: dict, stage: str = "chat") -> dict:
        """The parsed JSON answer to one request body, retried as the module doc says; nothing
        is cached or checked beyond being JSON (`ask` checks and caches chat answers)."""
        try:
            data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate in the body: the same JSON, escaped
            data = json.dumps(payload).encode("ascii")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._auth:
            headers["Authorization"] = self._auth
        last = ""
        for attempt in range(self.max_retries + 1):
            self._count(stage, requests=1, retries=int(attempt > 0))
            retry_after = None
            try:
                status, body, retry_after, reusable = self._conn().post(self._path, data, headers)
                if not reusable:
                    self._drop_conn()
                if status == 200:
                    return self._parse(body)
                msg = self.secrets.scrub(_server_message(body))
                if not (status in _RETRY_STATUS or status >= 500):
                    raise ChatError(f"{self.name} endpoint {self.url} refused the request with "
                                        f"HTTP {status}: {msg}", status)
                last = f"HTTP {status}: {msg}"
            except transport.TooLarge:
                self._drop_conn()
                raise ChatError(f"{self.name} endpoint {self.url} answered more than "
                                    f"endpoint.max_response_bytes={self.max_response_bytes} "
                                    f"bytes; the rest was not read", code="reviewer_oversized")
            except transport.Timeout:
                self._drop_conn()
                last = (f"no complete answer within endpoint.timeout_s={self.timeout_s:g} s "
                        f"(a bound on the whole request; raise it for long answers)")
            except (http.client.HTTPException, OSError) as e:
                self._drop_conn()  # a dropped keep-alive connection: open a fresh one
                last = self.secrets.scrub(f"{type(e).__name__}: {e}; is the server up?")
            if attempt < self.max_retries:
                time.sleep(self._delay(attempt, retry_after))
        raise ChatError(f"{self.name} endpoint {self.url} failed {self.max_retries + 1} time(s) "
                            f"(last: {last})")

    def _parse(self, body: bytes) -> dict:
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as e:
            why = ("nested deeper than the JSON parser goes" if isinstance(e, RecursionError)
                   else "not JSON")
            head = self.secrets.scrub(repr(body[:200]))
            raise ChatError(f"{self.name} endpoint {self.url} answered with a body that is "
                                f"{why}: {head}", code="reviewer_bad_response") from None

    def _delay(self, attempt: int, retry_after) -> float:
        try:
            if retry_after is not None:
                delay = float(retry_after)
                if math.isfinite(delay) and delay >= 0:
                    return min(delay, _MAX_SLEEP_S)
        except ValueError:
            pass  # an HTTP date: fall back to our own schedule
        # full jitter keeps many workers from retrying in lockstep against a busy server
        return min(self.backoff_s * 2 ** attempt, _MAX_SLEEP_S) * (0.5 + random.random() / 2)

    def _slim(self, response) -> dict:
        """The fields an answer is read from, checked, with credentials scrubbed: what is
        cached and replayed (never the server's other fields, whatever they hold)."""
        try:
            choice = response["choices"][0]
            content = choice["message"].get("content")
        except (KeyError, IndexError, TypeError, AttributeError):
            head = self.secrets.scrub(json.dumps(response, default=str)[:200])
            raise ChatError(f"{self.name} endpoint {self.url} answered something that is not a "
                                f"chat completion (no choices[0].message): {head}",
                                code="reviewer_bad_response") from None
        finish = choice.get("finish_reason")
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        counts = {k: _count(usage.get(k)) for k in ("prompt_tokens", "completion_tokens")}
        # a null or non-text content is a bad answer for this row, not a broken endpoint
        text = self.secrets.scrub(content) if isinstance(content, str) else ""
        half = _LONE_SURROGATE.search(text)
        if half:
            raise ChatError(f"{self.name} endpoint {self.url} answered a text holding a lone "
                                f"UTF-16 surrogate (U+{ord(half.group()):04X} at character "
                                f"{half.start()}), which is not a character; the answer was "
                                f"not used nor cached", code="reviewer_not_text")
        return {"choices": [{"index": 0, "finish_reason": finish if isinstance(finish, str)
                             else None, "message": {"role": "assistant", "content": text}}],
                "usage": {k: v for k, v in counts.items() if v is not None}}

    @staticmethod
    def _reply(slim: dict, key: str, cached: bool) -> Reply:
        choice = slim["choices"][0]
        return Reply(choice["message"]["content"], choice["finish_reason"], slim["usage"],
                     cached, key)

    # -- API --------------------------------------------------------------------------------
    def ask(self, messages, *, stage: str = "review", response_format: dict | None = None) -> Reply:
        """The model's reply to `messages` (OpenAI-style role/content dicts), checked and
        cached."""
        payload = self.payload(messages, response_format)
        key = self.cache_key(payload)
        entry = self._cache_read(key) if self.reask != "all" else None
        if entry is not None:
            if not (entry.get("failed") and self.reask == "failed"):
                try:
                    reply = self._reply(self._slim(entry["response"]), key, True)
                except ChatError:
                    reply = None  # an entry this client did not write: ask again
                if reply is not None:
                    self._count(stage, cache_hits=1)
                    return reply
            else:
                self._count(stage, reasked=1)
        # cached under the request as configured (a resumed run replays it with no server);
        # the entry records the body sent, max_tokens fitted to the server's context
        sent = self.limits.fit(payload)
        slim = self._slim(self.post(sent, stage))  # check before caching: never cache junk
        self._count(stage, **slim["usage"])
        self._cache_write(key, {"request": sent, "response": slim})
        return self._reply(slim, key, False)

    def complete(self, messages, stage: str = "review") -> str:
        """Just the answer text of `ask`."""
        return self.ask(messages, stage=stage).text

    def close(self):
        self._drop_conn()
