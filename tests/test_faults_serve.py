"""Hostile input to `rossjax serve` (issue 36, item 9) over real HTTP on 127.0.0.1: every bad
request is a 4xx with a JSON error, never a 500 or a 200 on nonsense; `--api_key` refuses a
request without `Authorization: Bearer KEY` (401) as vLLM's `--api-key` does; and what a remote
environment's worker answers in the wrong shape is one clear error, not a crash.

One server for the whole module (its start-up costs compile time); most cases never reach the
engine. This module's top level stays jax-free: env workers import it to build BadEnv."""

from __future__ import annotations

import gzip
import http.client
import json
import time
from dataclasses import dataclass, field

import pytest

from rossjax.agents import Environment, Observation, ToolCall
from rossjax.verify.verdict import Verdict

KEY = "sk-test-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 1 << 20
MSGS = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    from test_serve import write_tiny_model

    from rossjax import serve

    path = write_tiny_model(tmp_path_factory.mktemp("serve_model"))
    server = serve.build(path, slots=4, max_len=96, chunk=4)
    url, stop = serve.start_background(server, api_key=KEY, max_body=MAX_BODY)
    yield server, int(url.rsplit(":", 1)[1].split("/")[0]), url
    stop()


def _send(port, path, body=b"", headers=None, method="POST"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        h = {"Content-Type": "application/json", **AUTH, **(headers or {})}
        h = {k: v for k, v in h.items() if v is not None}
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        raw = r.read()
    finally:
        conn.close()
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    return r.status, doc, raw


def _chat(**kw):
    return json.dumps({"messages": MSGS, "max_tokens": 2, **kw}).encode()


def _raw(field: bytes) -> bytes:
    """A chat body with `field` written as raw JSON text (NaN, Infinity, a 5000-digit int)."""
    return _chat().replace(b'"max_tokens": 2', field)


DEEP = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
BAD = [  # (path, body bytes, extra headers, status, what the error message must name)
    ("chat/completions", _chat(messages=[{"role": "user", "content": [{"type": "text",
                                                                       "text": 5}]}]),
     None, 400, "messages[0].content[0].text"),
    ("chat/completions", _chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
     None, 400, "messages[0].content[0].text"),
    ("chat/completions", b"[" * 100_000 + b"]" * 100_000, None, 400, "deep"),
    ("chat/completions", DEEP, None, 400, "deep"),
    ("chat/completions", _raw(b'"temperature": NaN'), None, 400, "temperature"),
    ("chat/completions", _raw(b'"temperature": Infinity'), None, 400, "temperature"),
    ("chat/completions", _raw(b'"top_p": NaN'), None, 400, "top_p"),
    ("chat/completions", _raw(b'"top_p": -Infinity'), None, 400, "top_p"),
    ("chat/completions", _chat(temperature=1e999), None, 400, "temperature"),  # json reads inf
    ("chat/completions", _chat(max_tokens=-5), None, 400, "max_tokens"),
    ("chat/completions", _chat(max_tokens=10**30), None, 400, "max_tokens"),
    ("chat/completions", _chat(max_tokens=1e999), None, 400, "max_tokens"),
    ("chat/completions", _chat(n=10**30), None, 400, "'n'"),
    ("chat/completions", _chat(n=-1), None, 400, "'n'"),
    ("chat/completions", _raw(b'"n": 1' + b"0" * 5000), None, 400, "JSON"),    # ValueError
    ("chat/completions", _chat(seed=1.5), None, 400, "seed"),
    ("chat/completions", _chat(stream="yes"), None, 400, "stream"),
    ("chat/completions", _chat(messages=[{"role": "user", "content": "\ud800"}]), None, 400,
     "messages[0].content"),
    ("chat/completions", _chat(stop="\udfff"), None, 400, "stop"),
    ("chat/completions", b"[]", None, 400, "object"),
    ("chat/completions", b'"hi"', None, 400, "object"),
    ("chat/completions", b"null", None, 400, "object"),
    ("chat/completions", b"", None, 400, "JSON"),
    ("chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', None, 400,
     "UTF-8"),
    ("chat/completions", _chat(), {"Content-Type": "text/plain"}, 415, "application/json"),
    ("chat/completions", _chat(), {"Content-Type": "application/x-www-form-urlencoded"}, 415,
     "application/json"),
    ("chat/completions", _chat(), {"Content-Type": "application/json; charset=bogus-8"}, 415,
     "charset"),
    ("chat/completions", b'{"messages": "' + b"x" * (MAX_BODY + 10) + b'"}', None, 413, "bytes"),
    # 8 KB that inflate to 8 MB: the cap counts the bytes after Content-Encoding
    ("chat/completions", gzip.compress(b'{"messages": "' + b"x" * (8 << 20) + b'"}'),
     {"Content-Encoding": "gzip"}, 413, "bytes"),
    ("completions", json.dumps({"prompt": "\ud800"}).encode(), None, 400, "prompt"),
    ("completions", json.dumps({"prompt": [[1, "x"]]}).encode(), None, 400, "prompt"),
    ("completions", json.dumps({"prompt": "ab", "temperature": 1e999}).encode(), None, 400,
     "temperature"),
    ("completions", b"[" * 100_000, None, 400, "deep"),
]


@pytest.mark.parametrize("where, body, headers, status, says", BAD,
                         ids=[f"{i}-{b[3]}-{b[4]}" for i, b in enumerate(BAD)])
def test_bad_input_is_a_4xx_with_a_json_error(keyed, where, body, headers, status, says):
    _, port, _ = keyed
    got, doc, raw = _send(port, f"/v1/{where}", body, headers)
    assert got == status, raw[:300]
    assert doc["error"]["type"] == "invalid_request_error" and says in doc["error"]["message"]


def test_a_bad_request_leaves_the_server_serving(keyed):
    """After every hostile case above, a good request (and one with a huge seed) still answers."""
    server, port, _ = keyed
    got, doc, raw = _send(port, "/v1/chat/completions", _chat(seed=10**30, temperature=0.5))
    assert got == 200, raw[:300]
    assert doc["choices"][0]["finish_reason"] in ("stop", "length")
    assert "\x00" not in doc["choices"][0]["message"]["content"]


@pytest.mark.parametrize("headers", [
    {"Authorization": None},
    {"Authorization": "Bearer wrong"},
    {"Authorization": f"Basic {KEY}"},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer \xff\xfe"},                          # bytes no key has
    {"Authorization": f"Bearer {KEY}x"},
    {"Authorization": f"Bearer {KEY[:-1]}"},
])
def test_without_the_key_every_v1_path_is_a_401(keyed, headers):
    _, port, _ = keyed
    for method, path, body in (("POST", "/v1/chat/completions", _chat()),
                               ("POST", "/v1/completions", b"[" * 100_000),  # 401 before parsing
                               ("GET", "/v1/models", b"")):
        got, doc, raw = _send(port, path, body, headers, method)
        assert got == 401, (path, raw[:300])
        assert "API key" in doc["error"]["message"]


def test_the_openai_client_with_the_key_is_served_and_without_it_refused(keyed):
    import openai

    server, port, url = keyed
    ok = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=120)
    assert [m.id for m in ok.models.list().data] == [server.model_id]
    r = ok.chat.completions.create(model=server.model_id, messages=MSGS, max_tokens=2,
                                   temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    bad = openai.OpenAI(base_url=url, api_key="not-it", max_retries=0, timeout=120)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=server.model_id, messages=MSGS, max_tokens=2)
    # like vLLM: paths outside /v1 (the health probe) need no key
    assert _send(port, "/health", method="GET", headers={"Authorization": None})[0] == 200


