"""An agent episode over any OpenAI-compatible chat endpoint, written as a rollout row.

    row = run_episode(env, task, OpenAIPolicy("http://127.0.0.1:8000/v1", "model"), rid="r0")

Each turn is agents/episode.py's: the policy's reply is parsed for tool calls (the endpoint's
structured `tool_calls`, else the text as the template writes them: hermes or react), the
environment's observations are appended as tool messages, until the env says done, the policy
answers without a call (then `env.finish` judges it), `max_turns`, or the character budget of
the history (`max_chars`; `window` keeps only the opening messages and the last `window`
messages in what is SENT, the row keeps everything). A malformed call is an observation
naming the fault. This module is the transport: the POST, the window, the log-probs.

Per-token sampler log-probs are kept per assistant message when the endpoint returns them
(`logprobs: true`), under `agent.logprobs`, and the sampled ids under `agent.token_ids` when
the server writes tokens as "token_id:N" (vLLM's return_tokens_as_token_ids). Observation and
template tokens are not known on this path, so the row carries no top-level `token_ids` and
curate renders it. The engine path (rossjax/train/rl/agentic.py, device half) keeps the exact ids
of the whole history; see docs/agents.md.
"""

from __future__ import annotations

import json
import time

from rossjax.agents.env import EnvHandle, Environment, as_handle
from rossjax.agents.episode import Episode, Reply, play
from rossjax.agents.parse import STYLES, parser
from rossjax.errors import InputError
from rossjax.openai_api import ChatClient, ChatError


class PolicyError(InputError):
    """The endpoint failed or answered something that is not a chat completion."""


class OpenAIPolicy:
    """The policy behind an OpenAI-compatible endpoint, through rossjax.openai_api's ChatClient
    (one kept-alive connection per thread: concurrent episodes, agents/swe.py, share a policy;
    no retries: a failed turn is the trial's failure)."""

    def __init__(self, base_url: str, model: str, api_key: str = "EMPTY", timeout_s: float = 60.0,
                 max_bytes: int = 8 << 20, **sampling):
        self.client = ChatClient(base_url, model, api_key=api_key, timeout_s=timeout_s,
                                 max_retries=0, max_response_bytes=max_bytes, name="policy")
        self.model, self.sampling = model, sampling

    def __call__(self, messages: list[dict], tools: list) -> dict:
        body = {"model": self.model, "messages": messages, "logprobs": True,
                "return_tokens_as_token_ids": True, **self.sampling}  # vLLM; others ignore it
        if tools:
            body["tools"] = tools
        try:
            raw = self.client.post(body, stage="policy")
        except ChatError as e:
            raise PolicyError(str(e)) from None
        try:
            choice = raw["choices"][0]
            msg = choice["message"]
            if not isinstance(msg, dict):
                raise TypeError(msg)
        except (KeyError, IndexError, TypeError):
            raise PolicyError(f"policy endpoint answered no chat completion: "
                              f"{json.dumps(raw, default=str)[:200]}") from None
        lp = (choice.get("logprobs") or {}).get("content") or []
        toks = [t.get("token") for t in lp if isinstance(t, dict)]
        # vLLM with return_tokens_as_token_ids writes each token as "token_id:N": the ids the
        # sampler drew, kept as they came (None when any token is plain text)
        ids = [int(t[9:]) for t in toks if isinstance(t, str) and t.startswith("token_id:")
               and t[9:].isdigit()]
        return {"content": msg.get("content") or "", "tool_calls": msg.get("tool_calls") or [],
                "logprobs": [t.get("logprob") for t in lp if isinstance(t, dict)],
                "token_ids": ids if toks and len(ids) == len(toks) else None}


def _sent(messages: list[dict], window: int | None, n_open: int) -> list[dict]:
    if not window or len(messages) <= n_open + window:
        return messages
    return messages[:n_open] + messages[-window:]


class _Transport:
    """The HTTP driver's model call: what is sent (the window), and the per-message log-probs
    and sampled ids the endpoint returned, keyed by the index the reply's message will take."""

    def __init__(self, policy, tools: list, window: int | None, n_open: int):
        self.policy, self.tools, self.window, self.n_open = policy, tools, window, n_open
        self.logprobs: dict[str, list] = {}
        self.token_ids: dict[str, list] = {}  # message index -> the sampler's ids, when known

    def __call__(self, ep: Episode) -> Reply:
        reply = self.policy(_sent(ep.messages, self.window, self.n_open), self.tools)
        at = str(len(ep.messages))
        if reply.get("logprobs"):
            self.logprobs[at] = reply["logprobs"]
        if reply.get("token_ids"):
            self.token_ids[at] = reply["token_ids"]
        return Reply(reply["content"], reply["tool_calls"])


def run_episode(env: Environment | EnvHandle, task: dict, policy, rid: str,
                style: str = "hermes", max_turns: int = 8, max_chars: int = 200_000,
                window: int | None = None) -> dict:
    """One episode as a rollout row (docs/data.md): id, task, tools, messages with tool calls
    and tool results, verifier (the env's verdict), reward, and `agent` (turns, stop reason,
    per-message log-probs). `policy(messages, tools)` answers a chat completion's message."""
    if style not in STYLES:
        raise ValueError(f"tool-call style {style!r} is not one of {', '.join(STYLES)}")
    env = as_handle(env)
    messages = env.reset(task)
    ep = Episode(env=env, messages=messages, max_turns=max_turns, parse=parser(style),
                 deadline=time.monotonic() + float(env.episode_timeout_s))
    call = _Transport(policy, env.tools, window, len(messages))
    stop = play(ep, call, lambda e: sum(len(m.get("content") or "") for m in e.messages)
                <= max_chars)
    verdict = ep.verdict
    passed = verdict.passed if verdict else None
    return {"id": rid, "task": {"id": str(task.get("id", rid)), "domain": env.name,
                                "prompt": task["prompt"]},
            "tools": env.tools, "messages": ep.messages,
            "verifier": {"name": f"agents.{env.name}", "passed": passed,
                         "evidence": verdict.evidence if verdict else f"no verdict ({stop})"},
            "reward": 1.0 if passed else 0.0,
            "agent": {"turns": ep.turns, "stop": str(stop), "style": style,
                      "logprobs": call.logprobs, "token_ids": call.token_ids}}
