"""`rossjax bench curate`: mask-compilation and verification throughput on this machine.

Compiles N synthetic rollouts (~2,000 Qwen tokens each; 60% single-turn math with keep anchors,
40% agentic multi-turn with tool calls and exclude/protect selectors) with the real Qwen tokenizer
over a process pool, and prints rollouts/s and tokens/s. The peer is the obvious slime-style
compiler, written without rossjax's renderer or selectors (ChatML by hand, anchors by str.find,
tiktoken's own `decode_with_offsets`, a per-character Python mask and a per-token `any()` loop),
run single-process on a subset next to ours; the ratio is printed. Then math
(math-verify) and code (sandboxed HumanEval-style tests) verification throughput in programs/s.
Targets on 2 CPU cores: >= 500 rollouts/s compiled, >= 20 sandboxed programs/s.

    rossjax bench curate [--n 10000] [--tokens 2000] [--workers 2] [--verify_n 200] [--code_n 100]
                         [--beam N]   (N rollouts curated locally and on Beam: rows/s of each)
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import time

import numpy as np

_WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an have not "
    "which but all were when we there can been has more if no so what up out about into than "
    "them only other new some could time these two may then first any like now my such make "
    "over our even most after also did many before must through back years where much your "
    "way well down should because each just those people how too little state good very "
    "value function return list index count total result number array string error test "
    "check case input output sum product factor prime square root equation solve term "
    "x y z n k 0 1 2 3 4 5 7 9 12 + - = * / ( ) [ ] , . : ; é naïve résumé 日本 ✓ → ≤"
).split()
_TOOL = "bash"


def _text(rng, n_words: int, per_line: int = 14) -> str:
    w = np.asarray(_WORDS)[rng.integers(0, len(_WORDS), n_words)]
    lines = [" ".join(w[i:i + per_line]) for i in range(0, n_words, per_line)]
    return "\n".join(lines)


def synth_record(i: int, target_tokens: int = 2000, seed: int = 0) -> dict:
    """Deterministic synthetic rollout number i (anchor words never occur in the word pool)."""
    rng = np.random.default_rng([seed, i])
    words = int(target_tokens * 0.8)  # ~1.25 Qwen tokens per pool word
    if i % 5 < 3:  # keep-mode math
        ans = int(rng.integers(1, 10 ** 6))
        reasoning = (_text(rng, words * 3 // 4) + "\nLet me verify this step.\n"
                     + _text(rng, words // 8))
        content = _text(rng, words // 8) + f"\nThe answer is \\boxed{{{ans}}}."
        return {"id": f"syn-math-{i}", "task": {"id": f"t{i}", "domain": "math",
                                                "reference": str(ans)},
                "source": {"run": "bench", "step": i}, "reward": 1.0,
                "messages": [{"role": "system", "content": "Reason step by step."},
                             {"role": "user", "content": _text(rng, 40)},
                             {"role": "assistant", "reasoning": reasoning, "content": content}],
                "annotation": {"status": "accept", "keep": [
                    {"message": 2, "start": "Let me verify this step.",
                     "end": f"\\boxed{{{ans}}}."}]}}
    msgs = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": _text(rng, 40)}]
    for t in range(3):
        msgs.append({"role": "assistant", "content": _text(rng, words // 6),
                     "tool_calls": [{"name": _TOOL, "arguments": {"cmd": f"pytest -q -k t{t}"}}]})
        msgs.append({"role": "tool", "name": _TOOL, "content": _text(rng, words // 10)})
    msgs.append({"role": "assistant", "content": _text(rng, words // 10)})
    line2 = msgs[2]["content"].split("\n")[1]
    return {"id": f"syn-agent-{i}", "task": {"id": f"t{i}", "domain": "swe"},
            "source": {"run": "bench", "step": i}, "reward": 1.0, "messages": msgs,
            "annotation": {"status": "revise",
                           "exclude": [{"message": 2, "line": 2, "quote": line2.split(" ")[0]},
                                       {"message": 4, "line": 3}],
                           "protect": [{"message": 6, "line": 1}],
                           "omissions": [{"message": 4, "note": "skipped a check"}]}}


_TOK = None


def _init(spec):
    global _TOK
    from rossjax.tokenizers import load_tokenizer

    _TOK = load_tokenizer(spec)


def _work(args):
    from rossjax.curate.masks import compile_rollout

    start, count, tokens, seed = args
    t0 = time.perf_counter()
    recs = [synth_record(i, tokens, seed) for i in range(start, start + count)]
    t1 = time.perf_counter()
    status = collections.Counter()
    n_tok = n_sup = n_elig = 0
    for r in recs:
        ex = compile_rollout(r, _TOK)
        status[ex.reason or ex.status] += 1
        n_tok += len(ex.input_ids)
        n_sup += ex.n_supervised
        n_elig += ex.n_eligible
    return dict(n=count, tokens=n_tok, sup=n_sup, elig=n_elig, status=status,
                gen_s=t1 - t0, compile_s=time.perf_counter() - t1)


def _peer_chatml(messages):
    """ChatML in Qwen3's layout written out by hand (no rossjax renderer): the text, each assistant
    turn's trained span [start of <think> or content, end of <|im_end|>), and where each
    assistant part's own text starts."""
    text, trained, where = "", [], {}
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                text += "<|im_start|>user"
            text += "\n<tool_response>\n" + content + "\n</tool_response>"
            if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                text += "<|im_end|>\n"
            continue
        text += f"<|im_start|>{role}\n"
        if role != "assistant":
            text += content + "<|im_end|>\n"
            continue
        start = len(text)
        if m.get("reasoning") is not None:
            text += "<think>\n"
            where[(i, "reasoning")] = (len(text), m["reasoning"])
            text += m["reasoning"] + "\n</think>\n\n"
        where[(i, "content")] = (len(text), content)
        text += content
        calls = [json.dumps({"name": c["name"]}, ensure_ascii=False)[:-1] + ', "arguments": '
                 + json.dumps(c["arguments"], ensure_ascii=False) + "}"
                 for c in m.get("tool_calls") or []]
        if calls:
            text += ("\n" if content else "") + "\n".join(
                f"<tool_call>\n{c}\n</tool_call>" for c in calls)
        where[(i, "body_end")] = len(text)
        text += "<|im_end|>"
        trained.append((start, len(text)))
        text += "\n"
    return text, trained, where


