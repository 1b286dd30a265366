"""Tool calls as chat templates write them, parsed out of the policy's text.

    hermes (Qwen, Hermes): <tool_call>{"name": "f", "arguments": {...}}</tool_call>
    react:                 Action: f[argument]   or   Action: f  /  Action Input: {json or text}

`parse_tool_calls(text, style)` returns (calls, errors): a malformed call is an error sentence
the rollout hands back to the policy as an observation, never an exception.
`parse_structured` reads an endpoint's structured `tool_calls` the same way; `parser(style)`
is the (text, n0) -> (calls, errors) an episode uses (a style or a user's module:function).
"""

from __future__ import annotations

import json
import re

from rossjax.agents.env import ToolCall
from rossjax.verify.base import load_fn

STYLES = ("hermes", "react")
_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_REACT = re.compile(r"^\s*Action\s*:\s*(.+?)\s*$", re.MULTILINE)
_INPUT = re.compile(r"^\s*Action Input\s*:\s*(.*)", re.MULTILINE | re.DOTALL)


def _hermes(text: str, n0: int):
    calls, errors = [], []
    for k, m in enumerate(_HERMES.finditer(text)):
        body, closed = m.group(1).strip(), bool(m.group(2))
        where = f"tool call {k + 1}"
        if not closed:
            errors.append(f"{where}: <tool_call> is never closed by </tool_call>")
            continue
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            errors.append(f"{where}: not JSON ({e.msg} at character {e.pos})")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            errors.append(f"{where}: needs a string \"name\"")
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some templates write arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                errors.append(f"{where}: arguments is a string that is not JSON")
                continue
        if not isinstance(args, dict):
            errors.append(f"{where}: arguments must be an object")
            continue
        calls.append(ToolCall(obj["name"], args, f"call_{n0 + len(calls)}"))
    return calls, errors


def _react(text: str, n0: int, arg_name: str):
    m = _REACT.search(text)
    if not m:
        return [], []
    action = m.group(1)
    br = re.fullmatch(r"([A-Za-z_][\w.-]*)\[(.*)\]", action, re.DOTALL)
    if br:
        return [ToolCall(br.group(1), {arg_name: br.group(2)}, f"call_{n0}")], []
    if not re.fullmatch(r"[A-Za-z_][\w.-]*", action):
        return [], [f"Action {action[:60]!r} is not name[argument] or a bare tool name"]
    inp = _INPUT.search(text, m.end())
    if not inp:
        return [], [f"Action {action!r} has no Action Input line"]
    raw = inp.group(1).split("\nObservation", 1)[0].strip()
    try:
        args = json.loads(raw)
    except json.JSONDecodeError:
        args = raw
    args = args if isinstance(args, dict) else {arg_name: str(args)}
    return [ToolCall(action, args, f"call_{n0}")], []


def parse_tool_calls(text: str, style: str = "hermes", n0: int = 0, arg_name: str = "input"):
    """(calls, errors) in `text`; ids are call_<n0>, call_<n0+1>, ... across an episode.
    `arg_name` names a ReAct call's single argument."""
    if style == "hermes":
        return _hermes(text or "", n0)
    if style == "react":
        return _react(text or "", n0, arg_name)
    raise ValueError(f"tool-call style {style!r} is not one of {', '.join(STYLES)}")


def parse_structured(tool_calls: list, n0: int = 0):
    """(calls, errors) of an OpenAI message's `tool_calls` (arguments an object or JSON text);
    a call without an id gets call_<n0 + k>."""
    calls, errors = [], []
    for k, tc in enumerate(tool_calls):
        fn = tc.get("function", {}) if isinstance(tc, dict) else {}
        args = fn.get("arguments", {})
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            args = None
        if not isinstance(fn.get("name"), str) or not isinstance(args, dict):
            errors.append(f"tool call {k + 1}: needs a name and object arguments")
            continue
        calls.append(ToolCall(fn["name"], args, tc.get("id") or f"call_{n0 + len(calls)}"))
    return calls, errors


def parser(style: str, field: str = "style"):
    """(text, n0) -> (calls, errors) for one of STYLES or a user's module:function."""
    if style in STYLES:
        return lambda text, n0: parse_tool_calls(text, style, n0)
    return load_fn(style, field)