def test_serve_warns_on_a_public_host_without_a_key(monkeypatch, capsys):
    from rossjax import serve
    from rossjax.cli import serve as cli

    seen = []

    class Fake:
        model_id, template = "m", "chatml"

    monkeypatch.setattr(serve, "build", lambda *a, **k: Fake())
    monkeypatch.setattr(serve, "serve", lambda s, host, port, **kw: seen.append((host, kw)))
    monkeypatch.delenv("ROSSJAX_API_KEY", raising=False)
    cli.main(["--model=m", "--host=0.0.0.0"])
    err = capsys.readouterr().err
    assert "warning" in err and "--api_key" in err and seen[-1] == ("0.0.0.0", {"api_key": None})
    for host in ("127.0.0.1", "localhost", "::1"):
        cli.main(["--model=m", f"--host={host}"])
        assert "warning" not in capsys.readouterr().err
    cli.main(["--model=m", "--host=0.0.0.0", "--api_key=s3cret"])
    err = capsys.readouterr().err
    assert "warning" not in err and "s3cret" not in err and seen[-1][1] == {"api_key": "s3cret"}
    monkeypatch.setenv("ROSSJAX_API_KEY", "from-env")
    cli.main(["--model=m", "--host=10.0.0.5"])
    err = capsys.readouterr().err
    assert "warning" not in err and "from-env" not in err
    assert seen[-1] == ("10.0.0.5", {"api_key": "from-env"})



