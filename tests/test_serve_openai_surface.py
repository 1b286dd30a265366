"""Issue 42 items 2-3: rossjax's own clients and the OpenAI surface users expect, against a real
`rossjax serve` on 127.0.0.1 at its default --max_len (2048), started once for the module.

Review's and reconstruct's clients (max_tokens 2048) and an endpoint solver (4096) with their
default settings get answers: /v1/models carries max_model_len and the client lowers max_tokens
to what the prompt leaves, with one note naming its own command (was: HTTP 400 "'max_tokens' is
2048; it must be in [1, 512]" on every request, "reviewer endpoint" inside reconstruct). The
server's 400 for a limit that cannot fit names --max_len; /health, /tokenize and /detokenize
answer as vLLM's do."""

import json
import os
import urllib.error
import urllib.request

import jax
import ml_collections
import numpy as np
import openai
import pytest
from test_reconstruct import ARTIFACTS, CORPUS
from test_review import config as review_config
from test_serve import MSGS, write_tiny_model

from rossjax import serve
from rossjax.configs import reconstruct as rc_config
from rossjax.openai_api import ChatError
from rossjax.reconstruct import run as rc_run
from rossjax.review.run import make_client
from rossjax.train.propel.solvers import Solver


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("surface_model"))
    server = serve.build(path, slots=4)     # rossjax serve's default --max_len
    url, stop = serve.start_background(server)
    yield server, url, path
    stop()


