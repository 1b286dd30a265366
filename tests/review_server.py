"""A scripted chat-completions server for the reviewer tests (http.server in a thread, HTTP/1.1
keep-alive like vLLM or OpenAI).

The script maps a rollout id (read from the "Rollout id: ..." line every request carries) to its
answers, consumed in order whatever the stage; `default(rid, body)` answers the rest. An answer
is a string (the assistant text), a dict {"content", "finish_reason"}, (status, body) for an HTTP
error, a `Raw` (writes the bytes of the response itself: a hostile server), or a callable(body)
returning one of these. Every request is recorded with the stage its last user message asks for.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Raw:
    """An answer written byte for byte: `parts` (bytes, or seconds to sleep) in order, then the
    connection is closed. `sent` counts the bytes the client took before it hung up."""

    def __init__(self, *parts):
        self.parts, self.sent = parts, 0

    def write(self, wfile):
        try:
            for p in self.parts:
                if isinstance(p, (int, float)):
                    time.sleep(p)
                    continue
                wfile.write(p)
                wfile.flush()
                self.sent += len(p)
        except OSError:
            pass  # the client hung up: what a hostile server sees when the client gives up


def completion(content, usage='{"prompt_tokens": 3, "completion_tokens": 2}') -> bytes:
    """A chat-completion body with `content` and a raw `usage` JSON text (NaN allowed)."""
    return (b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0, '
            b'"finish_reason": "stop", "message": {"role": "assistant", "content": '
            + json.dumps(content).encode() + b'}}], "usage": ' + usage.encode() + b"}")


def http_200(body: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\n"
            b"Content-Length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def drip(data: bytes, every_s: float, n: int = 1) -> Raw:
    """`data` sent n bytes at a time, `every_s` apart (each read is quick; the whole is not)."""
    parts = []
    for i in range(0, len(data), n):
        parts += [data[i:i + n], every_s]
    return Raw(*parts)

_MARKERS = (("Your answer failed a check", "retry"), ("REPAIR.", "repair"), ("AUDIT.", "audit"),
            ("PROPOSAL.", "proposal"), ("SEMANTIC ERROR DISCOVERY.", "discovery"),
            ("BOUNDARY LOCALIZATION", "localization"))


def stage_of(body) -> str:
    last = body["messages"][-1]["content"]
    return next((name for key, name in _MARKERS if key in last), "?")


def rollout_id(body) -> str:
    text = body["messages"][1]["content"]
    return text.split("Rollout id: ", 1)[1].split("\n", 1)[0] if "Rollout id: " in text else "?"


class Reviewer:
    def __init__(self, script=None, default=None, on_request=None, id_of=None, stage_fn=None):
        # id_of / stage_fn (body -> str): how another command's prompts name the row and the
        # stage (default: review's "Rollout id:" line and stage markers)
        id_of, stage_fn = id_of or rollout_id, stage_fn or stage_of
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.default = default
        self.on_request = on_request  # callable(n_requests_so_far, body) -> bool: answer it?
        self.requests = []  # (rollout id, stage, body, headers)
        self.answered = []  # bodies that got a 200 answer
        self.ports = set()  # client ports seen: one per TCP connection
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                assert self.path == "/v1/chat/completions", self.path
                rid = id_of(body)
                with outer.lock:
                    if outer.on_request is not None and not outer.on_request(len(outer.requests),
                                                                             body):
                        self.close_connection = True
                        return
                    outer.ports.add(self.client_address[1])
                    outer.requests.append((rid, stage_fn(body), body, dict(self.headers)))
                    todo = outer.script.get(rid)
                    ans = todo.pop(0) if todo else outer.default(rid, body)
                if callable(ans) and not isinstance(ans, Raw):
                    ans = ans(body)
                if isinstance(ans, Raw):
                    self.close_connection = True
                    ans.write(self.wfile)
                    return
                if isinstance(ans, tuple):
                    status, payload = ans
                    data = json.dumps(payload).encode()
                else:
                    status = 200
                    if isinstance(ans, str):
                        ans = {"content": ans}
                    content = ans["content"]
                    data = json.dumps({
                        "id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                        "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": ans.get("finish_reason", "stop"),
                                     "message": {"role": "assistant", "content": content}}],
                        "usage": {"prompt_tokens": len(raw) // 4,
                                  "completion_tokens": len(content or "") // 4,
                                  "total_tokens": len(raw) // 4 + len(content or "") // 4}}).encode()
                    with outer.lock:
                        outer.answered.append(body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        # poll for shutdown every 10 ms, not serve_forever's 0.5 s: a test ends that much sooner
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)

    def stages(self, rid=None) -> list[str]:
        return [s for r, s, _, _ in self.requests if rid is None or r == rid]

    def bodies(self, rid=None, stage=None) -> list[dict]:
        return [b for r, s, b, _ in self.requests
                if (rid is None or r == rid) and (stage is None or s == stage)]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def as_json(obj) -> str:
    return json.dumps(obj)