def test_a_local_server_never_inherits_the_users_api_key(monkeypatch, tmp_path):
    """LocalServer's clients send no key, so the server it starts must not take one from the
    user's ROSSJAX_API_KEY (every :runlocal run would wait for a 401 until its start-up limit)."""
    from rossjax.reconstruct import local

    envs = []

    class Proc:
        returncode = 3

        def __init__(self, cmd, env, **kw):
            envs.append(env)

        def poll(self):
            return 3

    monkeypatch.setenv("ROSSJAX_API_KEY", "users-key")
    monkeypatch.setattr(local.subprocess, "Popen", Proc)
    with pytest.raises(Exception):
        with local.LocalServer("m", str(tmp_path / "log"), max_len=64, slots=1, where="t"):
            pass
    assert envs and "ROSSJAX_API_KEY" not in envs[0]

# -- a remote environment whose worker answers in the wrong shape --------------------------------

@dataclass
class BadEnv(Environment):
    """Answers by task id with something an Environment must not return."""

    name: str = "bad"
    tools: list = field(default_factory=list)

    def reset(self, task):
        self.task = task["id"]
        return {"reset-dict": {"role": "user"}, "reset-str": "hello",
                "reset-items": [{"role": "user", "content": 5}]}.get(
            self.task, [{"role": "user", "content": "go"}])

    def step(self, calls):
        return {"none": None, "pair": ([], False), "str-obs": (["text"], False, None),
                "obs-int": ([Observation(5)], False, None), "done-str": ([], "no", None),
                "verdict-str": ([], True, "passed"), "obs-dict": ({}, False, None),
                }.get(self.task, ([Observation("ok", calls[0].id)], False, None))

    def finish(self, text):
        return {"none": True}.get(self.task, Verdict(True, "fine"))


def _remote():
    from rossjax.agents.remote import RemoteEnv

    @dataclass
    class Spec:
        env: str = "test_faults_serve:BadEnv"
        step_timeout_s: float = 30.0
        episode_timeout_s: float = 120.0

        def kwargs(self):
            return {}

    return RemoteEnv(Spec())


def test_a_remote_env_that_answers_in_the_wrong_shape_is_one_clear_error():
    from rossjax.errors import InputError

    env = _remote()
    try:
        for tid in ("reset-dict", "reset-str", "reset-items"):
            with pytest.raises(InputError, match=f"reset of task '{tid}' returned"):
                env.reset({"id": tid})
        calls = [ToolCall("probe", {}, "c0")]
        for tid in ("none", "pair", "str-obs", "obs-int", "done-str", "verdict-str", "obs-dict"):
            assert env.reset({"id": tid}) == [{"role": "user", "content": "go"}]
            obs, done, verdict = env.step(calls, time.monotonic() + 60)
            assert done is True and verdict.passed is None, tid
            assert "step returned" in verdict.evidence and len(obs) == 1, tid
            assert isinstance(obs[0], Observation) and obs[0].tool_call_id == "c0", tid
            assert obs[0].content.startswith("error: the environment's step returned"), tid
        env.reset({"id": "none"})
        v = env.finish("answer", time.monotonic() + 60)
        assert isinstance(v, Verdict) and v.passed is None and "finish returned" in v.evidence
        # a well-formed env through the same worker still works
        env.reset({"id": "good"})
        obs, done, verdict = env.step(calls, time.monotonic() + 60)
        assert obs[0].content == "ok" and (done, verdict) == (False, None)
        assert env.finish("answer", time.monotonic() + 60).passed is True
    finally:
        env.shutdown()
