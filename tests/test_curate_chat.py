"""Chat rendering: exact text per template and the span of every part of every message."""

import pytest

from rossjax.curate.schema import iter_records
from rossjax.templates import TemplateError, render_chat
from rossjax.tokenizers import load_tokenizer

AGENT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "List files."},
    {"role": "assistant", "reasoning": "Use ls.", "content": "Listing.",
     "tool_calls": [{"name": "bash", "arguments": {"cmd": "ls"}}]},
    {"role": "tool", "name": "bash", "content": "a.py\nb.py"},
    {"role": "tool", "name": "bash", "content": "done"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": '{"cmd": "cat a.py"}'}}]},
    {"role": "tool", "content": "print(1)"},
    {"role": "assistant", "content": "Two files: a.py and b.py."},
]

CHATML = (
    "<|im_start|>system\nYou are a coding agent.<|im_end|>\n"
    "<|im_start|>user\nList files.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nUse ls.\n</think>\n\nListing.\n<tool_call>\n"
    '{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\na.py\nb.py\n</tool_response>\n<tool_response>\ndone\n"
    "</tool_response><|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "cat a.py"}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nprint(1)\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nTwo files: a.py and b.py.<|im_end|>\n")


def eligible_text(r):
    return "".join(r.text[s:e] for s, e in r.eligible_intervals())


def test_chatml_text_and_spans():
    r = render_chat(AGENT, "chatml")
    assert r.text == CHATML
    for p in r.parts:  # every part's own text is the message field, verbatim
        m = AGENT[p.message]
        if p.kind in ("content", "reasoning"):
            assert r.text[p.text_start:p.text_end] == (m.get(p.kind) or "")
        assert p.eligible == (m["role"] == "assistant")
        assert p.start <= p.text_start <= p.text_end <= p.end
    assert r.text[r.part(2, "reasoning").start:r.part(2, "reasoning").end] == \
        "<think>\nUse ls.\n</think>\n\n"
    assert r.text[r.part(2, "end").start:r.part(2, "end").end] == "<|im_end|>"
    # Eligible = exactly what follows "<|im_start|>assistant\n" up to and including <|im_end|>.
    want = "".join(seg.split("<|im_end|>")[0] + "<|im_end|>"
                   for seg in CHATML.split("<|im_start|>assistant\n")[1:])
    assert eligible_text(r) == want


def test_llama3_and_mistral_text():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A", "reasoning": "R"},
            {"role": "user", "content": "U2"}, {"role": "assistant", "content": "B",
                                                "tool_calls": [{"name": "f", "arguments": {"x": 1}}]},
            {"role": "tool", "content": "T"}, {"role": "assistant", "content": "C"}]
    r = render_chat(msgs, "llama3")
    h = lambda role: f"<|start_header_id|>{role}<|end_header_id|>\n\n"  # noqa: E731
    assert r.text == ("<|begin_of_text|>" + h("system") + "S<|eot_id|>" + h("user") + "U<|eot_id|>"
                      + h("assistant") + "<think>\nR\n</think>\n\nA<|eot_id|>" + h("user")
                      + "U2<|eot_id|>" + h("assistant")
                      + 'B\n{"name": "f", "parameters": {"x": 1}}<|eot_id|>'
                      + h("ipython") + "T<|eot_id|>" + h("assistant") + "C<|eot_id|>")
    assert eligible_text(r) == ("<think>\nR\n</think>\n\nA<|eot_id|>"
                                'B\n{"name": "f", "parameters": {"x": 1}}<|eot_id|>C<|eot_id|>')
    r = render_chat(msgs, "mistral")
    assert r.text == ("<s>[INST] U[/INST] [THINK]R[/THINK]A</s>[INST] S\n\nU2[/INST] B"
                      '[TOOL_CALLS] [{"name": "f", "arguments": {"x": 1}}]</s>'
                      "[TOOL_RESULTS] T[/TOOL_RESULTS] C</s>")
    assert eligible_text(r) == ('[THINK]R[/THINK]A</s>B[TOOL_CALLS] [{"name": "f", '
                                '"arguments": {"x": 1}}]</s>C</s>')


def _mistral_common_text(messages, tools=None) -> str:
    """The text mistral-common's v3 tokenizer (finetuning mode) writes for `messages`."""
    mc = pytest.importorskip("mistral_common")
    from mistral_common.protocol.instruct import messages as mm, tool_calls as mt
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.validator import MistralRequestValidatorV3, ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    del mc
    tok = MistralTokenizer.v3()
    tok._chat_completion_request_validator = MistralRequestValidatorV3(ValidationMode.finetuning)
    out = []
    for m in messages:
        if m["role"] == "system":
            out.append(mm.SystemMessage(content=m["content"]))
        elif m["role"] == "user":
            out.append(mm.UserMessage(content=m["content"]))
        elif m["role"] == "tool":
            out.append(mm.ToolMessage(content=m["content"], tool_call_id=m["tool_call_id"]))
        else:
            calls = [mt.ToolCall(id=c["id"], function=mt.FunctionCall(
                name=c["function"]["name"], arguments=c["function"]["arguments"]))
                for c in m.get("tool_calls") or []]
            out.append(mm.AssistantMessage(content=m.get("content") or None,
                                           tool_calls=calls or None))
    req = ChatCompletionRequest(messages=out, tools=[mt.Tool(**t) for t in tools or []] or None)
    text = tok.encode_chat_completion(req).text
    return text.replace("\u2581", " ").replace("<0x0A>", "\n")


