"""`rossjax bench serve` (issue 43 item 4) without vLLM: the load, the figures and the sameness
verdict against scripted OpenAI-compatible servers (one agreeing, one whose greedy tokens differ,
one that ends answers early), and the bench's model through `rossjax serve` at 1-2 streams: its
end tokens are unreachable, so every request runs to its max_tokens."""

import asyncio
import json
import threading
import types

import pytest

from rossjax.bench import serve as bench_serve

MIX = [(8, 6), (16, 4)]


def _token(prompt, j, shift):
    return chr(65 + (sum(prompt) + j + shift) % 26)


def _scripted(shift=0, short=0):
    """A completions server on 127.0.0.1: token j of a prompt's answer is a fixed letter."""
    from aiohttp import web

    async def completions(request):
        body = await request.json()
        n = max(1, body["max_tokens"] - short)
        toks = [_token(body["prompt"], j, shift) for j in range(n)]
        lps = [-0.5 - 0.2 * shift] * n
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "".join(toks), "logprobs": {
                "tokens": toks, "token_logprobs": lps}}]})
        r = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await r.prepare(request)
        for t in toks:
            ev = {"choices": [{"text": t, "logprobs": {"tokens": [t], "token_logprobs": lps[:1]}}]}
            await r.write(f"data: {json.dumps(ev)}\n\n".encode())
            await asyncio.sleep(0.001)
        await r.write(b"data: [DONE]\n\n")
        return r

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    loop, box, ready = asyncio.new_event_loop(), {}, threading.Event()

    async def start():
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"], box["port"] = runner, runner.addresses[0][1]

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)

    def stop():
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)

    return f"http://127.0.0.1:{box['port']}/v1", stop


@pytest.fixture(scope="module")
def sides():
    servers = {k: _scripted(**kw) for k, kw in
               {"ours": {}, "same": {}, "other": {"shift": 1}, "short": {"short": 1}}.items()}
    args = types.SimpleNamespace(streams=[1, 2], check_tokens=5, peer="vllm")
    prompts = [pr for pr, _, _ in bench_serve.make_jobs(MIX, 2, 99)]
    res = {k: bench_serve.run_side(k, url, "m", args, MIX, prompts)
           for k, (url, _) in servers.items()}
    yield args, res
    for _, stop in servers.values():
        stop()


def _report(args, ours, peer):
    return bench_serve.report(ours, peer, "peer", args, {"threads": 2}, {"threads": 2}, "")


def test_agreeing_peer_passes_with_every_figure(sides, capsys):
    args, res = sides
    r = res["ours"]["rows"][2]
    # 2 x streams requests, at least 6: (6 + 4) x 3 tokens, each its own event
    assert r["tokens"] == 30 and r["short"] == 0 and r["tok_per_event"] == 1.0
    assert 0 < r["ttft_p50"] <= r["ttft_p99"] and 0 < r["itl_p50"] <= r["itl_p99"]
    assert _report(args, res["ours"], res["same"]) == 0
    out = capsys.readouterr().out
    assert "sameness checks passed" in out and "greedy check (2 prompts x 5 tokens): same tokens" in out
    assert "settings: rossjax threads 2 | peer threads 2" in out
    assert "target at 2 streams" in out and "load average (1 min)" in out
    assert out.count("x | ") == 2       # one ratio row per concurrency


def test_different_greedy_tokens_fail(sides, capsys):
    args, res = sides
    assert _report(args, res["ours"], res["other"]) == 1
    assert "sameness check failed: greedy prompt 0" in capsys.readouterr().err


def test_early_ends_fail(sides, capsys):
    args, res = sides
    assert res["short"]["rows"][1]["short"] == 6
    assert _report(args, res["ours"], res["short"]) == 1
    assert "fewer tokens than max_tokens" in capsys.readouterr().err


def test_a_tie_passes_and_a_logprob_gap_fails():
    a = {"tokens": ["A", "B", "C"], "logprobs": [-1.0, -2.0, -2.0]}
    tie = {"tokens": ["A", "D", "E"], "logprobs": [-1.0, -2.0004, -3.0]}
    gap = {"tokens": ["A", "B", "C"], "logprobs": [-1.0, -2.1, -2.0]}
    fail, seen = bench_serve.same_greedy([a, a, a], [tie, a, a])
    assert fail is None and seen.startswith("a tie at token 1") and "same tokens" in seen
    fail, _ = bench_serve.same_greedy([a], [gap])
    assert "differ by 0.1" in fail
    fail, _ = bench_serve.same_greedy([a, a], [tie, tie])     # ties on more than half the prompts
    assert "differ on 2 of 2 prompts" in fail


def test_bench_model_never_ranks_an_end_token_high(tmp_path):
    """The bench's model (transformers' Qwen2 class, as the peers load it): at every position of
    random prompts the end tokens' logits are far below every other token's, and the others
    spread (not one token always on top; about 1 at the bench's width, 512, less at 64)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rossjax.bench import serve_model

    info = serve_model.write_model(str(tmp_path), max_len=64, hidden_size=64,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=128)
    assert info["params"] < 100_000
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    ids = torch.tensor([pr for pr, _, _ in bench_serve.make_jobs([(16, 1)], 4, 5)])
    with torch.no_grad():
        logits = model(ids).logits                       # (4, 16, 131)
    ends = logits[..., list(serve_model.END_IDS)]
    others = logits[..., :128]
    assert (ends.max(-1).values < others.min(-1).values - 10).all()
    assert others.std() > 0.05 and len(set(others.argmax(-1).flatten().tolist())) > 4


def test_bench_serve_help_names_its_flags():
    from rossjax.cli import bench as cli_bench
    from rossjax.cli.flags import HelpRequested

    with pytest.raises(HelpRequested) as e:
        cli_bench.main(["serve", "--help"])
    out = str(e.value)
    assert bench_serve.__doc__.strip().splitlines()[0] in out
    assert "--peer" in out and "--streams" in out and "(default: 1,8,32)" in out
