"""A reviewer LLM behind an OpenAI-compatible chat-completions endpoint (vLLM, SGLang, TGI,
llama.cpp server, OpenAI), spoken with http.client over kept-alive connections (one per thread).

    client = ReviewerClient(model="Qwen/Qwen3-32B", cache_dir="/tmp/c")  # key, url from the env
    reply = client.ask([{"role": "user", "content": "..."}], stage="proposal")
    reply.text, reply.finish_reason, reply.usage, reply.cached

The endpoint is `base_url`, else $OPENAI_BASE_URL, else http://127.0.0.1:8000/v1; the API key is
`api_key`, else $OPENAI_API_KEY (sent as a Bearer token; never needed on the command line).
`extra_body` fields (seed, top_p, chat_template_kwargs, ...) go into every request body, as the
official client's `extra_body` does; `response_format` may also come per request (a JSON schema
per stage). Transient failures (HTTP 408/409/425/429, 5xx, refused or dropped connections,
timeouts) are retried with jittered exponential backoff (Retry-After honoured, capped); any other
4xx and a body that is not a chat completion raise `ReviewerError`, one sentence naming the
endpoint. Every good response is cached on disk next to the request that produced it, under
sha256(request body), written atomically: a killed run resumes without asking anything twice.
`stats[stage]` counts requests, retries, cache hits and tokens (the answer's `usage`) per stage.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import socket
import threading
import time
import urllib.parse
from collections import Counter
from typing import NamedTuple

from rossjax.errors import ConfigError, InputError

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
_RETRY_STATUS = (408, 409, 425, 429)  # plus every 5xx
_MAX_SLEEP_S = 60.0
_RESERVED = ("model", "messages", "stream", "n")  # extra_body may not change what we parse


class ReviewerError(InputError):
    """The endpoint refused a request or answered something that is not a chat completion."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class Reply(NamedTuple):
    text: str  # choices[0].message.content ("" when the model gave none)
    finish_reason: str | None  # "length" means the answer was cut off at max_tokens
    usage: dict  # prompt_tokens / completion_tokens as the server counted them
    cached: bool  # read from the cache: nothing was asked
    key: str  # sha256 of the request body: the cache entry holding request and response


