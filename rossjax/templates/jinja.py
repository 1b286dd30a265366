"""Spans from a tokenizer's own jinja chat template, or a clear refusal.

The assistant turn `i` is located by difference: P = render(messages[:i], generation prompt on),
Q = render(messages[:i+1]); the turn is Q[len(P):]. This is only sound when
  * the generation prompt adds text (else the role header cannot be told from generated text),
  * Q starts with P (adding the turn does not rewrite the prompt),
  * the full rendering starts with Q (later turns do not rewrite earlier ones, as Qwen3's template
    does when it strips earlier reasoning),
  * the turn's reasoning and content occur verbatim inside it, in order.
Any violation raises `TemplateError` naming the message; nothing is guessed. Non-assistant
messages get no parts here (they are context either way). A template that does not compile is
`template_syntax`; `{% generation %}...{% endgeneration %}` blocks (Hugging Face's assistant-mask
markup) render their body, the spans being found as above. The row's `tools` and the configured
template kwargs (e.g. enable_thinking) are passed to the template as variables.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

from rossjax.templates.spans import Part, Rendered, TemplateError, tool_call_fields


def _tojson(x, indent=None, ensure_ascii=False, separators=None, sort_keys=False):
    return json.dumps(x, indent=indent, ensure_ascii=ensure_ascii, separators=separators,
                      sort_keys=sort_keys)


def _raise(msg):
    raise TemplateError("template_error", f"chat template raised: {msg}")


def _generation_extension():
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        """`{% generation %}body{% endgeneration %}` renders body (transformers marks assistant
        text with it; the spans here come from rendering differences instead)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return Generation


@functools.lru_cache(maxsize=8)
def _compile(src: str):
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols",
                                                    _generation_extension()])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(src)
    except TemplateSyntaxError as e:
        raise TemplateError("template_syntax",
                            f"chat template does not compile (line {e.lineno}: {e.message})") from None


def _hf_message(m: dict) -> dict:
    out = {"role": m["role"], "content": m.get("content") or ""}
    if m.get("reasoning") is not None:
        out["reasoning_content"] = m["reasoning"]
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {"type": "function", "function": {"name": tool_call_fields(tc)[0],
                                              "arguments": tool_call_fields(tc)[1]}}
            for tc in m["tool_calls"]]
    for key in ("name", "tool_call_id"):
        if m.get(key) is not None:
            out[key] = m[key]
    return out


def _token_str(tokenizer, token_id):
    if token_id is None:
        return ""
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def render_jinja(src: str, messages, tokenizer, tools=None, kwargs: dict | None = None) -> Rendered:
    tpl = _compile(src)
    extra = {k: v for k, v in (kwargs or {}).items()
             if k not in ("messages", "add_generation_prompt", "tools")}
    hf = [_hf_message(m) for m in messages]
    specials = getattr(tokenizer, "special_tokens", {}) or {}
    bos = next((s for s in ("<|begin_of_text|>", "<s>", "<bos>") if s in specials), "")
    eos = _token_str(tokenizer, getattr(tokenizer, "eos_id", None))

    def render(msgs, gen):
        try:
            return tpl.render(**{"bos_token": bos, "eos_token": eos, **extra}, messages=msgs,
                              add_generation_prompt=gen, tools=tools or None)
        except TemplateError:
            raise
        except Exception as e:  # jinja errors: the template cannot render these messages
            raise TemplateError("template_error", f"chat template failed: {e}") from None

    full = render(hf, False)
    parts: list[Part] = []
    end_markers = sorted((s for s in specials if s), key=len, reverse=True)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        p = render(hf[:i], True)
        if p == render(hf[:i], False):
            raise TemplateError("template_no_generation_prompt",
                                "chat template adds nothing for add_generation_prompt, so the "
                                "assistant header cannot be told apart from generated text")
        q = render(hf[: i + 1], False)
        if not q.startswith(p):
            raise TemplateError("template_rewrites_prompt",
                                f"chat template renders the text before message {i} differently "
                                f"once message {i} is added")
        if not full.startswith(q):
            raise TemplateError("template_rewrites_history",
                                f"chat template rewrites message {i} when later messages follow "
                                "(e.g. it drops earlier reasoning)")
        start, end = len(p), len(q)
        while end > start and full[end - 1] in " \n":  # trailing template whitespace is context
            end -= 1
        if end <= start:
            raise TemplateError("template_drops_content",
                                f"chat template renders nothing for assistant message {i}")
        parts.extend(_turn_parts(full, i, m, start, end, end_markers))
    return Rendered(full, parts)


def _turn_parts(full, i, m, start, end, end_markers):
    # End-of-turn marker: the longest special token ending the turn.
    mark = next((s for s in end_markers if full.endswith(s, start, end)), "")
    body_end = end - len(mark)
    cursor, out = start, []
    located = []
    for kind in ("reasoning", "content"):
        text = m.get(kind) if kind == "reasoning" else (m.get("content") or "")
        if text is None or (kind == "content" and not text):
            continue
        k = full.find(text, cursor, body_end)
        if k < 0:
            raise TemplateError("template_drops_content",
                                f"chat template does not render the {kind} of message {i} verbatim")
        located.append((kind, k, k + len(text)))
        cursor = k + len(text)
    if m.get("tool_calls"):
        for tc in m["tool_calls"]:
            if full.find(tool_call_fields(tc)[0], cursor, body_end) < 0:
                raise TemplateError("template_drops_content",
                                    f"chat template does not render the tool calls of message {i}")
    # Parts tile the turn [start, end): wrappers go with the part they introduce.
    prev = start
    for j, (kind, ts, te) in enumerate(located):
        nxt = located[j + 1][1] if j + 1 < len(located) else None
        span_end = te if nxt is not None or m.get("tool_calls") else body_end
        if kind == "reasoning" and nxt is not None:
            span_end = nxt
        out.append(Part(i, "assistant", kind, prev, span_end, ts, te, True))
        prev = span_end
    if m.get("tool_calls"):
        out.append(Part(i, "assistant", "tool_calls", prev, body_end, prev, body_end, True))
        prev = body_end
    elif not located:
        out.append(Part(i, "assistant", "content", prev, body_end, prev, prev, True))
        prev = body_end
    if mark:
        out.append(Part(i, "assistant", "end", body_end, end, body_end, end, True))
    return out