def http(url, body=None, method=None):
    """(status, parsed JSON or text) of one raw request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def root(url):
    return url[:-len("/v1")]


def test_models_carry_max_model_len_and_health_answers(served):
    server, url, _ = served
    status, obj = http(url + "/models")
    assert status == 200 and obj["data"][0]["max_model_len"] == server.engine.max_len == 2048
    assert http(root(url) + "/health")[0] == 200


def test_review_client_with_default_settings_gets_answers(served, tmp_path, capsys):
    server, url, _ = served
    cfg = review_config(tmp_path / "in.jsonl", url)
    cfg.endpoint.model = server.model_id
    assert cfg.endpoint.max_tokens == 2048          # review's default, as shipped
    client = make_client(cfg, str(tmp_path / "cache"))
    replies = [client.ask([{"role": "user", "content": f"Review rollout {i}."}]) for i in range(2)]
    assert all(r.text and r.finish_reason in ("stop", "length") for r in replies)
    err = capsys.readouterr().err
    assert err.count("note: reviewer endpoint") == 1 and "max_model_len=2048" in err
    entry = json.load(open(next((tmp_path / "cache").rglob("*.json"))))
    assert entry["request"]["max_tokens"] == 2048 - replies[0].usage["prompt_tokens"] or \
        entry["request"]["max_tokens"] == 2048 - replies[1].usage["prompt_tokens"]


def test_reconstruct_client_names_reconstruct_and_gets_answers(served, tmp_path, capsys):
    server, url, _ = served
    cfg = rc_config.get_config()
    cfg.endpoint.base_url, cfg.endpoint.model = url, server.model_id
    cfg.input, cfg.corpus, cfg.progress = ARTIFACTS, CORPUS, False
    assert cfg.endpoint.max_tokens == 2048
    client = rc_run.ReconstructRun(cfg, str(tmp_path / "rc")).client
    reply = client.ask([{"role": "user", "content": "Plan the reconstruction."}], stage="plan")
    assert reply.text and reply.finish_reason in ("stop", "length")
    err = capsys.readouterr().err
    assert "note: reconstruct endpoint" in err and "reviewer" not in err
    with pytest.raises(ChatError) as e:
        client.ask([{"role": "wizard", "content": "x"}], stage="plan")
    assert str(e.value).startswith("reconstruct endpoint") and "reviewer" not in str(e.value)


def test_endpoint_solver_with_default_settings_gets_answers(served):
    server, url, _ = served
    section = ml_collections.ConfigDict({"kind": "endpoint", "endpoint": {
        "base_url": url, "model": server.model_id, "max_retries": 0}})
    solver = Solver(section, None, ml_collections.ConfigDict({}), field="config.solver")
    got = solver.answers([{"id": "t0", "prompt": "What is 1+1?", "domain": "math"}], 2, seed=3)
    assert solver.errors == [] and all(isinstance(t, str) for t in got[0])


def test_a_limit_that_cannot_fit_is_a_400_naming_max_len(served):
    server, url, _ = served
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model_id, messages=MSGS, max_tokens=2048)
    msg = e.value.message
    assert "--max_len=2048 minus the prompt" in msg and "max_model_len" in msg
    # within max_model_len minus the prompt: served (the bucket padding only ends it early)
    n = http(root(url) + "/tokenize", {"model": server.model_id, "messages": MSGS})[1]["count"]
    r = client.chat.completions.create(model=server.model_id, messages=MSGS,
                                       max_tokens=2048 - n, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_tokenize_and_detokenize_as_vllm(served):
    server, url, _ = served
    status, obj = http(root(url) + "/tokenize", {"model": server.model_id, "prompt": "abc"})
    assert status == 200 and obj["tokens"] == server.tok.encode("abc")
    assert obj["count"] == 3 and obj["max_model_len"] == 2048
    status, chat = http(root(url) + "/tokenize", {"model": server.model_id, "messages": MSGS})
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(model=server.model_id, messages=MSGS, max_tokens=1)
    assert status == 200 and chat["count"] == r.usage.prompt_tokens == len(chat["tokens"])
    status, back = http(root(url) + "/detokenize", {"model": server.model_id,
                                                   "tokens": obj["tokens"]})
    assert status == 200 and back == {"prompt": "abc"}
    status, bad = http(root(url) + "/detokenize", {"model": server.model_id, "tokens": ["x"]})
    assert status == 400 and bad["error"]["param"] == "tokens"


def test_serve_a_run_workdir_as_generate_loads_it(served, tmp_path):
    """--model=RUN_WORKDIR serves the run's latest checkpoint with the run's tokenizer and
    template (was: "config.json: field 'model_type' is None", the run's config read as HF's)."""
    from rossjax.models import load_hf
    from rossjax.models.hf import read_hf_config
    from rossjax.train import checkpoint as ckpt_lib

    server, url, path = served
    run = tmp_path / "run"
    os.makedirs(run)
    ckpt_lib.write_model_config(str(run), read_hf_config(path))
    json.dump({"template": "chatml", "model": {"path": path}}, open(run / "config.json", "w"))
    ck = ckpt_lib.Checkpointer(str(run / "checkpoints"), async_save=False)
    zeros = jax.tree.map(np.zeros_like, load_hf(path)[1])
    ck.save(1, {"params": zeros}, force=True)      # an older step: not the one served
    ck.save(2, {"params": load_hf(path)[1]}, force=True)
    ck.close()
    from_run = serve.build(str(run), slots=1, max_len=128, chunk=4)
    run_url, stop = serve.start_background(from_run)
    try:
        kw = dict(messages=MSGS, max_tokens=8, temperature=0)
        c_run = openai.OpenAI(base_url=run_url, api_key="none", max_retries=0, timeout=120)
        c_hf = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
        got = c_run.chat.completions.create(model="run", **kw)
        want = c_hf.chat.completions.create(model=server.model_id, **kw)
    finally:
        stop()
    assert from_run.model_id == "run" and from_run.template == "chatml"
    assert got.choices[0].message.content == want.choices[0].message.content
    # the same counts (cached_tokens aside: the HF server's prefix cache already holds MSGS)
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == \
        (want.usage.prompt_tokens, want.usage.completion_tokens)


def test_response_format_json_is_a_clear_400(served):
    server, url, _ = served
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model_id, messages=MSGS, max_tokens=4,
                                       response_format={"type": "json_object"})
    assert "response_format" in e.value.message and "not supported" in e.value.message
    r = client.chat.completions.create(model=server.model_id, messages=MSGS, max_tokens=2,
                                       response_format={"type": "text"})
    assert r.choices[0].finish_reason in ("stop", "length")


def sse_events(url, body) -> list[str]:
    """The `data:` payloads of a raw SSE response, in order; every event is `data: ...` and
    a blank line, nothing else."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("\n\n")
    events = raw[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events[:3]
    return [e[len("data: "):] for e in events]


@pytest.mark.parametrize("chat", [True, False])
def test_raw_sse_stream_is_well_formed_and_ends_with_done(served, chat):
    server, url, _ = served
    body = {"model": server.model_id, "max_tokens": 6, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    body.update({"messages": MSGS} if chat else {"prompt": "abc"})
    events = sse_events(url + ("/chat/completions" if chat else "/completions"), body)
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = [json.loads(e) for e in events[:-1]]
    want = "chat.completion.chunk" if chat else "text_completion"
    assert all(c["object"] == want and c["model"] == server.model_id for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    *parts, usage = chunks
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1
    assert all(len(c["choices"]) == 1 and c["choices"][0]["index"] == 0 for c in parts)
    reasons = [c["choices"][0]["finish_reason"] for c in parts]
    assert reasons[-1] in ("stop", "length") and all(r is None for r in reasons[:-1])
    if chat:
        assert parts[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in parts)
    else:
        text = "".join(c["choices"][0]["text"] for c in parts)
    full = dict(body, stream=False)
    full.pop("stream_options")
    _, whole = http(url + ("/chat/completions" if chat else "/completions"), full)
    c0 = whole["choices"][0]
    assert text == (c0["message"]["content"] if chat else c0["text"])


TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                           "parameters": {"type": "object", "properties": {
                                               "word": {"type": "string"}}}}}]
