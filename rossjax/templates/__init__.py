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

A row's OpenAI `tools` list is rendered into the context as each model's template does (chatml:
Qwen's `# Tools` system block; llama3: Llama 3.1's function list in the first user turn; mistral:
`[AVAILABLE_TOOLS]` before the last user turn; "tokenizer": passed to the template as `tools`,
with `template_kwargs` such as enable_thinking). Any error while rendering a row is a
`TemplateError` with a `template_*` code, which withholds that row only.

Deviations from the models' own templates, deliberately: reasoning is rendered on every assistant
turn that carries it (Qwen3's template strips it from earlier turns, which would change what the
run saw); Llama 3 and Mistral have no native reasoning markup, so `<think>` / `[THINK]` is used.
"""

from __future__ import annotations

from rossjax.errors import InputError
from rossjax.templates.builtin import chatml, llama3, mistral
from rossjax.templates.jinja import render_jinja
from rossjax.templates.spans import Part, Rendered, TemplateError, tool_call_fields

TEMPLATES = ("chatml", "llama3", "mistral", "tokenizer")
__all__ = ["Part", "Rendered", "TEMPLATES", "TemplateError", "render_chat", "render_prompt",
           "tool_call_fields"]


_BUILTIN = {"chatml": chatml, "llama3": llama3, "mistral": mistral}


def render_chat(messages, template: str = "chatml", tokenizer=None, tools=None,
                template_kwargs: dict | None = None) -> Rendered:
    """Render `messages` (rollout-record messages, with the row's `tools`) and locate every
    part's span; `template_kwargs` go to the tokenizer's own template (e.g. enable_thinking)."""
    if template not in TEMPLATES:
        raise InputError(f"template {template!r} is not one of {', '.join(TEMPLATES)}")
    if template == "tokenizer":
        src = getattr(tokenizer, "chat_template", None)
        if not src:
            raise TemplateError("template_unavailable",
                                f"tokenizer {getattr(tokenizer, 'name', '?')} has no chat template")
        return render_jinja(src, messages, tokenizer, tools=tools, kwargs=template_kwargs)
    try:
        return _BUILTIN[template](messages, tools=tools or None)
    except TemplateError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a row the template cannot take
        raise TemplateError("template_error", f"template {template} cannot render this row: "
                                              f"{type(e).__name__}: {e}") from None


def render_prompt(messages, template: str = "chatml", tokenizer=None, tools=None) -> str:
    """The rendering of `messages` up to where the next assistant turn's content starts (its
    header included): what a sampler continues, so prompt + completion + end marker spell what
    `render_chat` renders for the finished conversation."""
    r = render_chat(list(messages) + [{"role": "assistant", "content": ""}], template, tokenizer,
                    tools=tools or None)
    return r.text[:r.part(len(messages), "content").start]
