"""One agent turn, written once for every driver (the HTTP rollout, the engine's token rollout).

    ep = Episode(as_handle(env), env.reset(task), max_turns=8, deadline=time.monotonic() + 120)
    stop = play(ep, model_call)          # model_call(ep) -> Reply: the injected transport

A turn takes the policy's reply: its tool calls are parsed (the endpoint's structured
`tool_calls`, else the text by `parse`), the assistant message is stored, and then
  no call and no fault  -> the env judges the answer (`finish`): ANSWERED;
  a malformed call      -> an observation naming the fault (the episode goes on);
  calls                 -> the env steps them under the episode's deadline; done: DONE;
  `max_turns` turns     -> MAX_TURNS.
A driver ends an episode whose history no longer fits with CONTEXT_BUDGET (characters on the
HTTP path, tokens and cache columns on the engine's), and the engine's with the faults only
tokens have (UNKNOWN_TOKEN, INVALID_UTF8, TEMPLATE_MISMATCH). Transport and token bookkeeping
stay in the drivers (agents/rollout.py, train/rl/agentic.py).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Callable

from rossjax.agents.env import EnvHandle, Observation
from rossjax.agents.parse import parse_structured, parse_tool_calls
from rossjax.verify.verdict import Verdict


class StopReason(enum.StrEnum):
    """Why an episode ended (a str: records and checks read the value)."""

    ANSWERED = "answered"              # a reply without a call; env.finish judged it
    DONE = "done"                      # the env said done (or its step failed)
    MAX_TURNS = "max_turns"
    CONTEXT_BUDGET = "context_budget"  # the history no longer fits the driver's budget
    UNKNOWN_TOKEN = "unknown_token"    # engine: a sampled id the tokenizer has no text for
    INVALID_UTF8 = "invalid_utf8"      # engine: the sampled bytes are not UTF-8
    TEMPLATE_MISMATCH = "template_mismatch"  # engine: the rendering no longer extends the ids


@dataclasses.dataclass
class Reply:
    """One model turn as the driver's transport decoded it."""

    text: str
    tool_calls: list = dataclasses.field(default_factory=list)  # structured, as OpenAI writes them


def hermes(text: str, n0: int):
    return parse_tool_calls(text, "hermes", n0)


def structured_message(history: list, text: str, calls: list) -> dict:
    """The stored assistant message: the text, the parsed calls as structured tool_calls."""
    msg = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [c.to_message() for c in calls]
    return msg


@dataclasses.dataclass(kw_only=True)
class Episode:
    """The state of one episode; `turn` advances it, `end` stops it."""

    env: EnvHandle
    messages: list
    max_turns: int = 8
    deadline: float = 0.0       # time.monotonic() by which the episode must end
    parse: Callable = hermes    # (text, n0) -> (calls, errors)
    turns: int = 0
    n_calls: int = 0
    stop: StopReason | None = None
    verdict: Verdict | None = None
    timed_out: bool = False     # a step ran to its limit
    calls: dict = dataclasses.field(default_factory=dict)  # message index -> calls of a raw turn

    def end(self, stop: StopReason) -> StopReason:
        self.stop = stop
        return stop

    def turn(self, reply: Reply, message: Callable = structured_message) -> StopReason | None:
        """One turn of `reply`; the stop reason when the episode ended, else None.
        `message(history, text, calls)` is the assistant message to store."""
        self.turns += 1
        calls, errors = self._parse(reply)
        self.n_calls += len(calls)
        msg = message(self.messages, reply.text, calls)
        if calls and "tool_calls" not in msg:  # stored raw: its parsed calls are kept beside it
            self.calls[str(len(self.messages))] = [c.to_message() for c in calls]
        self.messages.append(msg)
        if not calls and not errors:
            self.verdict = self.env.finish(reply.text, self.deadline)
            return self.end(StopReason.ANSWERED)
        obs = [Observation("error: malformed tool call: " + e) for e in errors]
        done = False
        if calls:
            got, done, self.verdict = self._step(calls)
            obs = list(got) + obs
        self.messages += [o.to_message() for o in obs]
        if done:
            return self.end(StopReason.DONE)
        if self.turns >= self.max_turns:
            return self.end(StopReason.MAX_TURNS)
        return None

    def unreadable(self, content: str, stop: StopReason, why: str) -> StopReason:
        """A turn with no text to parse (the engine's token faults): stored, judged failed."""
        self.turns += 1
        self.messages.append({"role": "assistant", "content": content})
        self.verdict = Verdict(False, why)
        return self.end(stop)

    def _parse(self, reply: Reply):
        if reply.tool_calls:
            return parse_structured(reply.tool_calls, self.n_calls)
        try:
            return self.parse(reply.text, self.n_calls)
        except Exception as e:  # a user's parser that raises: the policy's observation
            return [], [f"the tool-call parser raised {type(e).__name__}: {e}"[:300]]

    def _step(self, calls):
        t0 = time.monotonic()
        limit = min(float(self.env.step_timeout_s), self.deadline - t0)
        got = self.env.step(calls, self.deadline)
        # the handle ends an overrun at the limit: a step that took it all timed out
        self.timed_out = time.monotonic() - t0 >= limit
        return got


def play(ep: Episode, model_call: Callable[[Episode], Reply],
         fits: Callable[[Episode], bool] = lambda ep: True) -> StopReason:
    """Turns until the episode stops: `model_call` is the transport (an endpoint, a script),
    `fits` the driver's context budget, checked after each turn that did not end it."""
    if ep.max_turns < 1:
        return ep.end(StopReason.MAX_TURNS)
    while True:
        stop = ep.turn(model_call(ep))
        if stop is not None:
            return stop
        if not fits(ep):
            return ep.end(StopReason.CONTEXT_BUDGET)
