"""One checked request of a reconstruction stage, and how an artifact ends when a stage fails.

`Asker.ask(stage, messages, check)` asks through rossjax.openai_api's ChatClient (its cache makes a
rerun ask nothing twice), reads the answer's one JSON object (review.answers.read_answer), runs the
stage's `check(obj)`, and on a failure asks again with the failing check quoted, `retries` times.
Every request and answer is logged into the artifact's transcript. An artifact ends early by
raising `Settled(status, code, detail)`: invalid for a model answer no retry fixed
(model_unparseable, model_truncated, model_oversized, model_malformed: the detail names the stage
and the field), withheld for a judged failure (task_leak, failed_retrieval, step_cap, ...), for a
request the endpoint refused (endpoint_refused: HTTP 400/413/422, e.g. a prompt over the model's
context) or for an endpoint that did not answer (endpoint_error, which a rerun asks again).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from rossjax.openai_api import ChatError
from rossjax.review.answers import BadAnswer, read_answer
from rossjax.review.prompts import retry

# HTTP statuses that mean the setup is wrong (key, model name, URL): the run stops, one sentence.
SETUP_STATUS = (401, 403, 404)
# Refusals of this one request (a prompt over the context, a payload the server rejects): the
# artifact is withheld endpoint_refused; any other failure (5xx, timeouts, dropped
# connections) is endpoint_error. Neither is journaled (run.py): a rerun asks again.
REFUSED_STATUS = (400, 413, 422)
# review's answer codes -> this command's invalid reasons
_CODES = {"reviewer_unparseable": "model_unparseable", "reviewer_truncated": "model_truncated",
          "reviewer_oversized": "model_oversized", "reviewer_malformed": "model_malformed",
          "review_inconsistent": "model_malformed"}


# a UTF-16 surrogate alone (json.loads turns "\\ud800" into one): no character, and no UTF-8
# file (the answer cache, the journal, the outputs) can hold it
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
NOT_TEXT = "holds a lone UTF-16 surrogate, which is not a character (no UTF-8 file can hold it)"


def surrogate_at(obj, where: str = "") -> str | None:
    """The path (e.g. `.arguments.text`, `[2]`) of the first key or string of a parsed answer
    holding a lone surrogate, else None (answers nest at most review.answers.MAX_DEPTH deep)."""
    if isinstance(obj, str):
        return where if LONE_SURROGATE.search(obj) else None
    items = (obj.items() if isinstance(obj, dict) else enumerate(obj)
             if isinstance(obj, list) else ())
    for k, v in items:
        here = f"{where}.{k}" if isinstance(k, str) else f"{where}[{k}]"
        if isinstance(k, str) and LONE_SURROGATE.search(k):
            return f"{where} (a key)"
        found = surrogate_at(v, here)
        if found is not None:
            return found
    return None


class Settled(Exception):
    """The artifact's end: status (withheld | invalid), reason code, one-sentence detail."""

    def __init__(self, status: str, code: str, detail: str, stage: str = ""):
        super().__init__(detail)
        self.status, self.code, self.detail, self.stage = status, code, detail, stage


def bad(where: str, what: str) -> BadAnswer:
    """A stage check's failure: `where` names the answer field (e.g. task.rubric[2].aspect)."""
    return BadAnswer("reviewer_malformed", f"{where} {what}")


def want_text(obj, key: str, where: str, max_chars: int | None = None) -> str:
    v = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(v, str) or not v.strip():
        raise bad(f"{where}.{key}", f"must be a non-empty string, got {v!r:.60}")
    if max_chars and len(v) > max_chars:
        raise bad(f"{where}.{key}", f"has {len(v)} characters, more than {max_chars}")
    return v.strip()


def want_items(obj, key: str, where: str, lo: int = 1, hi: int = 10_000) -> list:
    v = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(v, list):
        raise bad(f"{where}.{key}", f"must be a list, got {type(v).__name__}")
    if not lo <= len(v) <= hi:
        raise bad(f"{where}.{key}", f"must hold {lo} to {hi} items, got {len(v)}")
    for j, x in enumerate(v):
        if not isinstance(x, dict):
            raise bad(f"{where}.{key}[{j}]", f"must be an object, got {type(x).__name__}")
    return v


@dataclass
class Asker:
    client: object  # rossjax.openai_api.ChatClient
    artifact_id: str
    where: str  # "FILE row N (artifact ID)": how every detail names the artifact
    retries: int = 1
    max_chars: int = 50_000
    response_format: dict | None = None  # {"type": "json_object"}: constrained JSON decoding
    transcript: list = field(default_factory=list)
    answers: int = 0
    failed_checks: dict = field(default_factory=dict)  # stage -> {code: n}

    def ask(self, stage: str, messages: list, check):
        """`check(obj)` of the first answer that passes it, else `Settled` invalid."""
        last = None
        if LONE_SURROGATE.search(json.dumps(messages, ensure_ascii=False)):
            # the artifact and every answer are checked, so the text came from the corpus
            raise Settled("invalid", "unencodable_text", f"{self.where}: {stage}: the request "
                          f"{NOT_TEXT} (a corpus document's text); nothing was asked", stage)
        for attempt in range(self.retries + 1):
            try:
                reply = self.client.ask(messages, stage=stage,
                                        response_format=self.response_format)
            except ChatError as e:
                if e.status in SETUP_STATUS:
                    raise
                if e.code != "reviewer_not_text":
                    code = "endpoint_refused" if e.status in REFUSED_STATUS else "endpoint_error"
                    raise Settled("withheld", code, f"{self.where}: {stage}: {e}", stage) from None
                reply = None  # the client refused an answer text holding a lone surrogate
            if reply is None or LONE_SURROGATE.search(reply.text):
                # the answer text holds a lone surrogate: kept out of every file, asked again
                last = BadAnswer("reviewer_unparseable", f"the answer {NOT_TEXT}")
                self.answers += 1
                self.transcript.append({"stage": stage, "messages": messages, "answer": None,
                                        "check": {"code": last.code, "detail": last.detail}})
                counts = self.failed_checks.setdefault(stage, {})
                counts[last.code] = counts.get(last.code, 0) + 1
                continue
            self.answers += 1
            entry = {"stage": stage, "messages": messages, "answer": reply.text,
                     "finish_reason": reply.finish_reason, "cached": reply.cached}
            self.transcript.append(entry)
            try:
                obj = read_answer(reply, self.max_chars)
                at = surrogate_at(obj)
                if at is not None:
                    raise bad(f"{stage}{at}", NOT_TEXT)
                return check(obj)
            except BadAnswer as e:
                self.client.mark_failed(reply.key, e.code)  # a rerun asks it again
                entry["check"] = {"code": e.code, "detail": e.detail}
                counts = self.failed_checks.setdefault(stage, {})
                counts[e.code] = counts.get(e.code, 0) + 1
                last = e
                messages = retry(messages, reply.text[:self.max_chars], e.detail)
        raise Settled("invalid", _CODES.get(last.code, "model_malformed"),
                      f"{self.where}: {stage} answer: {last.detail} (still failing after "
                      f"{attempt + 1} answer(s))", stage)
