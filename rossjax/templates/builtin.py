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


def chatml(messages) -> Rendered:
    b = Builder()
    n = len(messages)
    for i, m in enumerate(messages):
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


def llama3(messages) -> Rendered:
    b = Builder()
    b.ctx("<|begin_of_text|>")
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content") or ""
        b.ctx(f"<|start_header_id|>{'ipython' if role == 'tool' else role}<|end_header_id|>\n\n")
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


def mistral(messages) -> Rendered:
    b = Builder()
    b.ctx("<s>")
    pending_system = None
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content") or ""
        if role == "system":
            # Mistral has no system turn: the system prompt opens the next [INST] block.
            pending_system = i
            b.ctx("[INST] ")
            b.part(i, role, "content", content)
            if i + 1 < len(messages) and messages[i + 1]["role"] == "user":
                b.ctx("\n\n")
            else:
                b.ctx("[/INST]")
            continue
        if role == "user":
            if pending_system is None or pending_system != i - 1:
                b.ctx("[INST] ")
            b.part(i, role, "content", content)
            b.ctx("[/INST]")
            pending_system = None
            continue
        if role == "tool":
            b.ctx("[TOOL_RESULTS] ")
            b.part(i, role, "content", content)
            b.ctx("[/TOOL_RESULTS]")
            continue
        b.ctx(" ")
        _reasoning_then_content(b, i, m, content, "[THINK]", "[/THINK]")
        calls = m.get("tool_calls") or []
        if calls:
            body = json.dumps([{"name": tool_call_fields(tc)[0],
                                "arguments": tool_call_fields(tc)[1]} for tc in calls],
                              ensure_ascii=False)
            b.part(i, role, "tool_calls", body, prefix="[TOOL_CALLS] ", eligible=True)
        b.part(i, role, "end", "</s>", eligible=True)
    return b.done()
