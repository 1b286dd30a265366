"""`rossjax serve`'s top log-probs and cached prompt tokens (issue 42 item 3, issue 43 item 5),
through the official openai client on loopback: chat `top_logprobs` and completions integer
`logprobs` parse in the client's types, the chosen token is the top-1 entry under greedy, the
top-k log-probs equal a full log_softmax of the model's logits (logits / T when sampling) for the
same prefix, streamed chunks carry the same entries, out-of-range k is a 400 naming the field,
and usage.prompt_tokens_details.cached_tokens counts what the prefix cache reused (0 with it
off)."""

import json
import urllib.request

import jax
import numpy as np
import openai
import pytest
from test_serve import write_tiny_model

from rossjax import serve
from rossjax.models import forward, load_hf

# unique to this file, so no other module's requests have cached its blocks
SYSTEM = "You check proofs line by line and answer in one word: valid or invalid."


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("logprobs_model"))
    # stream_gap_s=0: every decode step of a streamed request calls the host (the tiny model
    # would otherwise stream chunk by chunk), so streamed top log-probs take the hook's path
    server = serve.build(path, slots=4, max_len=256, chunk=4, stream_gap_s=0.0)
    url, stop = serve.start_background(server)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    cfg, params = load_hf(path)
    server.path = path
    yield server, client, url, (cfg, params)
    stop()


def _ref_logprobs(model, ids, temperature=1.0):
    """[len(ids), V] log_softmax(logits / T) of the next token after each prefix ids[:i + 1]."""
    cfg, params = model
    logits, _ = forward(cfg, params, np.asarray([ids], np.int32))
    return np.asarray(jax.nn.log_softmax(np.asarray(logits[0], np.float64) / temperature, -1))


def _check_top(ref_row, top, k, chosen_lp, tok_bytes):
    """One token's top entries [(bytes, logprob)] against a reference row of log-probs."""
    assert len(top) == k
    want = np.sort(ref_row)[::-1][:k]
    np.testing.assert_allclose([lp for _, lp in top], want, atol=1e-4, rtol=0)
    for b, lp in top:   # each named token has the log-prob it is given
        ids = [t for t in range(len(ref_row)) if tok_bytes(t) == b]
        assert any(abs(ref_row[t] - lp) < 1e-4 for t in ids)
    assert chosen_lp <= top[0][1] + 1e-6


def test_chat_top_logprobs_match_a_full_log_softmax_and_greedy_is_top1(served):
    server, client, url, model = served
    msgs = [{"role": "user", "content": "Name a prime."}]
    r = client.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=8,
                                       temperature=0, logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    assert content and all(len(e.top_logprobs) == 5 for e in content)
    prompt = _post(url[:-len("/v1")] + "/tokenize", {"messages": msgs})["tokens"]
    # the answer's ids come back through the bytes of each entry (ascii tokenizer: one id each)
    by_bytes = {bytes(server.tok.token_bytes(t)): t for t in range(server.tok.vocab_size)}
    gen = [by_bytes[bytes(e.bytes)] for e in content]
    ref = _ref_logprobs(model, prompt + gen)[len(prompt) - 1:]
    for i, e in enumerate(content):
        top = [(bytes(a.bytes), a.logprob) for a in e.top_logprobs]
        _check_top(ref[i], top, 5, e.logprob, server.tok.token_bytes)
        # greedy: the chosen token is the top-1 entry, with the same log-prob
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob
        assert e.logprob == pytest.approx(ref[i, gen[i]], abs=1e-4)


