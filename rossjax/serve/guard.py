"""What `rossjax serve` refuses before a request reaches the engine (issue 36): hostile input
is a 4xx with an OpenAI-style JSON error, never a 500 or a 200 on nonsense.

The body is read as bytes (over `max_body`, counted after any Content-Encoding: 413), must be
UTF-8 JSON (another content type or charset: 415) nesting at most MAX_DEPTH lists and objects;
numbers must be finite (Python's json reads NaN, Infinity and 1e999, and NaN passes every
range check), and text must encode (no lone surrogates). With an API key every path but
/health needs `Authorization: Bearer KEY` (401 otherwise), as vLLM's --api-key guards /v1.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math

from aiohttp import web

MAX_BODY = 16 * 2**20       # bytes a request body may have (after any Content-Encoding)
# Lists and objects a body may nest: a chat request nests ~4; far below the recursion limit.
MAX_DEPTH = 64
OPEN_PATHS = ("/health",)   # answered without the API key (a liveness probe holds no key)


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


def error(e: BadRequest) -> web.Response:
    kind = "not_found_error" if e.status == 404 else "invalid_request_error"
    code = "invalid_api_key" if e.status == 401 else None
    return web.json_response({"error": {"message": str(e), "type": kind, "param": e.param,
                                        "code": code}}, status=e.status)


def show(v) -> str:
    """A client's value, quoted short (an error message never echoes a megabyte back)."""
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def too_deep(obj) -> bool:
    """True when `obj` nests more than MAX_DEPTH lists and objects (iterative: any depth)."""
    stack = [(obj, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            if d > MAX_DEPTH:
                return True
            stack.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return False


def text(s: str, field: str) -> str:
    try:
        s.encode("utf-8")   # a lone surrogate ("\ud800" in the JSON) is no text to tokenize
    except UnicodeEncodeError:
        raise BadRequest(f"{field} holds a lone UTF-16 surrogate, which is not text.",
                         field) from None
    return s


def auth_middleware(api_key: str):
    """401 unless `Authorization: Bearer API_KEY` (scheme case-insensitive, as vLLM's); the
    digests compare in constant time, so timing tells nothing of the key."""
    want = hashlib.sha256(api_key.encode("utf-8")).digest()

    @web.middleware
    async def auth(request, handler):
        if request.path in OPEN_PATHS:
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        # surrogateescape: header bytes that are not UTF-8 compare as the bytes they were
        got = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        if not hmac.compare_digest(got, want) or scheme.lower() != "bearer":
            return error(BadRequest("this server needs an API key: send 'Authorization: Bearer "
                                     "KEY' with the key rossjax serve was started with "
                                     "(--api_key or ROSSJAX_API_KEY).", status=401))
        return await handler(request)

    return auth


def num(body, name, default, lo, hi, *, integer=False, lo_open=False):
    v = body.get(name, default)
    if v is None:
        return default
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok_type:
        raise BadRequest(f"'{name}' must be {'an integer' if integer else 'a number'}, got "
                         f"{show(v)}.", name)
    if isinstance(v, float) and not math.isfinite(v):   # NaN passes every comparison below
        raise BadRequest(f"'{name}' is {v}; it must be a finite number.", name)
    if v < lo or v > hi or (lo_open and v == lo):
        raise BadRequest(f"'{name}' is {show(v)}; it must be in {'(' if lo_open else '['}{lo}, "
                         f"{hi}].", name)
    return v


async def read_json(request, max_body: int):
    """The request's JSON body (any JSON value: the caller checks its shape)."""
    # no Content-Type is read as JSON (curl -d without -H); another media type is refused
    if "Content-Type" in request.headers and not (
            request.content_type == "application/json" or
            request.content_type.startswith("application/") and
            request.content_type.endswith("+json")):
        raise BadRequest(f"the request body must be application/json, not "
                         f"{show(request.content_type)}.", status=415)
    if (request.charset or "utf-8").lower() not in ("utf-8", "utf8"):
        raise BadRequest(f"the request body's charset is {show(request.charset)}; JSON is "
                         f"UTF-8.", status=415)
    too_big = BadRequest(f"the request body is over {max_body} bytes.", status=413)
    if (request.content_length or 0) > max_body:
        raise too_big
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_big from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"the request body is not UTF-8 ({e}).") from None
    try:
        body = json.loads(text)
    except RecursionError:
        body = None
        deep = True
    except ValueError as e:   # includes an integer of more digits than Python converts
        raise BadRequest(f"the request body is not JSON ({str(e)[:200]}).") from None
    else:
        deep = (text.count("[") + text.count("{") > MAX_DEPTH) and too_deep(body)
    if deep:
        raise BadRequest(f"the request body nests lists and objects more than {MAX_DEPTH} "
                         f"levels deep.")
    return body
