"""Token-by-token streaming (issue 43 item 6): the engine hands a streaming sequence's tokens
out from inside the decode loop (rossjax.engine.stream), the first right after its prefill;
results are the same with or without; a true answer from the sink ends the chunk; `rossjax
serve` sends each streamed token as its own delta and the stream equals the whole answer."""

import asyncio
import json
import urllib.request

import jax
import pytest

from rossjax import models, serve
from rossjax.engine import Engine, SamplingParams
from rossjax.serve.worker import Job


@pytest.fixture(scope="module")
def tiny():
    cfg = models.get_preset("tiny_qwen2", initializer_range=0.2)
    return cfg, models.init_params(cfg, jax.random.key(1))


def _run(eng, prompts, sps, stream, log=None):
    """Run to the end; `log` gets ("call", {seq: tokens}) and ("update", Update) in order."""
    ids = [eng.submit(p, sp, stream=stream)[0] for p, sp in zip(prompts, sps)]
    updates = []
    while eng.busy:
        updates.append(eng.step())
        if log is not None:
            log += [("update", u) for u in updates[-1]]
    return ids, updates


PROMPTS = [[5, 9, 2], [7, 1, 1, 4, 30, 2], [3]]
SPS = [SamplingParams(max_new_tokens=21, temperature=0.0),
       SamplingParams(max_new_tokens=13, temperature=1.0, seed=4),
       SamplingParams(max_new_tokens=30, temperature=0.7, top_k=9, seed=2)]


def test_engine_streams_every_token_from_inside_the_chunk(tiny):
    cfg, params = tiny
    plain = Engine(cfg, params, slots=4, max_len=64, chunk=16)
    ids0, _ = _run(plain, PROMPTS, SPS, stream=False)
    eng = Engine(cfg, params, slots=4, max_len=64, chunk=16)
    log = []
    eng.stream_to(lambda got: log.append(("call", got)) and False, min_gap_s=0.0)
    ids, steps = _run(eng, PROMPTS, SPS, stream=True, log=log)
    calls = [c for kind, c in log if kind == "call"]
    # a call after every decode step, one token per sequence in each: nothing waits for the
    # chunk but a chunk's last token (it comes with the chunk's end, as does a finishing one)
    assert calls and all(len(t) == 1 for c in calls for t, _ in c.values())
    # the first call of the first chunk (after its step 0) carries every first token
    assert set(calls[0]) == set(ids)
    assert all(len(u.tokens) - u.streamed <= 1 for us in steps for u in us)
    streamed = {i: [] for i in ids}
    for kind, x in log:
        if kind == "call":
            for sid, (t, lp) in x.items():
                streamed[sid] += t
        else:
            streamed[x.seq_id] += x.tokens[x.streamed:]
    for i, i0 in zip(ids, ids0):
        r, r0 = eng.result(i), plain.result(i0)
        assert r.tokens == r0.tokens and r.finish_reason == r0.finish_reason
        assert r.logprobs == pytest.approx(r0.logprobs, abs=1e-6)
        assert streamed[i] == list(r.tokens)      # the stream, in order, is the sequence


def test_a_true_answer_ends_the_chunk_and_spacing_groups_tokens(tiny):
    cfg, params = tiny
    eng = Engine(cfg, params, slots=2, max_len=64, chunk=16)
    eng.stream_to(lambda got: True, min_gap_s=0.0)
    ids, steps = _run(eng, [[4, 4, 2]], [SamplingParams(max_new_tokens=5)], stream=True)
    assert [len(u.tokens) for us in steps for u in us] == [1] * 5     # a step per chunk
    # a gap far above a whole chunk's time: no call at all, the chunk's tokens at its end
    calls = []
    eng.stream_to(lambda got: calls.append(got) and False, min_gap_s=60.0)
    eng.executor.listener.step_s = 1e-3
    ids, steps = _run(eng, [[4, 4, 2]], [SamplingParams(max_new_tokens=12)], stream=True)
    assert calls == [] and [(len(u.tokens), u.streamed) for us in steps for u in us] == [(12, 0)]
    # a chunk longer than the gap (a slow model): the first token right after step 0, then
    # groups spaced by the gap, the rest at the chunk's end
    lst = eng.executor.listener
    lst.min_gap_s, lst.step_s = 1e9, 1e9
    ids, steps = _run(eng, [[4, 4, 2]], [SamplingParams(max_new_tokens=12)], stream=True)
    r = eng.result(ids[0])
    assert calls[0] == {ids[0]: ([r.tokens[0]], pytest.approx([r.logprobs[0]]))}
    assert [(len(u.tokens), u.streamed) for us in steps for u in us] == \
        [(12, sum(len(t) for c in calls for t, _ in c.values()))]
    # a sequence that does not stream shares the decode and is given nothing
    calls.clear()
    eng.executor.listener.min_gap_s = 0.0
    a = eng.submit([4, 4, 2], SamplingParams(max_new_tokens=6), stream=True)[0]
    b = eng.submit([9, 1], SamplingParams(max_new_tokens=6), stream=False)[0]
    while eng.busy:
        eng.step()
    assert {sid for c in calls for sid in c} == {a} and len(eng.result(b).tokens) == 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from test_serve import write_tiny_model

    path = write_tiny_model(tmp_path_factory.mktemp("stream_model"))
    server = serve.build(path, slots=4, max_len=96, chunk=16, stream_gap_s=0.0)
    url, stop = serve.start_background(server)
    yield server, url
    stop()


def test_worker_sends_one_delta_per_token(served):
    server, _ = served
    prompt = server.tok.encode("abc")
    sp = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3,
                        stop_ids=server.text_stop_ids)

    async def collect(stream):
        job = Job(prompt, sp, 1, [], server.tok, asyncio.get_running_loop(), stream=stream)
        server.worker.submit(job)
        out = []
        while not out or out[-1].finish_reason is None:
            out.append(await job.out.get())
        return out

    streamed, whole = asyncio.run(collect(True)), asyncio.run(collect(False))
    toks = [t for d in streamed for t in d.token_ids]
    assert toks == [t for d in whole for t in d.token_ids] and 1 <= len(toks) <= 12
    # chunk 16 > 12 tokens: unstreamed it is one delta; streamed, a delta per token
    assert len(whole) == 1
    assert [len(d.token_ids) for d in streamed if d.token_ids] == [1] * len(toks)
    assert "".join(d.text for d in streamed) == whole[0].text


def _sse(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read().decode()
    return [json.loads(e[6:]) for e in raw.strip().split("\n\n") if e != "data: [DONE]"]


@pytest.mark.parametrize("stop", [None, "x"])
def test_streamed_sse_equals_the_whole_answer(served, stop):
    server, url = served
    body = {"model": server.model_id, "prompt": "abc", "max_tokens": 14, "temperature": 0.9,
            "seed": 5, "logprobs": 1}
    if stop:    # a stop string cut inside the chunk: the stream stops where the answer does
        whole = _sse(url + "/completions", dict(body, stream=True))
        text = "".join(c["choices"][0]["text"] for c in whole)
        if len(text) < 3:
            pytest.skip("the tiny model's answer is too short to cut")
        body["stop"] = [text[2]]
    full = json.loads(urllib.request.urlopen(urllib.request.Request(
        url + "/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}), timeout=120).read())
    chunks = _sse(url + "/completions", dict(body, stream=True))
    c0 = full["choices"][0]
    assert "".join(c["choices"][0]["text"] for c in chunks) == c0["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == c0["finish_reason"]
    got = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
    assert got == c0["logprobs"]["tokens"]
