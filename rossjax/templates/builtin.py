"""Chat rendering with the character span of every part of every message.

`render_chat(messages, template)` returns the rendered text and a list of `Part`s: for each
message its content (and for assistant turns its reasoning, tool calls and end-of-turn marker)
with the span it occupies in the text. Eligibility for the loss comes only from these spans:
assistant parts and the assistant end-of-turn marker are eligible, everything else (system,
user, tool results, role headers, the newline the template writes after an end marker) is
context. The newline after `<|im_end|>` is *not* eligible (slime includes it): the model stops at
`<|im_end|>` and never generates that newline, so there is nothing to learn from it.

Templates: "chatml" (Qwen3 layout: `<think>` reasoning, `<tool_call>` JSON, tool results grouped
into a user turn of `<tool_response>` blocks), "llama3", "mistral" (v3 spacing: "[INST] u[/INST] a</s>"),
and "tokenizer" (the tokenizer's own jinja template). The jinja path finds each assistant turn by
rendering with and without the generation prompt and refuses, with a reason, any template whose
spans cannot be located exactly (no generation prompt, history rewritten, content dropped) rather
than producing an all-zero or all-one mask.

Deviations from the models' own templates, deliberately: reasoning is rendered on every assistant
turn that carries it (Qwen3's template strips it from earlier turns, which would change what the
run saw); Llama 3 and Mistral have no native reasoning markup, so `<think>` / `[THINK]` is used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

TEMPLATES = ("chatml", "llama3", "mistral", "tokenizer")


class TemplateError(ValueError):
    """The messages cannot be rendered with located spans; `code` is a snake_case reason."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class Part:
    message: int  # index into messages
    role: str
    kind: str  # "content" | "reasoning" | "tool_calls" | "end"
    start: int  # rendered span, including wrappers the model generates (e.g. <think> tags)
    end: int
    text_start: int  # the field's own text inside the span (what selectors refer to)
    text_end: int
    eligible: bool


@dataclass
class Rendered:
    text: str
    parts: list[Part] = field(default_factory=list)

    def eligible_intervals(self) -> list[tuple[int, int]]:
        return [(p.start, p.end) for p in self.parts if p.eligible and p.end > p.start]

    def message_parts(self, message: int) -> list[Part]:
        return [p for p in self.parts if p.message == message]

    def part(self, message: int, kind: str) -> Part | None:
        for p in self.parts:
            if p.message == message and p.kind == kind:
                return p
        return None


class _Builder:
    def __init__(self):
        self.chunks: list[str] = []
        self.pos = 0
        self.parts: list[Part] = []

    def ctx(self, s: str):
        self.chunks.append(s)
        self.pos += len(s)

    def part(self, i, role, kind, text, prefix="", suffix="", eligible=False):
        start = self.pos
        self.ctx(prefix)
        ts = self.pos
        self.ctx(text)
        te = self.pos
        self.ctx(suffix)
        self.parts.append(Part(i, role, kind, start, self.pos, ts, te, eligible))

    def done(self) -> Rendered:
        return Rendered("".join(self.chunks), self.parts)


def tool_call_fields(tc: dict) -> tuple[str, object]:
    fn = tc.get("function", tc)
    return fn["name"], fn.get("arguments", {})


def _args_json(args) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _reasoning_then_content(b: "_Builder", i: int, m: dict, content: str, think_open: str,
                            think_close: str) -> None:
    """An assistant turn's reasoning (inside the template's think markers) and its content, both
    eligible; the markers are part of the reasoning part, so the model learns to emit them."""
    if m.get("reasoning") is not None:
        b.part(i, "assistant", "reasoning", m["reasoning"], prefix=think_open, suffix=think_close,
               eligible=True)
    b.part(i, "assistant", "content", content, eligible=True)


def _chatml(messages) -> Rendered:
    b = _Builder()
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
                              f'"arguments": {_args_json(args)}}}\n</tool_call>')
            body = "".join(blocks)
            lead = 1 if content else 0
            b.part(i, role, "tool_calls", body[lead:], prefix=body[:lead], eligible=True)
        b.part(i, role, "end", "<|im_end|>", eligible=True)
        b.ctx("\n")
    return b.done()


def _llama3(messages) -> Rendered:
    b = _Builder()
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
                f'"parameters": {_args_json(tool_call_fields(tc)[1])}}}' for tc in calls)
            b.part(i, role, "tool_calls", body, prefix="\n" if content else "", eligible=True)
        b.part(i, role, "end", "<|eot_id|>", eligible=True)
    return b.done()


def _mistral(messages) -> Rendered:
    b = _Builder()
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


def render_chat(messages, template: str = "chatml", tokenizer=None) -> Rendered:
    """Render `messages` (rollout-record messages) and locate every part's span."""
    if template == "chatml":
        return _chatml(messages)
    if template == "llama3":
        return _llama3(messages)
    if template == "mistral":
        return _mistral(messages)
    if template == "tokenizer":
        from rossjax.curate.jinja_chat import render_jinja

        src = getattr(tokenizer, "chat_template", None)
        if not src:
            raise TemplateError("template_unavailable",
                                f"tokenizer {getattr(tokenizer, 'name', '?')} has no chat template")
        return render_jinja(src, messages, tokenizer)
    raise ValueError(f"template {template!r} is not one of {', '.join(TEMPLATES)}")
