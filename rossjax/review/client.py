"""A reviewer LLM behind an OpenAI-compatible chat-completions endpoint (vLLM, SGLang, TGI,
llama.cpp server, OpenAI), spoken with urllib only.

    client = ReviewerClient("http://127.0.0.1:8000/v1", "Qwen/Qwen3-32B", cache_dir="/tmp/c")
    text = client.complete([{"role": "user", "content": "..."}])
    texts = client.complete_many([msgs_a, msgs_b], concurrency=8)   # same order as the input

Transient failures (HTTP 429 and 5xx, refused or dropped connections, timeouts) are retried with
exponential backoff (Retry-After is honoured, capped); any other 4xx and a response that is not a
chat completion raise `ReviewerError`, one sentence naming the endpoint. Every good response is
cached on disk under sha256(model, messages, sampling params), written atomically, so a killed
run resumes without asking the reviewer again (and the same question is never paid for twice).
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
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed

_RETRY_STATUS = (408, 409, 425, 429)  # plus every 5xx
_MAX_SLEEP_S = 60.0


class ReviewerError(ValueError):
    """The endpoint refused a request or answered something that is not a chat completion."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


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


class ReviewerClient:
    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 120,
                 max_retries: int = 4, temperature: float = 0.0, max_tokens: int = 2048,
                 cache_dir: str | None = None, backoff_s: float = 1.0):
        if not base_url:
            raise ValueError("reviewer endpoint base_url is empty (config.endpoint.base_url)")
        if not model:
            raise ValueError("reviewer model is empty (config.endpoint.model): name the model "
                             "the endpoint serves")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model, self.api_key = model, api_key
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.temperature, self.max_tokens = temperature, max_tokens
        self.cache_dir = cache_dir
        if cache_dir:
            os.makedirs(cache_dir, exist_ok=True)
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "retries": 0, "cache_hits": 0}

    # -- cache ------------------------------------------------------------------------------
    def _payload(self, messages) -> dict:
        return {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens}

    def cache_key(self, messages) -> str:
        blob = json.dumps(self._payload(messages), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _cache_path(self, key: str) -> str | None:
        return os.path.join(self.cache_dir, key[:2], key + ".json") if self.cache_dir else None

    def _cache_get(self, key: str) -> dict | None:
        path = self._cache_path(key)
        if not path or not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None  # a torn file (cannot happen with the atomic write, but never trust it)

    def _cache_put(self, key: str, response: dict):
        path = self._cache_path(key)
        if not path:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(response, f, ensure_ascii=False)
        os.replace(tmp, path)  # atomic: a killed run never leaves half a response behind

    # -- requests ---------------------------------------------------------------------------
    def _content(self, response) -> str:
        try:
            msg = response["choices"][0]["message"]
            content = msg.get("content")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise ReviewerError(f"reviewer endpoint {self.url} answered something that is not a "
                                f"chat completion (no choices[0].message): "
                                f"{json.dumps(response)[:200]}") from None
        if not isinstance(content, str):
            raise ReviewerError(f"reviewer endpoint {self.url} answered a chat completion whose "
                                f"choices[0].message.content is {type(content).__name__}, not text")
        return content

    def _post(self, payload: dict) -> dict:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                with self._lock:
                    self.stats["retries"] += 1
            retry_after = None
            with self._lock:
                self.stats["requests"] += 1
            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    body = resp.read()
                try:
                    return json.loads(body)
                except ValueError:
                    raise ReviewerError(f"reviewer endpoint {self.url} answered with a body that "
                                        f"is not JSON: {body[:200]!r}") from None
            except urllib.error.HTTPError as e:
                msg = _server_message(e.read() or b"")
                if not (e.code in _RETRY_STATUS or e.code >= 500):
                    raise ReviewerError(f"reviewer endpoint {self.url} refused the request with "
                                        f"HTTP {e.code}: {msg}", e.code) from None
                last = f"HTTP {e.code}: {msg}"
                retry_after = e.headers.get("Retry-After") if e.headers else None
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout,
                    TimeoutError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}; is the server up?"
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

    def complete(self, messages) -> str:
        """The reviewer's answer text to `messages` (OpenAI-style role/content dicts)."""
        key = self.cache_key(messages)
        cached = self._cache_get(key)
        if cached is not None:
            with self._lock:
                self.stats["cache_hits"] += 1
            return self._content(cached)
        response = self._post(self._payload(messages))
        text = self._content(response)  # check before caching: never cache a malformed answer
        self._cache_put(key, response)
        return text

    def complete_many(self, list_of_messages, concurrency: int = 8, *, progress: bool = True,
                      desc: str = "review", return_exceptions: bool = False) -> list:
        """`complete` for each request on a thread pool, answers in input order. With
        `return_exceptions` a request that raised ReviewerError has that error in its slot."""
        from tqdm import tqdm

        out: list = [None] * len(list_of_messages)

        def one(i):
            try:
                out[i] = self.complete(list_of_messages[i])
            except ReviewerError as e:
                if not return_exceptions:
                    raise
                out[i] = e

        if not list_of_messages:
            return out
        with ThreadPoolExecutor(max(1, min(concurrency, len(list_of_messages)))) as pool, \
                tqdm(total=len(list_of_messages), unit="req", desc=desc, disable=not progress,
                     leave=False) as bar:
            futures = [pool.submit(one, i) for i in range(len(list_of_messages))]
            try:
                for f in as_completed(futures):
                    f.result()
                    bar.update(1)
            except BaseException:
                for f in futures:
                    f.cancel()  # do not keep asking once the run is failing
                raise
        return out