def peer_compile(record, tok) -> np.ndarray:
    """The obvious slime-style compiler, independent of rossjax's renderer and selectors: ChatML
    by hand, anchors by str.find, lines by str.split, tiktoken's own offsets, per-character
    lists and a per-token any(). It follows docs/data.md's rules, so equal masks check them."""
    text, trained, where = _peer_chatml(record["messages"])
    ann = record.get("annotation") or {}
    ids = tok._enc.encode(text, allowed_special="all")
    _, starts = tok._enc.decode_with_offsets(ids)
    ends = starts[1:] + [len(text)]
    elig = [False] * len(text)
    for s, e in trained:
        for c in range(s, e):
            elig[c] = True
    keep = [not ann.get("keep")] * len(text)
    for k in ann.get("keep") or []:
        msg = k["message"]
        texts = [where[key] for key in ((msg, "reasoning"), (msg, "content")) if key in where]
        # Each anchor occurs exactly once, inside one part's text.
        lo, hi = (next(base + body.find(k[name]) for base, body in texts if body.count(k[name]))
                  for name in ("start", "end"))
        hi += len(k["end"])
        if hi >= where[(msg, "body_end")]:  # kept to the turn's last words: <|im_end|> too
            hi = where[(msg, "body_end")] + len("<|im_end|>")
        for c in range(lo, hi):
            keep[c] = True
    excl = [False] * len(text)
    for sel in ann.get("exclude") or []:
        base, body = where[(sel["message"], sel.get("part", "content"))]
        lines = body.split("\n")
        off = base + sum(len(ln) + 1 for ln in lines[:sel["line"] - 1])
        line = lines[sel["line"] - 1]
        if sel.get("quote") is None:
            lo, hi = off, off + len(line)
        else:
            at = -1
            for _ in range(sel.get("occurrence", 0) + 1):
                at = line.find(sel["quote"], at + 1)
            lo, hi = off + at, off + at + len(sel["quote"])
        for c in range(lo, hi):
            excl[c] = True
    return np.array([any(elig[s:e]) and any(keep[s:e]) and not any(excl[s:e])
                     for s, e in zip(starts, ends)], np.uint8)