def test_completions_integer_logprobs_under_the_sampling_temperature(served):
    server, client, _, model = served
    r = client.completions.create(model=server.model_id, prompt="2+2=", max_tokens=6,
                                  temperature=0.7, seed=3, logprobs=3)
    lp = r.choices[0].logprobs
    n = len(lp.tokens)
    assert n >= 1 and len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert lp.text_offset == list(np.cumsum([0] + [len(t) for t in lp.tokens])[:-1])
    prompt = server.tok.encode("2+2=")
    by_str = {server.tok.token_bytes(t).decode("utf-8", "replace"): t
              for t in range(server.tok.vocab_size)}
    gen = [by_str[t] for t in lp.tokens]
    ref = _ref_logprobs(model, prompt + gen, temperature=0.7)[len(prompt) - 1:]
    for i, d in enumerate(lp.top_logprobs):
        # the 3 likeliest, plus the chosen token when it is not among them (as OpenAI's)
        assert lp.tokens[i] in d and len(d) in (3, 4)
        assert d[lp.tokens[i]] == lp.token_logprobs[i]
        best = sorted(d.values(), reverse=True)[:3]
        np.testing.assert_allclose(best, np.sort(ref[i])[::-1][:3], atol=1e-4, rtol=0)
        assert lp.token_logprobs[i] == pytest.approx(ref[i, gen[i]], abs=1e-4)
    # logprobs=0: the chosen token's entry alone
    r0 = client.completions.create(model=server.model_id, prompt="2+2=", max_tokens=3,
                                   temperature=0, logprobs=0)
    lp0 = r0.choices[0].logprobs
    assert [list(d) for d in lp0.top_logprobs] == [[t] for t in lp0.tokens]


def _post(url, body):
    return json.loads(urllib.request.urlopen(urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}),
        timeout=120).read())


def _sse(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read().decode()
    events = raw.strip().split("\n\n")
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[6:]) for e in events[:-1]]


