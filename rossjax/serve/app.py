"""The OpenAI-compatible HTTP surface (aiohttp): /v1/models (with vLLM's max_model_len: the
--max_len), /v1/chat/completions (tools and tool turns: tools.py), /v1/completions, and vLLM's
/health, /tokenize, /detokenize; each request a job on the engine thread (rossjax.serve.worker).

aiohttp because one maintained library gives the asyncio server, streamed responses (SSE) and
graceful shutdown with no ASGI layer in between; handlers only parse, queue and format.

Fields: n, max_tokens (max_completion_tokens; at most --max_len minus the prompt, as vLLM's
max_model_len, else a 400 naming --max_len; the cache also holds the prompt's padding to its
length bucket, so a limit inside that padding ends the answer early: "length"), temperature, top_p, top_k (extension), seed, stop
(a string or up to 4), logprobs (chat: bool with top_logprobs 0..20; completions: null or an int
0..5; the chosen token's log-prob under logits / temperature (1 when greedy), the sampler's, and
the top alternatives under that same distribution, computed in the decode only when a request
in its batch asks: rossjax.serve.logprobs has the shapes), stream (SSE, `data: [DONE]` at the
end; stream_options.include_usage adds the usage chunk; log-probs ride on each chunk), usage in
every non-streamed reply (prompt_tokens_details.cached_tokens: prompt tokens the prefix cache
reused); response_format other than "text" is a 400 (decoding is not constrained). A bad request is a 400 whose
error.message names the field.

Hostile input: rossjax.serve.guard (a 4xx, never a 500; the API key).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid

from aiohttp import web

from rossjax.engine import SamplingParams, bucket_length
from rossjax.engine.types import check_token_ids
from rossjax.errors import InputError
from rossjax.serve import guard, logprobs as lp_fmt, tools as tool_calls
from rossjax.serve.guard import BadRequest
from rossjax.serve.worker import Delta, Job

_MAX_TOKENS_DEFAULT = 256


class Server:
    """State the handlers share: the worker, tokenizer, template, limits and model id."""

    def __init__(self, worker, tokenizer, *, model_id: str, template: str, chat_stop_ids: tuple,
                 text_stop_ids: tuple):
        self.worker, self.tok, self.model_id, self.template = worker, tokenizer, model_id, template
        self.chat_stop_ids, self.text_stop_ids = chat_stop_ids, text_stop_ids
        self.engine = worker.engine
        self.max_body = guard.MAX_BODY

    def app(self, api_key: str | None = None, max_body: int = guard.MAX_BODY) -> web.Application:
        self.max_body = max_body
        app = web.Application(client_max_size=max_body,
                              middlewares=[guard.auth_middleware(api_key)] if api_key else [])
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def health(self, request):
        return web.Response(text="ok")

    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": self.model_id, "object": "model", "created": 0, "owned_by": "rossjax",
             "max_model_len": self.engine.max_len}]})   # as vLLM's: clients fit max_tokens

    async def tokenize(self, request):
        """vLLM's /tokenize: {prompt} or {messages} (rendered as chat requests are) -> count,
        max_model_len, tokens."""
        try:
            body = await self._body(request)
            if "messages" in body:
                ids = self._chat_prompt(body)
            elif isinstance(body.get("prompt"), str):
                ids = self.tok.encode(guard.text(body["prompt"], "'prompt'"))
            else:
                raise BadRequest("/tokenize needs 'prompt' (a string) or 'messages'.", "prompt")
        except BadRequest as e:
            return guard.error(e)
        return web.json_response({"count": len(ids), "max_model_len": self.engine.max_len,
                                  "tokens": ids, "token_strs": None})

    async def detokenize(self, request):
        """vLLM's /detokenize: {tokens} -> {prompt}."""
        try:
            body = await self._body(request)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise BadRequest("'tokens' must be a list of token ids.", "tokens")
            try:
                check_token_ids(ids, self.tok.vocab_size, "'tokens'")
            except InputError as e:
                raise BadRequest(str(e), "tokens") from None
        except BadRequest as e:
            return guard.error(e)
        return web.json_response({"prompt": self.tok.decode(ids)})

    # -- parsing --------------------------------------------------------------------------
    async def _body(self, request) -> dict:
        body = await guard.read_json(request, self.max_body)
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object.")
        model = body.get("model", self.model_id)
        if model != self.model_id:
            raise BadRequest(f"model {guard.show(model)} is not served here; this server has "
                             f"{self.model_id!r} (GET /v1/models).", "model", status=404)
        return body

    def _sampling(self, body, n_prompt: int, stop_ids: tuple, top_n: int = 0):
        rf = body.get("response_format")
        kind = rf.get("type") if isinstance(rf, dict) else rf
        if rf is not None and kind != "text":   # silently unconstrained JSON would be a lie
            raise BadRequest(f"'response_format' {guard.show(kind)} is not supported: rossjax "
                             f"serve cannot constrain decoding (only type 'text'); ask for JSON "
                             f"in the prompt and parse the answer.", "response_format")
        n = guard.num(body, "n", 1, 1, self.engine.slots, integer=True)
        max_len = self.engine.max_len
        room = max_len - bucket_length(max(n_prompt, 1))
        if room < 1:
            raise BadRequest(f"the prompt is {n_prompt} tokens; this server's slots hold "
                             f"{max_len} (rossjax serve --max_len).", "messages")
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        max_new = guard.num({name: limit}, name, min(_MAX_TOKENS_DEFAULT, room), 1, 1 << 62,
                            integer=True)
        if max_new > max_len - n_prompt:    # vLLM's contract: max_model_len minus the prompt
            raise BadRequest(f"'{name}' is {max_new}; this server fits at most "
                             f"{max_len - n_prompt} after this prompt of {n_prompt} tokens (the "
                             f"limit is rossjax serve --max_len={max_len} minus the prompt; "
                             f"GET /v1/models reports it as max_model_len).", name)
        # the cache also holds the prompt's padding to its length bucket: a limit the padding
        # leaves no room for ends the answer early (finish_reason "length"), never a 400
        max_new = min(max_new, room)
        temperature = guard.num(body, "temperature", 1.0, 0, 2)
        top_p = guard.num(body, "top_p", 1.0, 0, 1, lo_open=True)
        top_k = guard.num(body, "top_k", 0, 0, 1 << 30, integer=True)
        seed = body.get("seed")
        if seed is None:
            seed = secrets.randbits(63)
        elif isinstance(seed, bool) or not isinstance(seed, int):
            raise BadRequest(f"'seed' must be an integer, got {guard.show(seed)}.", "seed")
        stop = body.get("stop")
        stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or len(stops) > 4 or not all(
                isinstance(s, str) and s for s in stops):
            raise BadRequest("'stop' must be a non-empty string or a list of at most 4 of them.",
                             "stop")
        for s in stops:
            guard.text(s, "stop")
        if not isinstance(body.get("stream", False), (bool, type(None))):
            raise BadRequest("'stream' must be true or false.", "stream")
        sp = SamplingParams(int(max_new), float(temperature), float(top_p), int(top_k),
                            stop_ids, int(seed), int(top_n))
        return sp, int(n), stops

    def _chat_prompt(self, body) -> list[int]:
        from rossjax.templates import render_prompt

        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list of {role, content} objects.",
                             "messages")
        clean = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant",
                                                                 "tool", "developer"):
                raise BadRequest(f"messages[{i}] needs a 'role' of system, user, assistant, tool "
                                 f"or developer.", f"messages[{i}].role")
            c = m.get("content")
            if isinstance(c, list):   # content parts: text only
                if not all(isinstance(p, dict) and p.get("type") == "text" for p in c):
                    raise BadRequest(f"messages[{i}].content holds a non-text part; only text is "
                                     f"served.", f"messages[{i}].content")
                for k, p in enumerate(c):
                    if not isinstance(p.get("text"), str):
                        raise BadRequest(f"messages[{i}].content[{k}].text must be a string.",
                                         f"messages[{i}].content[{k}].text")
                c = "".join(p["text"] for p in c)
            clean.append(tool_calls.message_fields(i, m, c))
        try:
            text = render_prompt(clean, self.template, self.tok,
                                 tools=tool_calls.request_tools(body))
        except InputError as e:
            raise BadRequest(f"the messages cannot be rendered with template {self.template}: {e}",
                             "messages") from None
        return self.tok.encode(text)

    # -- endpoints ------------------------------------------------------------------------
    async def chat(self, request):
        try:
            body = await self._body(request)
            lp, top_n = lp_fmt.chat_request(body)
            ids = self._chat_prompt(body)
            sp, n, stops = self._sampling(body, len(ids), self.chat_stop_ids, top_n)
        except BadRequest as e:
            return guard.error(e)
        return await self._run(request, body, ids, sp, n, stops, chat=True, logprobs=lp)

    async def completions(self, request):
        try:
            body = await self._body(request)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if isinstance(prompt, str):
                ids = self.tok.encode(guard.text(prompt, "'prompt'"))
            elif isinstance(prompt, list) and prompt and all(
                    isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                ids = prompt
            else:
                raise BadRequest("'prompt' must be a non-empty string, one string in a list, or a "
                                 "list of token ids.", "prompt")
            if not ids:
                raise BadRequest("'prompt' encodes to no tokens.", "prompt")
            try:
                check_token_ids(ids, self.engine.cfg.vocab_size, "'prompt'")
            except InputError as e:
                raise BadRequest(str(e), "prompt") from None
            lp, top_n = lp_fmt.completion_request(body)
            sp, n, stops = self._sampling(body, len(ids), self.text_stop_ids, top_n)
        except BadRequest as e:
            return guard.error(e)
        return await self._run(request, body, ids, sp, n, stops, chat=False, logprobs=lp)

    async def _run(self, request, body, ids, sp, n, stops, *, chat: bool, logprobs: bool):
        stream = bool(body.get("stream", False))
        job = Job(ids, sp, n, stops, self.tok, asyncio.get_running_loop(), stream=stream)
        self.worker.submit(job)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        head = {"id": rid, "created": int(time.time()), "model": self.model_id}
        if stream:
            return await self._stream(request, body, job, head, chat, logprobs)
        texts, toks, lps, reasons = [""] * n, [[] for _ in range(n)], [[] for _ in range(n)], \
            [None] * n
        tops, cached = [[] for _ in range(n)], 0
        try:
            async for d in self._deltas(job):
                texts[d.index] += d.text
                toks[d.index] += d.token_ids
                lps[d.index] += d.logprobs
                tops[d.index] += d.top
                reasons[d.index] = d.finish_reason or reasons[d.index]
                cached = max(cached, d.cached)
        except BadRequest as e:
            return guard.error(e)
        except asyncio.CancelledError:
            self.worker.cancel(job)     # the client went away: free its slots
            raise
        choices = []
        for j in range(n):
            fmt = lp_fmt.Formatter(self.tok, chat, sp.top_logprobs)
            c = {"index": j, "finish_reason": reasons[j],
                 "logprobs": fmt(toks[j], lps[j], tops[j]) if logprobs else None}
            if chat:
                c["message"], c["finish_reason"] = tool_calls.answer_message(
                    texts[j], reasons[j], tool_calls.request_tools(body))
            else:
                c["text"] = texts[j]
            choices.append(c)
        done = sum(map(len, toks))
        return web.json_response({**head, "object": "chat.completion" if chat else
                                  "text_completion", "choices": choices,
                                  "usage": _usage(len(ids), done, cached)})

    async def _deltas(self, job):
        """The job's deltas until every candidate has finished. Deltas already queued for the
        same candidate are sent as one (a client reading slower than the model writes gets
        fewer, larger events; at the model's pace, one per delta the engine sent)."""
        left, held = job.n, []
        while left:
            d = held.pop() if held else await job.out.get()
            while d is not None and d.finish_reason is None and not job.out.empty():
                nxt = job.out.get_nowait()
                if nxt is None or nxt.index != d.index:
                    held.append(nxt)
                    break
                d = Delta(d.index, d.text + nxt.text, d.token_ids + nxt.token_ids,
                          d.logprobs + nxt.logprobs, nxt.finish_reason, d.top + nxt.top,
                          nxt.cached)
            if d is None:       # the engine refused the job
                raise BadRequest(str(job.error))
            yield d
            left -= d.finish_reason is not None

    async def _stream(self, request, body, job, head, chat, logprobs):
        n_total = job.n
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        obj = "chat.completion.chunk" if chat else "text_completion"
        await resp.prepare(request)

        async def send(payload):
            await resp.write(f"data: {json.dumps(payload)}\n\n".encode())

        n_done, cached = 0, 0
        fmts = [lp_fmt.Formatter(self.tok, chat, job.sp.top_logprobs) for _ in range(n_total)]
        try:
            if chat:
                for j in range(n_total):
                    await send({**head, "object": obj, "choices": [
                        {"index": j, "delta": {"role": "assistant", "content": ""},
                         "logprobs": None, "finish_reason": None}]})
            async for d in self._deltas(job):
                n_done += len(d.token_ids)
                cached = max(cached, d.cached)
                lp = fmts[d.index](d.token_ids, d.logprobs, d.top) if logprobs else None
                c = {"index": d.index, "logprobs": lp, "finish_reason": d.finish_reason}
                if chat:
                    c["delta"] = {"content": d.text} if d.text or d.finish_reason is None else {}
                else:
                    c["text"] = d.text
                await send({**head, "object": obj, "choices": [c]})
            opts = body.get("stream_options") or {}
            if isinstance(opts, dict) and opts.get("include_usage"):
                await send({**head, "object": obj, "choices": [],
                            "usage": _usage(len(job.prompt), n_done, cached)})
            await resp.write(b"data: [DONE]\n\n")
        except BadRequest as e:
            await send({"error": {"message": str(e), "type": "invalid_request_error"}})
        except (ConnectionResetError, asyncio.CancelledError):
            self.worker.cancel(job)     # the client went away: free its slots
            raise
        return resp


def _usage(prompt: int, completion: int, cached: int = 0) -> dict:
    """cached: prompt tokens the prefix cache supplied (OpenAI's prompt_tokens_details)."""
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": cached}}
