"""`rossjax serve` through the official openai client on loopback: greedy chat equals
rossjax.sample.generate on the rendered prompt, streaming equals non-streaming, n candidates,
stop strings, logprobs, usage, 8 concurrent requests, and a bad request is a clear 400."""

import concurrent.futures as cf

import numpy as np
import openai
import pytest
import torch
from hf_tiny import _COMMON
from transformers import AutoModelForCausalLM, Qwen2Config

from rossjax import serve
from rossjax.models import load_hf
from rossjax.sample import generate
from rossjax.tokenizers import load_tokenizer
from rossjax.tokenizers.ascii import write_ascii_tokenizer
from rossjax.train.rl.rollout import render_prompt

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]


def write_tiny_model(path) -> str:
    """A tiny random Qwen2 folder with the ascii tokenizer (tests/test_faults_serve.py too)."""
    torch.manual_seed(0)
    # vocab = the ascii tokenizer's 131 ids, so every sampled id has text
    model = AutoModelForCausalLM.from_config(Qwen2Config(**{**_COMMON, "vocab_size": 131},
                                                         tie_word_embeddings=True))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    model.save_pretrained(str(path))
    write_ascii_tokenizer(str(path))
    return str(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("serve_model"))
    server = serve.build(str(path), slots=4, max_len=96, chunk=4)
    url, stop = serve.start_background(server)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    yield server, client, str(path)
    stop()


def test_models_and_greedy_chat_equals_generate(served):
    server, client, path = served
    assert [m.id for m in client.models.list().data] == [server.model_id]
    r = client.chat.completions.create(model=server.model_id, messages=MSGS, max_tokens=12,
                                       temperature=0, logprobs=True)
    tok = load_tokenizer(path)
    ids = tok.encode(render_prompt(MSGS, "chatml", tok))
    cfg, params = load_hf(path)
    ref = generate(cfg, params, [ids], 12, stop_ids=server.chat_stop_ids)
    want = ref.sequences()[0]
    text_ids = [t for t in want if t not in server.chat_stop_ids]
    c = r.choices[0]
    assert c.message.content == tok.decode(text_ids) and c.message.role == "assistant"
    assert c.finish_reason == ("stop" if ref.finish_reason[0] == "stop" else "length")
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(want)
    np.testing.assert_allclose([x.logprob for x in c.logprobs.content],
                               ref.logprobs[0, :len(want)], atol=1e-5, rtol=0)


def test_streaming_equals_non_streaming_and_n_candidates(served):
    server, client, _ = served
    kw = dict(model=server.model_id, messages=MSGS, max_tokens=10, temperature=1.0, seed=11, n=3)
    full = client.chat.completions.create(**kw)
    parts, reasons = ["", "", ""], [None] * 3
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            parts[c.index] += c.delta.content or ""
            reasons[c.index] = c.finish_reason or reasons[c.index]
    assert parts == [c.message.content for c in full.choices]
    assert reasons == [c.finish_reason for c in full.choices]
    assert len(set(parts)) > 1       # candidates differ (one prefill, three streams)


def test_completions_stop_strings_and_usage_chunk(served):
    server, client, _ = served
    base = client.completions.create(model=server.model_id, prompt="abc", max_tokens=12,
                                     temperature=0)
    text = base.choices[0].text
    assert len(text) >= 4
    stop = text[2:4]
    r = client.completions.create(model=server.model_id, prompt="abc", max_tokens=12,
                                  temperature=0, stop=[stop])
    assert r.choices[0].text == text[:text.index(stop)] and r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=server.model_id, prompt="abc", max_tokens=5,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == \
        client.completions.create(model=server.model_id, prompt="abc", max_tokens=5,
                                  temperature=0).choices[0].text
    assert chunks[-1].usage.completion_tokens >= 1


def test_eight_concurrent_requests_all_complete(served):
    """More requests than slots (4): they queue, share decode steps and all finish."""
    server, client, _ = served

    def one(i):
        return client.chat.completions.create(
            model=server.model_id, messages=[{"role": "user", "content": f"Count to {i}."}],
            max_tokens=6 + i, temperature=0.8, seed=i)

    with cf.ThreadPoolExecutor(8) as ex:
        res = list(ex.map(one, range(8)))
    assert all(r.choices[0].finish_reason in ("stop", "length") for r in res)
    assert all(1 <= r.usage.completion_tokens <= 6 + i for i, r in enumerate(res))
    assert not server.engine.busy and server.engine.free_slots == server.engine.slots == 4


@pytest.mark.parametrize("kw, field", [
    (dict(messages=[]), "messages"),
    (dict(messages=[{"role": "wizard", "content": "x"}]), "role"),
    (dict(messages=MSGS, temperature=5), "temperature"),
    (dict(messages=MSGS, max_tokens=0), "max_tokens"),
    (dict(messages=MSGS, max_tokens=10_000), "max_tokens"),
    (dict(messages=MSGS, n=9), "'n'"),
    (dict(messages=MSGS, top_p=0), "top_p"),
    (dict(messages=MSGS, stop=["a", "b", "c", "d", "e"]), "stop"),
    (dict(messages=MSGS, logprobs=True, top_logprobs=21), "top_logprobs"),
])
def test_bad_request_is_a_400_naming_the_field(served, kw, field):
    server, client, _ = served
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model_id, **kw)
    assert e.value.status_code == 400 and field in e.value.message


def test_unknown_model_is_a_404(served):
    _, client, _ = served
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="gpt-9", messages=MSGS)