TOOL_TURNS = MSGS + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_7", "type": "function",
         "function": {"name": "lookup", "arguments": "{\"word\": \"zebra\"}"}}]},
    {"role": "tool", "tool_call_id": "call_7", "content": "a striped horse"}]


def test_tools_and_tool_turns_are_rendered_by_the_template(served):
    """`tools`, an assistant turn of content null + tool_calls and a tool turn with its
    tool_call_id are accepted and rendered (was: 400 "messages[2].content must be a string")."""
    from rossjax.templates import render_prompt

    server, url, _ = served
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(model=server.model_id, messages=TOOL_TURNS, tools=TOOLS,
                                       max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    status, tok = http(root(url) + "/tokenize", {"model": server.model_id,
                                                 "messages": TOOL_TURNS, "tools": TOOLS})
    text = server.tok.decode(tok["tokens"])
    assert status == 200 and tok["count"] == r.usage.prompt_tokens
    assert '"name": "lookup"' in text and '"word": "zebra"' in text and "a striped horse" in text
    assert "Look a word up." in text       # the tools, in the system turn
    turns = [dict(m, content=m["content"] or "") for m in TOOL_TURNS]
    assert text == render_prompt(turns, server.template, server.tok, tools=TOOLS)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model_id, max_tokens=2, messages=MSGS + [
            {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": 3}}]}])
    assert "messages[2].tool_calls" in e.value.message


def test_hermes_calls_in_an_answer_are_tool_calls():
    from rossjax.serve.tools import answer_message

    text = 'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "zebra"}}\n' \
           '</tool_call>'
    msg, reason = answer_message(text, "stop", TOOLS)
    assert reason == "tool_calls" and msg["content"] == "Let me look."
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "lookup"
    assert json.loads(call["function"]["arguments"]) == {"word": "zebra"}
    assert answer_message(text, "stop", None) == ({"role": "assistant", "content": text}, "stop")
    broken = text.replace("</tool_call>", "")        # a malformed call stays text
    assert answer_message(broken, "length", TOOLS)[1] == "length"
