"""What a rendered chat is: its text and the character span of every part of every message.

Templates (builtin.py, jinja.py) build a `Rendered` through `Builder`; a message list that cannot
be rendered with located spans raises `TemplateError` with a snake_case `code`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from rossjax.errors import InputError


class TemplateError(InputError):
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


class Builder:
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


def args_json(args) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
