"""Tool calling on `rossjax serve`'s chat endpoint, as OpenAI's and vLLM's (`--tool-call-parser
hermes`): a request's `tools` are rendered into the prompt by the template, assistant turns may
hold `content: null` plus `tool_calls`, `tool` turns carry `tool_call_id`, and an answer's
hermes calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, what the chatml and
Qwen templates teach; rossjax.agents.parse) come back as `message.tool_calls` with
finish_reason "tool_calls". Streamed answers carry the raw text: calls are parsed in
non-streamed replies only.
"""

from __future__ import annotations

import json
import uuid

from rossjax.agents.parse import parse_structured, parse_tool_calls
from rossjax.serve import guard
from rossjax.serve.guard import BadRequest


def request_tools(body) -> list | None:
    """The request's `tools` (function tools), None when absent or tool_choice is "none"."""
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type", "function") == "function"
            and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) and t["function"]["name"]
            for t in tools):
        raise BadRequest("'tools' must be a list of {type: 'function', function: {name, "
                         "description, parameters}} objects.", "tools")
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none", "required") and not isinstance(choice, dict):
        raise BadRequest(f"'tool_choice' {guard.show(choice)} must be auto, none, required or "
                         f"a function.", "tool_choice")
    return None if choice == "none" else tools


def message_fields(i: int, m: dict, content) -> dict:
    """The template's message for messages[i]: content ("" for a null content beside
    tool_calls), an assistant's checked tool_calls, a tool turn's tool_call_id and name."""
    role = "system" if m["role"] == "developer" else m["role"]
    calls = m.get("tool_calls")
    if content is None and role == "assistant" and calls:
        content = ""
    if not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content must be a string (null only beside an "
                         f"assistant's tool_calls).", f"messages[{i}].content")
    out = {"role": role, "content": guard.text(content, f"messages[{i}].content")}
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise BadRequest(f"messages[{i}].tool_calls must be a list, on an assistant turn.",
                             f"messages[{i}].tool_calls")
        _, errors = parse_structured(calls)
        if errors:
            raise BadRequest(f"messages[{i}].tool_calls: {errors[0]}.", f"messages[{i}].tool_calls")
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            if not isinstance(m[key], str):
                raise BadRequest(f"messages[{i}].{key} must be a string.", f"messages[{i}].{key}")
            out[key] = m[key]
    return out


def answer_message(text: str, reason: str | None, tools) -> tuple[dict, str | None]:
    """(message, finish_reason) of one candidate: hermes calls parsed out when tools were
    offered; a text with malformed calls stays text."""
    if tools:
        calls, errors = parse_tool_calls(text, "hermes")
        if calls and not errors:
            head = text[:text.index("<tool_call>")].strip()
            return {"role": "assistant", "content": head or None, "tool_calls": [
                {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for c in calls]}, "tool_calls"
    return {"role": "assistant", "content": text}, reason
