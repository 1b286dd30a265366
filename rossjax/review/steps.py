"""One checked reviewer step: ask, read the one JSON object, run the stage's check, and on a
failure ask again with the exact failing check in the request (bounded), logging every request
and answer of the row into its transcript.

A row's procedure raises `RowWithheld(code, detail, stage)` when it ends without an annotation;
the run puts the row in the withheld bucket with that code and counts it against that stage.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rossjax.review.answers import BadAnswer, read_answer
from rossjax.review.client import ReviewerError
from rossjax.review.prompts import response_format, retry

# Refusals that concern one request (too long for the context, a payload the server rejects):
# that row is withheld, the run goes on; so is a response that cannot be an answer (too large,
# not JSON, not a chat completion: ReviewerError.code). Any other 4xx (auth, unknown model)
# stops the run.
ROW_REFUSALS = (400, 413, 422)


class RowWithheld(Exception):
    """`endpoint`: the endpoint failed this request (no answer to judge), as opposed to an
    answer that was judged and found wanting."""

    def __init__(self, code: str, detail: str, stage: str, endpoint: bool = False):
        super().__init__(detail)
        self.code, self.detail, self.stage, self.endpoint = code, detail, stage, endpoint


@dataclass
class Row:
    """What a row's procedure needs and what it leaves behind."""
    client: object  # ReviewerClient
    record: dict
    rendered: object  # the chat rendering (templates.Rendered)
    compile_: object  # record -> CompiledExample, curate's compiler with the run's settings
    max_retries: int  # re-asks per step after a failed check
    max_chars: int  # longest usable answer
    response_format: str = "none"
    transcript: list = field(default_factory=list)
    answers: int = 0  # reviewer answers this row received (cached ones included)
    # "stage:outcome" counts of the answers that decide a row (audit accept/revise/drop,
    # localization located/unresolved), summed into report.json `outcomes`
    outcomes: Counter = field(default_factory=Counter)

    def log(self, stage: str, messages: list, reply, check: BadAnswer | None, result=None):
        entry = {"stage": stage, "messages": messages, "answer": reply.text,
                 "finish_reason": reply.finish_reason, "usage": reply.usage,
                 "cached": reply.cached, "key": reply.key}
        if check is not None:
            entry["check"] = {"code": check.code, "detail": check.detail}
        if result is not None:
            entry["result"] = result
        self.transcript.append(entry)

    def ask(self, stage: str, messages: list, check):
        """`check(obj)` of the first answer that passes it, after at most max_retries re-asks
        that quote the failing check; else `RowWithheld` with the last failure's code."""
        fmt = response_format(stage, self.response_format)
        last = None
        for attempt in range(self.max_retries + 1):
            try:
                reply = self.client.ask(messages, stage=stage, response_format=fmt)
            except ReviewerError as e:
                if e.code or e.status in ROW_REFUSALS:  # this request's failure, not the run's
                    raise RowWithheld(e.code or "reviewer_refused", str(e), stage,
                                      endpoint=True) from None
                raise
            self.answers += 1
            try:
                out = check(read_answer(reply, self.max_chars))
            except BadAnswer as e:
                self.client.mark_failed(reply.key, e.code)  # re-asked on a rerun (config.reask)
                self.log(stage, messages, reply, e)
                last = e
                messages = retry(messages, reply.text[:self.max_chars], e.detail)
                continue
            self.log(stage, messages, reply, None)
            return out, reply.text
        raise RowWithheld(last.code, f"{last.detail} (still failing after {attempt + 1} "
                                     f"{stage} answer(s))", stage)