def bench_compile(n, tokens, workers, spec, seed=0):
    per = [n // workers + (1 if k < n % workers else 0) for k in range(workers)]
    jobs, start = [], 0
    for c in per:
        jobs.append((start, c, tokens, seed))
        start += c
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")  # workers never inherit a parent's jax or threads
    with ctx.Pool(workers, initializer=_init, initargs=(spec,)) as pool:
        res = pool.map(_work, jobs)
    wall = time.perf_counter() - t0
    status = sum((r["status"] for r in res), collections.Counter())
    compile_s = max(r["compile_s"] for r in res)  # the pool is as fast as its slowest worker
    toks = sum(r["tokens"] for r in res)
    sup, elig = sum(r["sup"] for r in res), sum(r["elig"] for r in res)
    return dict(n=n, tokens=toks, compile_s=compile_s, wall=wall, status=status,
                ter=1 - sup / max(elig, 1))


def bench_peer(n_peer, tokens, spec, seed=0):
    from rossjax.curate.masks import compile_rollout
    from rossjax.tokenizers import load_tokenizer

    tok = load_tokenizer(spec)
    recs = [synth_record(i, tokens, seed) for i in range(n_peer)]
    t0 = time.perf_counter()
    ours = [compile_rollout(r, tok) for r in recs]
    t1 = time.perf_counter()
    peer = [peer_compile(r, tok) for r in recs]
    t2 = time.perf_counter()
    same = all(np.array_equal(o.loss_mask, p) for o, p in zip(ours, peer))
    return t1 - t0, t2 - t1, same


def _math_records(n):
    recs = []
    for i in range(n):
        a, b = 3 + i % 97, 7 + i % 89
        ans = f"\\frac{{{a}}}{{{b}}}" if i % 2 else str(a * b)
        recs.append({"id": f"vm{i}", "task": {"id": f"vm{i}", "domain": "math",
                                              "reference": ans if i % 2 else str(a * b)},
                     "messages": [{"role": "user", "content": f"Compute {a}*{b}."},
                                  {"role": "assistant",
                                   "content": f"So the answer is \\boxed{{{ans}}}."}]})
    return recs


def _code_records(n):
    recs = []
    for i in range(n):
        body = "    return sorted(xs)[-k:][::-1]\n" if i % 4 else "    return sorted(xs)[:k]\n"
        recs.append({"id": f"vc{i}", "task": {
            "id": f"vc{i}", "domain": "code", "entry_point": "top_k",
            "tests": (f"def check(f):\n    assert f([3, 1, {i}, 2], 2) == "
                      f"sorted([3, 1, {i}, 2])[-2:][::-1]\n")},
            "messages": [{"role": "user", "content": "Write top_k(xs, k)."},
                         {"role": "assistant", "content":
                          f"```python\ndef top_k(xs, k):\n{body}```"}]})
    return recs


def bench_verify(n_math, n_code, workers):
    try:
        from rossjax.verify.pool import WorkerPool, verify_records
    except ImportError as e:
        print(f"verification: not available in this build ({e})")
        return
    for name, recs in (("math", _math_records(n_math)), ("code", _code_records(n_code))):
        if not recs:
            continue
        with WorkerPool(workers) as pool:
            verify_records(pool, recs[: 2 * workers])  # warm: worker start-up and imports are not timed
            t0 = time.perf_counter()
            verdicts = verify_records(pool, recs)
            dt = time.perf_counter() - t0
        passed = sum(v.passed is True for v in verdicts)
        target = " (target >= 20 sandboxed programs/s)" if name == "code" else ""
        print(f"verify {name:5s}: {len(recs)} programs in {dt:.2f} s = {len(recs) / dt:.1f} "
              f"programs/s on {workers} workers; {passed} passed{target}")


def bench_beam(n, tokens, workers, spec, seed=0):
    """Rows/s of `rossjax curate` on the same synthetic file: the local pipeline (grain, `workers`
    compile processes) and the Beam DirectRunner (`workers` worker processes); stored verdicts,
    so both time reading, the row policy, compiling and writing."""
    import json
    import tempfile

    try:
        import apache_beam  # noqa: F401
    except ImportError:
        print('beam: apache-beam is not installed (pip install "rossjax[beam]"); line skipped')
        return
    from ml_collections import ConfigDict

    from rossjax.curate import beam, pipeline
    from rossjax.curate.compiled import read_compiled

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pool.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for i in range(n):
                rec = synth_record(i, tokens, seed)
                rec["verifier"] = {"name": "math", "passed": True, "evidence": "stored"}
                f.write(json.dumps(rec) + "\n")
        cfg = dict(input=path, tokenizer=spec, template="chatml", max_length=0,
                   mask_mode="annotated", rows="accepted", verify="stored", verify_workers=0,
                   undecided="withhold", unverified="keep", workers=workers, chunk_rows=4096,
                   examples_per_shard=8192, progress=False, beam_retries=0,
                   beam_args=f"--runner=DirectRunner --direct_num_workers={workers} "
                             f"--direct_running_mode=multi_processing")
        rates = {}
        for name, fn in (("local", pipeline.curate), ("beam", beam.curate)):
            t0 = time.perf_counter()
            fn(ConfigDict({**cfg, "output": os.path.join(tmp, name)}))
            rates[name] = n / (time.perf_counter() - t0)
        same = all(a["id"] == b["id"] and np.array_equal(a["input_ids"], b["input_ids"])
                   and np.array_equal(a["loss_mask"], b["loss_mask"])
                   for a, b in zip(read_compiled(os.path.join(tmp, "local")),
                                   read_compiled(os.path.join(tmp, "beam"))))
    print(f"beam: {n} rollouts (~{tokens} tokens) end to end: DirectRunner {workers} workers "
          f"{rates['beam']:.0f} rows/s vs local pipeline ({workers} grain workers) "
          f"{rates['local']:.0f} rows/s; same examples: {same}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rossjax bench curate", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000, help="synthetic rollouts to compile")
    ap.add_argument("--tokens", type=int, default=2000, help="approximate tokens per rollout")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--tokenizer", default="qwen")
    ap.add_argument("--peer_n", type=int, default=200, help="rollouts for the peer comparison")
    ap.add_argument("--verify_n", type=int, default=200, help="math programs to verify")
    ap.add_argument("--code_n", type=int, default=100, help="code programs to run sandboxed")
    ap.add_argument("--beam", type=int, default=0, metavar="N",
                    help="also curate N rollouts locally and on Beam's DirectRunner (rows/s)")
    args = ap.parse_args(argv)

    r = bench_compile(args.n, args.tokens, args.workers, args.tokenizer)
    rate = r["n"] / r["compile_s"]
    print(f"compile: {r['n']} rollouts, {r['tokens']} tokens ({r['tokens'] / r['n']:.0f}/rollout) "
          f"on {args.workers} workers")
    print(f"compile: {rate:.0f} rollouts/s, {r['tokens'] / r['compile_s'] / 1e6:.2f} M tokens/s "
          f"(target >= 500 rollouts/s); end to end incl. pool start and synthesis "
          f"{r['n'] / r['wall']:.0f} rollouts/s")
    print(f"compile: buckets {dict(r['status'])}, TER {r['ter']:.3f}")
    if args.peer_n:
        ours, peer, same = bench_peer(args.peer_n, args.tokens, args.tokenizer)
        print(f"peer (slime-style per-char mask, 1 process, {args.peer_n} rollouts): "
              f"{args.peer_n / peer:.0f} rollouts/s vs rossjax {args.peer_n / ours:.0f} "
              f"rollouts/s -> ratio {peer / ours:.1f}x; identical masks: {same}")
    bench_verify(args.verify_n, args.code_n, args.workers)
    if args.beam:
        bench_beam(args.beam, args.tokens, args.workers, args.tokenizer)
    if not args.peer_n:
        return 0
    from rossjax.bench import compare

    # the peer's masks are the sameness check: both compilers must mask the very same tokens
    return compare.verdict("bench curate", [
        None if same else f"the peer's token masks differ from rossjax's on some of the "
                          f"{args.peer_n} rollouts"])
