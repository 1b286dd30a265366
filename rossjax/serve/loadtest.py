"""A small streaming load test of an OpenAI-compatible server (issue 43 items 5 and 6): time to
first token, the gaps between stream events and output tokens/s at a few concurrencies.

    python -m rossjax.serve.loadtest --url=http://127.0.0.1:8000/v1 --streams=1,8
    python -m rossjax.serve.loadtest --model=DIR --streams=1,8      # starts `rossjax serve`

Each stream sends completions requests with token-id prompts (seeded, logprobs=1, so every
event says how many tokens it carries); the same seeds give the same tokens from run to run.
--system=N gives every request the same N-token prefix before its own short turn (a
reconstruct-like workload: one long system prompt, different user turns). Rounds repeat each
setting; the figures printed are their medians, with the CPU model. No jax here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import urllib.request


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cpus)"
    except OSError:
        pass
    return platform.processor() or "unknown"


async def _one(session, url, model, prompt, max_tokens, seed):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0,
            "seed": seed, "logprobs": 1, "stream": True}
    t0 = time.perf_counter()
    times, counts = [], []
    async with session.post(url + "/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            c = json.loads(line[6:])["choices"]
            k = len(c[0]["logprobs"]["tokens"]) if c and c[0].get("logprobs") else 0
            if k:
                times.append(time.perf_counter())
                counts.append(k)
    return t0, times, counts


async def _round(url, model, streams, requests, prompt_of, max_tokens):
    import aiohttp

    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        todo = list(range(requests))

        async def worker():
            while todo:
                i = todo.pop(0)
                out.append(await _one(session, url, model, prompt_of(i), max_tokens, 1000 + i))

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        wall = time.perf_counter() - t
    toks = sum(sum(c) for _, _, c in out)
    ttft = [ts[0] - t0 for t0, ts, _ in out if ts]
    gaps = [b - a for _, ts, _ in out for a, b in zip(ts, ts[1:])]
    per_event = toks / max(1, sum(len(c) for _, _, c in out))
    return {"tok_s": toks / wall, "ttft_p50": statistics.median(ttft),
            "gap_p50": statistics.median(gaps) if gaps else 0.0,
            "gap_p99": sorted(gaps)[int(0.99 * (len(gaps) - 1))] if gaps else 0.0,
            "tokens_per_event": per_event, "tokens": toks}


def measure(url, model, streams, *, rounds=3, requests=None, max_tokens=128, system=0,
            user=24, vocab=120):
    """Medians over `rounds` of _round's figures at `streams` concurrent streams."""
    rng = random.Random(0)
    prefix = [rng.randrange(1, vocab) for _ in range(system)]
    turns = [[rng.randrange(1, vocab) for _ in range(user)] for _ in range(256)]
    prompt_of = lambda i: prefix + turns[i % len(turns)]
    requests = requests or max(16, 4 * streams)
    asyncio.run(_round(url, model, streams, streams, prompt_of, 8))     # warm the programs
    res = [asyncio.run(_round(url, model, streams, requests, prompt_of, max_tokens))
           for _ in range(rounds)]
    return {k: statistics.median(r[k] for r in res) for k in res[0]}


def start_server(model_dir, port, code=None, **kw):
    """`rossjax serve`'s build + serve in a child process (PYTHONPATH=code to serve another
    checkout's rossjax); returns (url, model id, process)."""
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    src = (f"import rossjax, sys; print('serving', rossjax.__file__, file=sys.stderr); "
           f"from rossjax import serve; s = serve.build({model_dir!r}, model_id='m', {args}); "
           f"serve.serve(s, port={port})")
    # cwd too: `python -c` puts the working directory ahead of PYTHONPATH
    proc = subprocess.Popen([sys.executable, "-c", src], env=env, cwd=code or None)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return url + "/v1", "m", proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("the server exited") from None
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not start")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--model_id", default=None)
    ap.add_argument("--model", help="a model folder: start a server on it")
    ap.add_argument("--code", help="PYTHONPATH for that server (another checkout)")
    ap.add_argument("--port", type=int, default=8431)
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max_tokens", type=int, default=128)
    ap.add_argument("--system", type=int, default=0)
    ap.add_argument("--server_kw", default="{}", help="JSON: serve.build keyword arguments")
    a = ap.parse_args(argv)
    proc = None
    if a.model:
        url, model, proc = start_server(a.model, a.port, a.code, **json.loads(a.server_kw))
    else:
        url, model = a.url, a.model_id
    try:
        for n in [int(x) for x in a.streams.split(",")]:
            r = measure(url, model, n, rounds=a.rounds, max_tokens=a.max_tokens,
                        system=a.system)
            print(json.dumps({"streams": n, **{k: round(v, 4) for k, v in r.items()},
                              "cpu": cpu_model()}), flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