def test_streamed_chunks_carry_the_same_top_logprobs(served):
    server, client, url, _ = served
    body = {"model": server.model_id, "messages": [{"role": "user", "content": "Count."}],
            "max_tokens": 7, "temperature": 0, "logprobs": True, "top_logprobs": 4}
    full = _post(url + "/chat/completions", body)
    chunks = _sse(url + "/chat/completions", dict(body, stream=True))
    got = [e for c in chunks for ch in c["choices"] if ch["logprobs"]
           for e in ch["logprobs"]["content"]]
    want = full["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in got] == [e["token"] for e in want]
    for a, b in zip(got, want):
        assert [t["token"] for t in a["top_logprobs"]] == [t["token"] for t in b["top_logprobs"]]
        np.testing.assert_allclose([t["logprob"] for t in a["top_logprobs"]],
                                   [t["logprob"] for t in b["top_logprobs"]], atol=1e-5)
    # the official client parses the streamed entries
    n = 0
    for c in client.chat.completions.create(stream=True, **body):
        for ch in c.choices:
            n += sum(len(e.top_logprobs) == 4 for e in (ch.logprobs.content or [])) \
                if ch.logprobs else 0
    assert n == len(want)
    # completions stream: top_logprobs dicts and offsets continuing across chunks
    cb = {"model": server.model_id, "prompt": "abc", "max_tokens": 6, "temperature": 0,
          "logprobs": 2}
    whole = client.completions.create(**cb).choices[0].logprobs
    parts = _sse(url + "/completions", dict(cb, stream=True))
    lps = [c["choices"][0]["logprobs"] for c in parts if c["choices"][0]["logprobs"]]
    assert [t for x in lps for t in x["tokens"]] == whole.tokens
    assert [o for x in lps for o in x["text_offset"]] == whole.text_offset
    streamed = [d for x in lps for d in x["top_logprobs"]]
    assert len(streamed) == len(whole.top_logprobs)
    for a, b in zip(streamed, whole.top_logprobs):
        assert a == pytest.approx(b, abs=1e-5)


def test_engine_hands_streamed_tokens_their_top_logprobs():
    """The streaming hook's path (a host call every step) gives each token the top entries a
    whole-chunk decode gives; a sequence that asked for none gets none beside it."""
    from rossjax import models
    from rossjax.engine import Engine, SamplingParams

    cfg = models.get_preset("tiny_qwen2", initializer_range=0.2)
    params = models.init_params(cfg, jax.random.key(1))
    sps = [SamplingParams(max_new_tokens=6, top_logprobs=3),
           SamplingParams(max_new_tokens=6, temperature=0.8, seed=2)]

    def run(stream):
        eng = Engine(cfg, params, slots=2, max_len=64, chunk=8)
        calls = []
        eng.stream_to(lambda by_seq: calls.append(by_seq) and False, 0.0)
        ids = [eng.submit([5, 9, 2, 7], sp, stream=stream)[0] for sp in sps]
        tops = {i: [] for i in ids}
        while eng.busy:
            for u in eng.step():
                tops[u.seq_id] += u.top_logprobs
        return ids, tops, calls

    ids, whole, _ = run(False)
    sids, whole_s, calls = run(True)
    assert calls and all(len(v) == 3 for c in calls for s, v in c.items() if s == sids[0])
    assert all(len(v) == 2 for c in calls for s, v in c.items() if s == sids[1])
    assert len(whole[ids[0]]) == 6 and whole[ids[1]] == [] and whole_s[sids[1]] == []
    # what the calls handed out is the start of the sequence's entries (the rest, after the
    # last call, comes with the chunk's Update), and those equal the unstreamed run's
    got = [t for c in calls for t in c.get(sids[0], ((), (), []))[2]]
    assert 1 <= len(got) and got == whole_s[sids[0]][:len(got)]
    for a, b in zip(whole_s[sids[0]], whole[ids[0]]):
        assert [t for t, _ in a] == [t for t, _ in b]
        np.testing.assert_allclose([lp for _, lp in a], [lp for _, lp in b], atol=1e-5)


@pytest.mark.parametrize("route, kw, field", [
    ("chat", dict(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("chat", dict(logprobs=True, top_logprobs=-1), "top_logprobs"),
    ("chat", dict(top_logprobs=2), "top_logprobs"),          # needs logprobs=true
    ("chat", dict(logprobs=True, top_logprobs=2.5), "top_logprobs"),
    ("text", dict(logprobs=6), "logprobs"),
    ("text", dict(logprobs=-1), "logprobs"),
    ("text", dict(logprobs=True), "logprobs"),
])
def test_k_out_of_range_is_a_400_naming_the_field(served, route, kw, field):
    server, client, _, _ = served
    with pytest.raises(openai.BadRequestError) as e:
        if route == "chat":
            client.chat.completions.create(model=server.model_id, max_tokens=2,
                                           messages=[{"role": "user", "content": "x"}], **kw)
        else:
            client.completions.create(model=server.model_id, prompt="x", max_tokens=2, **kw)
    assert e.value.status_code == 400 and f"'{field}'" in e.value.message


def _cached(client, model_id, user, **kw):
    r = client.chat.completions.create(model=model_id, max_tokens=3, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": user}], **kw)
    return r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens, r


def test_cached_tokens_count_the_reused_prefix_and_are_0_with_the_cache_off(served):
    server, client, url, _ = served
    first, _, r1 = _cached(client, server.model_id, "Is 1=1?")
    second, n_prompt, r2 = _cached(client, server.model_id, "Is 2=3?")
    assert first == 0
    assert 16 <= second < n_prompt and second % 16 == 0    # whole blocks of the shared prefix
    # streamed: the usage chunk carries it too
    body = {"model": server.model_id, "max_tokens": 3, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "Is 4=4?"}]}
    usage = [c["usage"] for c in _sse(url + "/chat/completions", body) if c.get("usage")]
    assert usage[-1]["prompt_tokens_details"]["cached_tokens"] >= 16
    # rossjax serve --noprefix_cache: the same requests prefill whole (same compiled programs)
    off = serve.build(server.path, slots=4, max_len=256, chunk=4, prefix_cache=False)
    url_off, stop = serve.start_background(off)
    try:
        c_off = openai.OpenAI(base_url=url_off, api_key="none", max_retries=0, timeout=120)
        got = [_cached(c_off, off.model_id, u) for u in ("Is 1=1?", "Is 2=3?")]
        assert [g[0] for g in got] == [0, 0]
        # the same greedy answers either way
        assert [g[2].choices[0].message.content for g in got] == \
            [r.choices[0].message.content for r in (r1, r2)]
    finally:
        stop()


def test_serve_cli_has_the_prefix_cache_flag():
    from rossjax.cli.flags import parse_config
    from rossjax.cli.serve import _flags

    for argv, want in ((["--model=m"], True), (["--model=m", "--noprefix_cache"], False),
                       (["--model=m", "--prefix_cache=false"], False)):
        _, args, extra = parse_config(argv, extra_flags=_flags)
        assert not extra and args.prefix_cache is want
