"""Agent environments, tool-call parsing and the multi-turn rollout loop (rossjax/agents)."""

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rossjax.agents import Environment, Observation, ToolCall, make_env
from rossjax.agents.builtin import evaluate
from rossjax.agents.corpus import load_corpus
from rossjax.agents.parse import parse_tool_calls
from rossjax.agents.rollout import OpenAIPolicy, run_episode
from rossjax.curate import compile_rollout
from rossjax.curate.schema import validate_record
from rossjax.errors import InputError
from rossjax.tokenizers import load_tokenizer


class Scripted:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1 that answers `replies` in order
    and records every request body."""

    def __init__(self, replies):
        self.replies, self.bodies = list(replies), []
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                r = outer.replies.pop(0)
                msg = r if isinstance(r, dict) else {"role": "assistant", "content": r}
                lp = [{"token": "token_id:7", "logprob": -0.5}, {"token": "token_id:9", "logprob": -1.25}]
                data = json.dumps({"choices": [{"index": 0, "message": msg,
                                                "logprobs": {"content": lp}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, args=(0.01,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/v1"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def call(name, **args):
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


def test_calculator_reset_step_and_evaluate():
    env = make_env("calculator")
    msgs = env.reset({"prompt": "What is 17 * 23?", "answer": "391"})
    assert [m["role"] for m in msgs] == ["system", "user"]
    obs, done, verdict = env.step([ToolCall("calculate", {"expression": "17*23"}, "c0")])
    assert (obs[0].content, obs[0].tool_call_id, done, verdict) == ("391", "c0", False, None)
    assert env.finish("Answer: 391").passed is True and env.finish("Answer: 390").passed is False
    bad = env.step([ToolCall("calculate", {"expression": "__import__('os')"}), ToolCall("nope", {})])
    assert "unsupported syntax" in bad[0][0].content and "unknown tool 'nope'" in bad[0][1].content
    assert evaluate("2**10 - (3 % 2)") == 1023
    with pytest.raises(ValueError):
        evaluate("9**99999")


def test_python_env_runs_in_the_sandbox():
    env = make_env("python", step_timeout_s=5)
    env.reset({"prompt": "sum 1..10", "answer": 55})
    obs, done, _ = env.step([ToolCall("python", {"code": "print(sum(range(11)))"}, "c")])
    assert obs[0].content.strip() == "55" and not done
    obs, _, _ = env.step([ToolCall("python", {"code": "import socket; socket.socket().connect(('127.0.0.1', 1))"})])
    assert "[" in obs[0].content  # refused by the sandbox: its reason is in the observation
    # the loop burns its whole timeout: a 1 s one shows the same (the env above keeps 5 s so
    # that a loaded machine's interpreter start-up is never mistaken for a timeout)
    env = make_env("python", step_timeout_s=1)
    env.reset({"prompt": "loop", "answer": 0})
    obs, _, _ = env.step([ToolCall("python", {"code": "while True: pass"})])
    assert "timeout" in obs[0].content.lower()


@pytest.fixture
def corpus(tmp_path):
    p = tmp_path / "docs.jsonl"
    docs = [{"id": "paris", "title": "France", "text": "The capital of France is Paris.\nIt is on the Seine."},
            {"id": "xla", "text": "JAX compiles array programs with the XLA compiler."},
            {"id": "banana", "text": "Bananas are yellow fruit rich in potassium."}]
    p.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    return p


def test_corpus_bm25_search_open_extract(corpus):
    env = make_env("corpus", path=str(corpus))
    env.reset({"prompt": "What river?", "answer": "Seine"})
    obs, _, _ = env.step([ToolCall("search", {"query": "which compiler does jax use"}),
                          ToolCall("open", {"id": "paris"}),
                          ToolCall("extract", {"id": "paris", "pattern": "seine"}),
                          ToolCall("open", {"id": "missing"})])
    assert obs[0].content.splitlines()[0].startswith("xla (")
    assert obs[1].content.startswith("The capital") and obs[2].content == "It is on the Seine."
    assert "no document with id 'missing'" in obs[3].content
    assert env.finish("Answer: Seine").passed is True


def test_corpus_refuses_bad_lines(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl row 2: field 'id' 'a' repeats"):
        load_corpus(p)
    p.write_text('{"id": "a"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl row 1: field 'text' must be a string"):
        load_corpus(p)
    p.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": \n')
    with pytest.raises(InputError, match=r"bad.jsonl row 2: line is not valid JSON"):
        load_corpus(p)


def test_registry_and_module_class():
    got = make_env("tests.test_agents:Sleepy", step_timeout_s=1.0)  # imported anew by name
    assert type(got).__name__ == "Sleepy" and got.step_timeout_s == 1.0
    with pytest.raises(InputError, match="neither one of"):
        make_env("nonesuch")
    with pytest.raises(InputError, match="not a subclass"):
        make_env("json:dumps")


def test_parse_hermes_and_react():
    calls, errs = parse_tool_calls('hi <tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert [(c.name, c.arguments, c.id) for c in calls] == [("f", {"a": 1}, "call_0")] and not errs
    calls, errs = parse_tool_calls("<tool_call>{bad</tool_call><tool_call>{\"name\": \"g\"}")
    assert not calls and "not JSON" in errs[0] and "never closed" in errs[1]
    calls, _ = parse_tool_calls("Thought: add\nAction: calculate[2+3]", "react", 4, "expression")
    assert (calls[0].name, calls[0].arguments, calls[0].id) == ("calculate", {"expression": "2+3"}, "call_4")
    calls, _ = parse_tool_calls('Action: search\nAction Input: {"query": "q"}\nObservation:', "react")
    assert calls[0].arguments == {"query": "q"}
    assert "no Action Input" in parse_tool_calls("Action: search", "react")[1][0]


def test_multi_turn_episode_over_an_openai_endpoint_compiles_in_curate():
    srv = Scripted([call("calculate", expression="61+65"), call("calculate", expression="126*2"),
                    "The sum is 126, doubled 252.\nAnswer: 252"])
    try:
        env = make_env("calculator")
        row = run_episode(env, {"id": "t0", "prompt": "61+65, doubled?", "answer": "252"},
                          OpenAIPolicy(srv.url, "m"), rid="ep0")
    finally:
        srv.close()
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [row["messages"][i]["content"] for i in (3, 5)] == ["126", "252"]
    assert row["messages"][3]["tool_call_id"] == row["messages"][2]["tool_calls"][0]["id"]
    assert row["verifier"]["passed"] is True and row["reward"] == 1.0
    assert row["agent"]["stop"] == "answered" and row["agent"]["turns"] == 3
    assert row["agent"]["logprobs"]["2"] == [-0.5, -1.25]
    assert row["agent"]["token_ids"]["4"] == [7, 9] and srv.bodies[0]["return_tokens_as_token_ids"]
    assert len(srv.bodies) == 3 and srv.bodies[2]["messages"][-1]["role"] == "tool"
    assert srv.bodies[0]["tools"][0]["function"]["name"] == "calculate"
    assert validate_record(row) is None
    ex = compile_rollout(row, load_tokenizer("qwen"), template="chatml")
    assert ex.status == "kept", ex.detail
    assert ex.n_supervised > 0 and len(ex.turn_spans) == 3


def test_malformed_call_is_an_observation():
    srv = Scripted(["<tool_call>{not json}</tool_call>", {"role": "assistant", "content": None,
                    "tool_calls": [{"id": "x1", "type": "function",
                                    "function": {"name": "calculate", "arguments": "{oops"}}]},
                    "Answer: 5"])
    try:
        row = run_episode(make_env("calculator"), {"prompt": "2+3?", "answer": 5},
                          OpenAIPolicy(srv.url, "m"), rid="ep1")
    finally:
        srv.close()
    tools = [m for m in row["messages"] if m["role"] == "tool"]
    assert len(tools) == 2 and all(t["content"].startswith("error: malformed tool call") for t in tools)
    assert row["verifier"]["passed"] is True and validate_record(row) is None


@dataclass
class Sleepy(Environment):
    name: str = "sleepy"
    step_timeout_s: float = 0.3

    def reset(self, task):
        return [{"role": "user", "content": task["prompt"]}]

    def step(self, calls):
        time.sleep(2)
        return [Observation("late")], False, None


def test_step_over_its_limit_ends_the_episode():
    srv = Scripted([call("anything")])
    try:
        t0 = time.monotonic()
        row = run_episode(Sleepy(), {"prompt": "go"}, OpenAIPolicy(srv.url, "m"), rid="ep2")
        took = time.monotonic() - t0
    finally:
        srv.close()
    assert took < 1.5 and row["agent"]["stop"] == "done"
    assert "longer than" in row["messages"][-1]["content"]
    assert row["verifier"]["passed"] is False and "over its" in row["verifier"]["evidence"]


def test_max_turns_and_window():
    srv = Scripted([call("calculate", expression=f"{i}+1") for i in range(3)])
    try:
        row = run_episode(make_env("calculator"), {"prompt": "loop", "answer": 1},
                          OpenAIPolicy(srv.url, "m"), rid="ep3", max_turns=3, window=2)
    finally:
        srv.close()
    assert row["agent"]["stop"] == "max_turns" and len(row["messages"]) == 8
    assert [m["role"] for m in srv.bodies[2]["messages"]] == ["system", "user", "assistant", "tool"]
    assert row["verifier"]["passed"] is None