def _server_message(body: bytes) -> str:
    """The error text a server put in its body ({"error": {"message": ...}} or plain text)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(err, dict):
            text = str(err.get("message") or err.get("detail") or err)
        elif isinstance(err, str):
            text = err
    except ValueError:
        pass
    return " ".join(text.split())[:300] or "no message"


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
        raise ConfigError(f"config.endpoint.extra_body may not set {', '.join(bad)} (the reviewer "
                          "sets these itself)")
    return dict(extra)


class ReviewerClient:
    def __init__(self, base_url: str | None = None, model: str = "", api_key: str | None = None,
                 timeout_s: float = 120, max_retries: int = 4, temperature: float = 0.0,
                 max_tokens: int = 2048, cache_dir: str | None = None, backoff_s: float = 1.0,
                 extra_body=None):
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        if not model:
            raise ConfigError("reviewer model is empty (config.endpoint.model): name the model "
                              "the endpoint serves")
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"reviewer endpoint {base_url!r} is not an http(s) URL "
                              "(config.endpoint.base_url or $OPENAI_BASE_URL)")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._path = parts.path.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY", "")
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.temperature, self.max_tokens = temperature, max_tokens
        self.extra_body = parse_extra_body(extra_body)
        self.cache_dir = cache_dir
        if cache_dir:
            os.makedirs(cache_dir, exist_ok=True)
        self._lock = threading.Lock()
        self._local = threading.local()  # one kept-alive connection per worker thread
        self.stats: dict[str, Counter] = {}
        self.connections = 0

    # -- accounting -------------------------------------------------------------------------
    def _count(self, stage: str, **kw):
        with self._lock:
            c = self.stats.setdefault(stage, Counter())
            for k, v in kw.items():
                c[k] += v

    def totals(self) -> dict:
        """requests, retries, cache_hits, prompt_tokens, completion_tokens over all stages."""
        out = Counter({"requests": 0, "retries": 0, "cache_hits": 0, "prompt_tokens": 0,
                       "completion_tokens": 0})
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

    def _cache_get(self, key: str) -> dict | None:
        path = self._cache_path(key)
        if not path or not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
        except (OSError, ValueError):
            return None  # a torn file (cannot happen with the atomic write, but never trust it)
        return obj.get("response") if isinstance(obj, dict) and "request" in obj else obj

    def _cache_put(self, key: str, request: dict, response: dict):
        path = self._cache_path(key)
        if not path:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"request": request, "response": response}, f, ensure_ascii=False)
        os.replace(tmp, path)  # atomic: a killed run never leaves half a response behind

    # -- HTTP -------------------------------------------------------------------------------
    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=self.timeout_s)
            self._local.conn = conn
            with self._lock:
                self.connections += 1
        return conn

    def _drop_conn(self):
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _post(self, payload: dict, stage: str) -> dict:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.max_retries + 1):
            self._count(stage, requests=1, retries=int(attempt > 0))
            retry_after = None
            try:
                conn = self._conn()
                conn.request("POST", self._path, body=data, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                if resp.will_close:
                    self._drop_conn()
                if resp.status == 200:
                    try:
                        return json.loads(body)
                    except ValueError:
                        raise ReviewerError(f"reviewer endpoint {self.url} answered with a body "
                                            f"that is not JSON: {body[:200]!r}") from None
                msg = _server_message(body)
                if not (resp.status in _RETRY_STATUS or resp.status >= 500):
                    raise ReviewerError(f"reviewer endpoint {self.url} refused the request with "
                                        f"HTTP {resp.status}: {msg}", resp.status)
                last = f"HTTP {resp.status}: {msg}"
                retry_after = resp.getheader("Retry-After")
            except (http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError,
                    OSError) as e:
                self._drop_conn()  # a dropped keep-alive connection: open a fresh one
                last = f"{type(e).__name__}: {e}; is the server up?"
            if attempt < self.max_retries:
                time.sleep(self._delay(attempt, retry_after))
        raise ReviewerError(f"reviewer endpoint {self.url} failed {self.max_retries + 1} times "
                            f"(last: {last})")

    def _delay(self, attempt: int, retry_after) -> float:
        try:
            if retry_after is not None:
                return min(float(retry_after), _MAX_SLEEP_S)
        except ValueError:
            pass  # an HTTP date: fall back to our own schedule
        # full jitter keeps many workers from retrying in lockstep against a busy server
        return min(self.backoff_s * 2 ** attempt, _MAX_SLEEP_S) * (0.5 + random.random() / 2)

    def _reply(self, response, key: str, cached: bool) -> Reply:
        try:
            choice = response["choices"][0]
            msg = choice["message"]
            content = msg.get("content")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise ReviewerError(f"reviewer endpoint {self.url} answered something that is not a "
                                f"chat completion (no choices[0].message): "
                                f"{json.dumps(response)[:200]}") from None
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        usage = {k: int(usage[k]) for k in ("prompt_tokens", "completion_tokens")
                 if isinstance(usage.get(k), (int, float))}
        # a null or non-text content is a bad answer for this row, not a broken endpoint
        text = content if isinstance(content, str) else ""
        return Reply(text, choice.get("finish_reason"), usage, cached, key)

    # -- API --------------------------------------------------------------------------------
    def ask(self, messages, *, stage: str = "review", response_format: dict | None = None) -> Reply:
        """The reviewer's reply to `messages` (OpenAI-style role/content dicts)."""
        payload = self.payload(messages, response_format)
        key = self.cache_key(payload)
        cached = self._cache_get(key)
        if cached is not None:
            self._count(stage, cache_hits=1)
            return self._reply(cached, key, True)
        response = self._post(payload, stage)
        reply = self._reply(response, key, False)  # check before caching: never cache junk
        self._count(stage, **reply.usage)
        self._cache_put(key, payload, response)
        return reply

    def complete(self, messages, stage: str = "review") -> str:
        """Just the answer text of `ask`."""
        return self.ask(messages, stage=stage).text

    def close(self):
        self._drop_conn()
