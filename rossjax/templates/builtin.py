"""The built-in chat templates: chatml (Qwen3 layout), llama3 and mistral (v3 spacing), each
written part by part so every span is known exactly (see the package docstring)."""

from __future__ import annotations

import json

from rossjax.templates.spans import Builder, Rendered, args_json, tool_call_fields


def _reasoning_then_content(b: Builder, i: int, m: dict, content: str, think_open: str,
                            think_close: str) -> None:
    """An assistant turn's reasoning (inside the template's think markers) and its content, both
    eligible; the markers are part of the reasoning part, so the model learns to emit them."""
    if m.get("reasoning") is not None:
        b.part(i, "assistant", "reasoning", m["reasoning"], prefix=think_open, suffix=think_close,
               eligible=True)
    b.part(i, "assistant", "content", content, eligible=True)


_QWEN_TOOLS = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_QWEN_TOOLS_END = ("\n</tools>\n\nFor each function call, return a json object with function name "
                   "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                   '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
_LLAMA_TOOLS = ("Given the following functions, please respond with a JSON for a function call with "
                "its proper arguments that best answers the given prompt.\n\nRespond in the format "
                '{"name": function name, "parameters": dictionary of argument name and its value}.'
                "Do not use variables.\n\n")


def _tojson(x, indent=None) -> str:
    return json.dumps(x, ensure_ascii=False, indent=indent)  # jinja's tojson in HF templates


def chatml(messages, tools=None) -> Rendered:
    b = Builder()
    n = len(messages)
    first = 0
    if tools:
        # Qwen2.5/Qwen3: the tool signatures follow the system prompt inside the system turn.
        b.ctx("<|im_start|>system\n")
        if messages and messages[0]["role"] == "system":
            b.part(0, "system", "content", messages[0].get("content") or "")
            b.ctx("\n\n")
            first = 1
        b.ctx(_QWEN_TOOLS + "".join("\n" + _tojson(t) for t in tools) + _QWEN_TOOLS_END
              + "<|im_end|>\n")
    for i, m in enumerate(messages):
        if i < first:
            continue
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            # Consecutive tool results share one user turn, as Qwen's template does.
            if i == 0 or messages[i - 1]["role"] != "tool":
                b.ctx("<|im_start|>user")
            b.part(i, role, "content", content, prefix="\n<tool_response>\n",
                   suffix="\n</tool_response>")
            if i == n - 1 or messages[i + 1]["role"] != "tool":
                b.ctx("<|im_end|>\n")
            continue
        b.ctx(f"<|im_start|>{role}\n")
        if role != "assistant":
            b.part(i, role, "content", content)
            b.ctx("<|im_end|>\n")
            continue
        _reasoning_then_content(b, i, m, content, "<think>\n", "\n</think>\n\n")
        calls = m.get("tool_calls") or []
        if calls:
            blocks = []
            for j, tc in enumerate(calls):
                name, args = tool_call_fields(tc)
                sep = "\n" if (j > 0 or content) else ""
                blocks.append(f'{sep}<tool_call>\n{{"name": {json.dumps(name, ensure_ascii=False)}, '
                              f'"arguments": {args_json(args)}}}\n</tool_call>')
            body = "".join(blocks)
            lead = 1 if content else 0
            b.part(i, role, "tool_calls", body[lead:], prefix=body[:lead], eligible=True)
        b.part(i, role, "end", "<|im_end|>", eligible=True)
        b.ctx("\n")
    return b.done()


def llama3(messages, tools=None) -> Rendered:
    b = Builder()
    b.ctx("<|begin_of_text|>")
    # Llama 3.1 (tools_in_user_message): the function list opens the first user turn.
    tools_at = next((i for i, m in enumerate(messages) if m["role"] == "user"), None) if tools else None
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content") or ""
        b.ctx(f"<|start_header_id|>{'ipython' if role == 'tool' else role}<|end_header_id|>\n\n")
        if i == tools_at:
            b.ctx(_LLAMA_TOOLS + "".join(_tojson(t, indent=4) + "\n\n" for t in tools))
        if role != "assistant":
            b.part(i, role, "content", content)
            b.ctx("<|eot_id|>")
            continue
        _reasoning_then_content(b, i, m, content, "<think>\n", "\n</think>\n\n")
        calls = m.get("tool_calls") or []
        if calls:
            body = "\n".join(
                f'{{"name": {json.dumps(tool_call_fields(tc)[0], ensure_ascii=False)}, '
                f'"parameters": {args_json(tool_call_fields(tc)[1])}}}' for tc in calls)
            b.part(i, role, "tool_calls", body, prefix="\n" if content else "", eligible=True)
        b.part(i, role, "end", "<|eot_id|>", eligible=True)
    return b.done()


def mistral(messages, tools=None) -> Rendered:
    """Mistral v3 as mistral-common's v3 tokenizer writes it (finetuning mode): the system prompt
    opens the last user turn, the tool list comes right before that turn, tool calls and results
    carry their 9-character ids when the row has them."""
    b = Builder()
    b.ctx("<s>")
    system = next((i for i, m in enumerate(messages) if m["role"] == "system"), None)
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content") or ""
        if role == "system":
            continue  # rendered inside the last user turn below
        if role == "user":
            if tools and i == last_user:
                b.ctx(f"[AVAILABLE_TOOLS] {_tojson(tools)}[/AVAILABLE_TOOLS]")
            b.ctx("[INST] ")
            if i == last_user and system is not None:
                b.part(system, "system", "content", messages[system].get("content") or "")
                b.ctx("\n\n")
            b.part(i, role, "content", content)
            b.ctx("[/INST]")
            continue
        if role == "tool":
            if m.get("tool_call_id"):
                b.ctx('[TOOL_RESULTS] {"content": ')
                b.part(i, role, "content", _tojson(content))
                b.ctx(f', "call_id": {_tojson(m["tool_call_id"])}}}[/TOOL_RESULTS]')
            else:
                b.ctx("[TOOL_RESULTS] ")
                b.part(i, role, "content", content)
                b.ctx("[/TOOL_RESULTS]")
            continue
        calls = m.get("tool_calls") or []
        if content or m.get("reasoning") is not None or not calls:
            b.ctx(" ")
        _reasoning_then_content(b, i, m, content, "[THINK]", "[/THINK]")
        if calls:
            body = json.dumps([{"name": tool_call_fields(tc)[0],
                                "arguments": _call_args(tool_call_fields(tc)[1]),
                                **({"id": tc["id"]} if tc.get("id") else {})} for tc in calls],
                              ensure_ascii=False)
            b.part(i, role, "tool_calls", body, prefix="[TOOL_CALLS] ", eligible=True)
        b.part(i, role, "end", "</s>", eligible=True)
    return b.done()


def _call_args(args):
    """Arguments as an object: mistral-common parses a JSON-string form before writing it."""
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args
