"""The engine's public values: what a request asks for, where a sequence stands, what it emitted.

    SamplingParams   one request's settings (budget, temperature / top-k / top-p, stop ids, seed)
    Status           waiting -> running -> held (a hold=True request between turns) | done
    FinishReason     why a sequence stopped: stop (a stop id, e.g. EOS) | length | cancelled
    SequenceResult   a snapshot of one sequence (Engine.result): status, tokens, log-probs, ...
    Update           what one step gave one sequence (Engine.step)

Status and FinishReason are string enums whose values are the strings they replace (and the
OpenAI finish_reason strings), so `reason == "stop"` and JSON output read as before.
"""

from __future__ import annotations

import dataclasses
import enum

from rossjax.errors import ConfigError, InputError


class Status(enum.StrEnum):
    WAITING = "waiting"     # queued until its request's n slots are free
    RUNNING = "running"     # decoding (or an extension is queued)
    HELD = "held"           # finished a turn; keeps its slot until Engine.release
    DONE = "done"           # finished; its slot is free


class FinishReason(enum.StrEnum):
    STOP = "stop"           # emitted one of its stop ids (kept in its tokens)
    LENGTH = "length"       # spent its max_new_tokens
    CANCELLED = "cancelled"  # Engine.cancel


# The decode computes top log-probs for this many tokens (one static k: one program) when any
# sequence in its batch asks for them (SamplingParams.top_logprobs), none otherwise.
MAX_TOP_LOGPROBS = 20


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 0.0          # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                    # 0 = off
    stop_ids: tuple = ()
    seed: int = 0
    top_logprobs: int = 0             # per token, the k likeliest tokens' log-probs (0 = none)

    def check(self, where: str = "engine"):
        if self.max_new_tokens < 1:
            raise ConfigError(f"{where}: field 'max_new_tokens' must be >= 1.")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ConfigError(f"{where}: field 'top_logprobs' must be in [0, {MAX_TOP_LOGPROBS}].")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ConfigError(f"{where}: need temperature >= 0, 0 < top_p <= 1 and top_k >= 0.")


def check_token_ids(ids, vocab_size: int, what: str) -> list[int]:
    """`ids` as ints, or an InputError naming `what` ("generate: prompts row 3") when it is
    empty or holds an id outside the vocabulary: the one token-id check (engine, generate,
    serve)."""
    ids = [int(t) for t in ids]
    if not ids:
        raise InputError(f"{what} is empty; it needs at least one token.")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise InputError(f"{what} holds a token id outside [0, {vocab_size}).")
    return ids


def request_seed(seed: int, i: int) -> int:
    """Request i's seed under a run's `seed`: (seed, i) packed into 64 bits, which the engine's
    fold hashes (generate's prompts, agentic groups)."""
    return (int(seed) % (1 << 32)) << 32 | int(i)


@dataclasses.dataclass(frozen=True)
class SequenceResult:
    """One sequence as it stands: every turn's tokens and their sampler log-probs (log-softmax of
    logits / T before top-k / top-p; T = 1 for greedy), and how many cache columns it holds."""
    id: int
    status: Status
    tokens: tuple
    logprobs: tuple
    finish_reason: FinishReason | None
    cache_used: int                 # its slot's next write column (left padding included)
    cached_tokens: int = 0          # prompt tokens whose KV the prefix cache supplied


@dataclasses.dataclass
class Update:
    seq_id: int
    tokens: list
    logprobs: list
    finished: bool
    finish_reason: FinishReason | None      # set once finished
    streamed: int = 0       # how many of `tokens` the engine's on_tokens had already been given
    # per token, [(token id, log-prob)] of the sequence's top_logprobs likeliest tokens under
    # the distribution `logprobs` are taken from (best first); [] when it asked for none
    top_logprobs: list = dataclasses.field(default_factory=list)