def test_mistral_matches_mistral_common_v3():
    """System prompt in the last user turn, tools right before it, tool-call ids and results."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}}}}]
    call = {"id": "abcdefghi", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    convs = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Oslo?"},
         {"role": "assistant", "content": "Cold"}],
        [{"role": "user", "content": "Weather in Oslo?"},
         {"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "content": "-3 C", "tool_call_id": "abcdefghi"},
         {"role": "assistant", "content": "It is -3 C."}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
         {"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "content": "sunny", "tool_call_id": "abcdefghi"},
         {"role": "assistant", "content": "Sunny."}],
    ]
    for msgs in convs:
        for t in (None, tools):
            assert render_chat(msgs, "mistral", tools=t).text == _mistral_common_text(msgs, t)


def test_tools_as_a_json_string_placed_per_template(tmp_path):
    """A row whose `tools` is JSON text (verl, HF datasets): parsed, then placed where each
    template puts it; the tool list is context, never supervised."""
    import json

    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    row = {"id": "r1", "tools": json.dumps(tools),
           "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                        {"role": "assistant", "content": "A"}, {"role": "user", "content": "U2"},
                        {"role": "assistant", "content": "B"}]}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    rec = next(iter_records(str(path))).record
    assert rec["tools"] == tools
    sig = json.dumps(tools[0], ensure_ascii=False)
    r = render_chat(rec["messages"], "chatml", tools=rec["tools"])
    assert r.text.startswith("<|im_start|>system\nS\n\n# Tools\n")
    assert r.text.index(sig) < r.text.index("<|im_start|>user\nU<")
    r = render_chat(rec["messages"], "llama3", tools=rec["tools"])
    first_user = r.text.index("<|start_header_id|>user<|end_header_id|>\n\n")
    assert first_user < r.text.index(json.dumps(tools[0], indent=4)) < r.text.index("U<|eot_id|>")
    r = render_chat(rec["messages"], "mistral", tools=rec["tools"])
    assert r.text.index("A</s>") < r.text.index("[AVAILABLE_TOOLS]") < r.text.index("[INST] S\n\nU2")
    for r in (render_chat(rec["messages"], t, tools=rec["tools"]) for t in ("chatml", "llama3",
                                                                            "mistral")):
        assert "lookup" not in eligible_text(r)


# A hand-written ChatML jinja template in the style Hugging Face tokenizers ship.
JINJA_CHATML = """{%- for m in messages %}
{%- if m.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- elif m.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if m.reasoning_content is defined %}{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}
{{- m.content }}
{%- for tc in m.tool_calls | default([]) %}
{%- if not loop.first or m.content %}{{- '\\n' }}{%- endif %}
{{- '<tool_call>\\n{"name": "' + tc.function.name + '", "arguments": ' }}
{%- if tc.function.arguments is string %}{{- tc.function.arguments }}{%- else %}{{- tc.function.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def with_template(src):
    tok = load_tokenizer("qwen")
    return type("T", (), {"chat_template": src, "special_tokens": tok.special_tokens,
                          "eos_id": tok.eos_id, "token_bytes": tok.token_bytes, "name": "t"})()


def test_tokenizer_template_matches_builtin_chatml():
    r = render_chat(AGENT, "tokenizer", with_template(JINJA_CHATML))
    ref = render_chat(AGENT, "chatml")
    assert r.text == ref.text
    assert eligible_text(r) == eligible_text(ref)
    assert r.part(2, "reasoning").text_start == ref.part(2, "reasoning").text_start
    assert r.part(7, "content").text_end == ref.part(7, "content").text_end
    assert [p.kind for p in r.message_parts(2)] == ["reasoning", "content", "tool_calls", "end"]


def test_tokenizer_template_refusals():
    drops_old_reasoning = JINJA_CHATML.replace(
        "{%- if m.reasoning_content is defined %}",
        "{%- if m.reasoning_content is defined and loop.index0 >= messages|length - 1 %}")
    with pytest.raises(TemplateError) as e:
        render_chat(AGENT, "tokenizer", with_template(drops_old_reasoning))
    assert e.value.code == "template_rewrites_history" and "message 2" in e.value.detail
    no_gen = JINJA_CHATML.replace("{%- if add_generation_prompt %}", "{%- if false %}")
    with pytest.raises(TemplateError) as e:
        render_chat(AGENT, "tokenizer", with_template(no_gen))
    assert e.value.code == "template_no_generation_prompt"
    strips = JINJA_CHATML.replace("{{- m.content }}", "{{- m.content | upper }}")
    with pytest.raises(TemplateError) as e:
        render_chat(AGENT, "tokenizer", with_template(strips))
    assert e.value.code == "template_drops_content"
    with pytest.raises(TemplateError) as e:
        render_chat(AGENT, "tokenizer", with_template(None))
    assert e.value.code == "template_unavailable"
    with pytest.raises(ValueError, match="not one of"):
        render_chat(AGENT, "vicuna")


@pytest.mark.parametrize("template", ["chatml", "llama3", "mistral"])
def test_render_prompt_is_the_rendering_up_to_the_answer(template):
    """templates.render_prompt (the one copy: GRPO prompts, serve, generate, agentic turns):
    prompt + answer is the finished conversation's rendering up to the answer's end."""
    from rossjax.templates import render_prompt
    from rossjax.train.rl import rollout

    msgs = AGENT[:2]
    full = render_chat(msgs + [{"role": "assistant", "content": "Sure."}], template)
    answer = full.part(2, "content")
    assert render_prompt(msgs, template) + "Sure." == full.text[:answer.end]
    assert rollout.render_prompt is render_prompt  # the old import path still works
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    assert render_prompt(msgs, template, tools=tools) == render_chat(
        msgs + [{"role": "assistant", "content": ""}], template, tools=tools).text[
            :render_chat(msgs + [{"role": "assistant", "content": ""}], template,
                         tools=tools).part(2, "content").start]
