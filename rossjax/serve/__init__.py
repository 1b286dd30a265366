"""`rossjax serve`: an OpenAI-compatible server over the rollout engine, for running review, the
reconstruction agent and model solvers fully offline on a local checkpoint.

  worker   the engine's thread (continuous batching across concurrent requests, stop strings,
           incremental detokenization)
  app      the aiohttp handlers: /v1/models, /v1/chat/completions, /v1/completions, /health,
           /tokenize, /detokenize

    server = build("runs/sft/export", slots=16, max_len=2048)   # or a run's workdir: runs/sft
    url, stop = start_background(server, port=0)      # tests, notebooks
    serve(server, host="127.0.0.1", port=8000, api_key=None)        # the command

Chat prompts render with the model folder's chat template (the tokenizer's jinja) when it has
one, else rossjax's built-in chatml (or `template=`), cut where the assistant's answer starts,
exactly as GRPO renders its prompts. Generation stops at the tokenizer's end-of-turn tokens.

With `api_key` every path but /health needs `Authorization: Bearer KEY` (guard.auth_middleware);
bad input of any kind is a 4xx (guard).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import threading

from rossjax.errors import ConfigError

# End-of-turn / end-of-text tokens the common templates close a turn with.
_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>", "<|end|>",
               "<|eom_id|>")


def build(model: str, tokenizer: str | None = None, *, template: str | None = None,
          slots: int = 16, max_len: int = 2048, model_id: str | None = None,
          dtype: str = "float32", chunk: int = 16, step: int | None = None,
          stream_gap_s: float = 0.02, prefix_cache: bool = True, warmup: bool = False):
    """Load the model folder (or preset:NAME, or a training / GRPO workdir: its latest
    checkpoint, or `step`) and tokenizer; start the engine thread. A streamed request's tokens
    leave as the decode steps make them, at most every `stream_gap_s` (each token alone once a
    step takes longer: rossjax.engine.stream). prefix_cache: a prompt sharing a prefix with
    what a slot's cache holds (the same system prompt and tools, a conversation's history)
    reuses that KV instead of prefilling it (rossjax.engine.prefix). warmup: compile the
    programs a load meets before serving (Engine.warmup; 75 programs in 144 s on 2 CPU cores for
    a 32-slot, 512-column server), so no request waits for a compile."""
    from rossjax.engine import Engine
    from rossjax.models import loading
    from rossjax.serve.app import Server
    from rossjax.serve.worker import EngineWorker
    from rossjax.templates import TEMPLATES
    from rossjax.tokenizers import load_tokenizer
    from rossjax.train.export.model import is_run_dir, load_model_dir

    run_cfg = run_template = None
    if not model.startswith("preset:") and is_run_dir(model):
        # a training or GRPO workdir: its latest checkpoint (or `step`, LoRA merged), the run's
        # tokenizer and template, as `rossjax generate` loads it (its config.json is the run's)
        try:
            run_cfg, params, tok_spec, run_template, _ = load_model_dir(model, step, dtype)
        except FileNotFoundError as e:
            raise ConfigError(f"rossjax serve: {e}") from None
        tok_spec = tokenizer or tok_spec
        if tok_spec is None:
            raise ConfigError(f"rossjax serve: --model {model} is a run whose tokenizer is not "
                              f"known; pass --tokenizer=HF_DIR (or a name such as qwen).")
    else:
        section = loading.section_from_spec(model, dtype, where="--model")
        tok_spec = tokenizer or (model if os.path.isdir(model) else None)
    if tok_spec is None:
        raise ConfigError("rossjax serve: --tokenizer is needed when --model is a preset.")
    try:
        tok = load_tokenizer(tok_spec)
    except FileNotFoundError:
        raise ConfigError(f"rossjax serve: {tok_spec} has no tokenizer; pass --tokenizer=NAME|PATH.") \
            from None
    template = template or run_template or ("tokenizer" if tok.chat_template else "chatml")
    if template not in TEMPLATES:
        raise ConfigError(f"rossjax serve: --template {template!r} is not one of "
                          f"{', '.join(TEMPLATES)}.")
    if run_cfg is None:
        cfg, params = loading.load_model(section, field="--model")
    else:
        cfg = run_cfg
    ends = {tok.special_tokens[t] for t in _END_TOKENS if t in tok.special_tokens}
    if tok.eos_id is not None:
        ends.add(tok.eos_id)
    text_ends = {tok.eos_id} if tok.eos_id is not None else set()
    if "<|endoftext|>" in tok.special_tokens:
        text_ends.add(tok.special_tokens["<|endoftext|>"])
    # min_rows=1: a lone stream decodes one row, not eight (rossjax.engine.Engine)
    eng = Engine(cfg, params, slots=slots, max_len=max_len, n_stop=max(len(ends), 1), chunk=chunk,
                 prefix_cache=prefix_cache, min_rows=1)
    if warmup:
        eng.warmup()
    name = model_id or os.path.basename(os.path.normpath(model)) or model
    return Server(EngineWorker(eng, tok, stream_gap_s), tok, model_id=name, template=template,
                  chat_stop_ids=tuple(sorted(ends)), text_stop_ids=tuple(sorted(text_ends)))


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The warning for a server anyone on the network can use (a non-loopback host, no key)."""
    if api_key:
        return None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:      # a host name other than localhost: it may resolve to anything
        loopback = False
    if loopback:
        return None
    return (f"rossjax serve: warning: --host={host} with no API key: anyone who can reach this "
            f"port can run the model; pass --api_key=KEY (or set ROSSJAX_API_KEY) to require "
            f"'Authorization: Bearer KEY'.")


def start_background(server, host: str = "127.0.0.1", port: int = 0, *,
                     api_key: str | None = None, max_body: int | None = None):
    """Serve on a thread of its own; returns (base url, stop()). port 0 picks a free port."""
    from aiohttp import web

    from rossjax.serve.guard import MAX_BODY

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box = {}

    async def start():
        runner = web.AppRunner(server.app(api_key, max_body or MAX_BODY))
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        box["runner"] = runner
        box["port"] = runner.addresses[0][1]

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=run, name="rossjax-serve", daemon=True)
    t.start()
    ready.wait(30)

    def stop():
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
        server.worker.close()

    return f"http://{host}:{box['port']}/v1", stop


def serve(server, host: str = "127.0.0.1", port: int = 8000, *, api_key: str | None = None):
    """Serve until interrupted (the command)."""
    from aiohttp import web

    try:
        web.run_app(server.app(api_key), host=host, port=port, print=None)
    finally:
        server.worker.close()
