"""Log-probs in the OpenAI shapes: what a request asks for, and each token's entry.

Every log-prob is the sampler's (rossjax.engine.sampler): log-softmax of logits / T (T = 1 for
greedy), before top-k / top-p; the top alternatives are the likeliest tokens under that same
distribution, best first, so under greedy the chosen token is the first of them.

    chat          logprobs: bool; top_logprobs: 0..20, only with logprobs true (as OpenAI's)
                  -> choices[].logprobs.content[] = {token, logprob, bytes, top_logprobs: [
                     {token, logprob, bytes}, ...]}
    completions   logprobs: null or 0..5 (as OpenAI's legacy API)
                  -> choices[].logprobs = {tokens, token_logprobs, top_logprobs: [{token:
                     logprob}], text_offset}; each dict holds the k likeliest and the chosen
                     token (so up to k + 1 entries, as OpenAI says); text_offset counts
                     characters of the completion's token strings from 0 (vLLM's, no echo)
"""

from __future__ import annotations

from rossjax.engine.types import MAX_TOP_LOGPROBS
from rossjax.serve.guard import BadRequest

MAX_COMPLETION_LOGPROBS = 5     # OpenAI's legacy completions limit


def _int_field(v, name: str, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
        raise BadRequest(f"'{name}' must be an integer in [0, {hi}], got {v!r}.", name)
    return v


def chat_request(body) -> tuple[bool, int]:
    """(whether to return log-probs, how many top alternatives per token)."""
    lp = body.get("logprobs")
    lp = False if lp is None else lp         # null is false, as OpenAI's
    if not isinstance(lp, bool):
        raise BadRequest("'logprobs' must be true or false.", "logprobs")
    top = body.get("top_logprobs")
    top = 0 if top is None else _int_field(top, "top_logprobs", MAX_TOP_LOGPROBS)
    if top and not lp:
        raise BadRequest("'top_logprobs' needs 'logprobs': true (as OpenAI's API).",
                         "top_logprobs")
    return lp, top


def completion_request(body) -> tuple[bool, int]:
    """(whether to return log-probs, how many top alternatives per token): `logprobs` is null
    (none) or the number of alternatives, 0 = the chosen token's only."""
    lp = body.get("logprobs")
    if lp is None:
        return False, 0
    return True, _int_field(lp, "logprobs", MAX_COMPLETION_LOGPROBS)


class Formatter:
    """One candidate's log-prob entries; keeps the text offset across streamed chunks."""

    def __init__(self, tok, chat: bool, top_n: int):
        self.tok, self.chat, self.top_n, self.offset = tok, chat, top_n, 0

    def _bytes(self, t: int) -> bytes:
        return self.tok.token_bytes(t) if 0 <= t < self.tok.vocab_size else b""

    def _str(self, t: int) -> str:
        return self._bytes(t).decode("utf-8", errors="replace")

    def __call__(self, ids, lps, tops) -> dict:
        tops = list(tops) if tops else [[] for _ in ids]
        if self.chat:
            return {"content": [
                {"token": self._str(t), "logprob": lp, "bytes": list(self._bytes(t)),
                 "top_logprobs": [{"token": self._str(a), "logprob": alp,
                                   "bytes": list(self._bytes(a))} for a, alp in top]}
                for t, lp, top in zip(ids, lps, tops)]}
        tokens = [self._str(t) for t in ids]
        offsets = []
        for s in tokens:
            offsets.append(self.offset)
            self.offset += len(s)
        dicts = []
        for t, lp, top in zip(ids, lps, tops):
            d = {}
            for a, alp in top:          # best first: a string two ids share keeps the better
                d.setdefault(self._str(a), alp)
            d.setdefault(self._str(t), lp)      # the chosen token always, as OpenAI's
            dicts.append(d)
        return {"tokens": tokens, "token_logprobs": list(lps), "top_logprobs": dicts,
                "text_offset": offsets}
