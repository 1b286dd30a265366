"""Multi-turn agent rollouts on the rollout engine, with the exact tokens the policy saw.

    trajs = rollouts(model_cfg, params, tok, tasks, AgentSpec(env="calculator"), group=4,
                     temperature=1.0, seed=0, partitioner=part)

Each task's `group` candidates are live engine sequences (one shared prefill, `hold=True`).
When a candidate's turn ends (the end-of-turn token, or the turn's token budget), its sampled
text is parsed for tool calls (rossjax.agents.parse; `style` hermes | react | module:function),
the environment steps (in its own CPU worker process: rossjax.agents.remote.RemoteEnv), and the
observations, rendered as tool messages by the chat template, are tokenized and APPENDED to the
live sequence (Engine.extend: the history is never prefilled again) up to where the next
assistant turn starts. An episode ends when the policy answers without a call (`env.finish`
judges it), the env says done, `max_turns`, or the context budget (`max_tokens` tokens of the
trajectory, and the slot's cache columns). A malformed call is an observation naming the fault.

Each episode's environment lives in a CPU worker process (rossjax.verify.pool.Worker: spawned,
jax-free), built there by make_env from the spec, reset, stepped, judged and closed there; only
picklable values (messages, ToolCalls, Observations, Verdicts) cross. A step past its limit
(min(step_timeout_s, what is left of episode_timeout_s)) kills that worker: the episode ends
failed and the handle is replaced; a worker that dies fails its episode with the reason. Steps
of candidates whose turns end together run at once (one waiting thread per worker).

What is kept is never re-tokenized: `ids` are the prompt's tokens, the sampled tokens and the
tokens of each rendered observation, in order; `logprobs` the sampler's per-token log-probs
(of softmax(logits / T), as the trainer scores them) at policy tokens, 0 elsewhere; `policy`
marks the sampled tokens. The messages are stored so that the template renders exactly the
text the ids spell: an assistant turn whose tool calls are written in the template's canonical
form keeps them as structured `tool_calls`; any other turn keeps its raw text as `content` (its
parsed calls under `calls`), so `rossjax curate` projects the stored ids onto the rendering.
`spans` maps each message to the token range of its rendered parts.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import time

import numpy as np

from rossjax import sharding
from rossjax.agents import Environment, Observation, make_env, timed_step
from rossjax.agents.parse import STYLES, parse_tool_calls
from rossjax.agents.remote import RemoteEnv
from rossjax.engine import Engine, SamplingParams, bucket_length
from rossjax.errors import ConfigError, InputError
from rossjax.templates import render_chat
from rossjax.tokenizers import byte_to_char_offsets
from rossjax.verify.base import load_fn
from rossjax.verify.verdict import Verdict


@dataclasses.dataclass(frozen=True)
class AgentSpec:
    env: str = "calculator"
    env_kwargs: str = "{}"          # JSON object of keyword arguments for the env class
    style: str = "hermes"           # hermes | react | module:function (text, n0) -> (calls, errors)
    max_turns: int = 4
    max_tokens: int = 1024          # context budget of a trajectory, in tokens
    max_new_tokens: int = 64        # per policy turn
    tools_in_prompt: bool = True    # render the env's tools into the prompt (and the row)
    step_timeout_s: float = 10.0
    episode_timeout_s: float = 120.0

    @classmethod
    def from_config(cls, a, max_new_tokens: int) -> AgentSpec:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in a.to_dict().items() if k in fields},
                   max_new_tokens=int(max_new_tokens))

    def kwargs(self) -> dict:
        try:
            kw = json.loads(self.env_kwargs or "{}")
        except json.JSONDecodeError as e:
            raise ConfigError(f"config.agent.env_kwargs is not JSON ({e.msg}).") from None
        if not isinstance(kw, dict):
            raise ConfigError("config.agent.env_kwargs must be a JSON object.")
        return kw

    def make_env(self) -> Environment:
        return make_env(self.env, step_timeout_s=self.step_timeout_s,
                        episode_timeout_s=self.episode_timeout_s, **self.kwargs())

    def parser(self):
        if self.style in STYLES:
            return lambda text, n0: parse_tool_calls(text, self.style, n0)
        return load_fn(self.style, "config.agent.style")

    def cache_len(self) -> int:
        """Slot columns: prompt and observations round up to engine buckets (at most 2x, or 16)."""
        return 2 * self.max_tokens + 16 * (self.max_turns + 1)


@dataclasses.dataclass
class Trajectory:
    task: dict
    sample: int
    env: object                 # RemoteEnv (rollouts), or an in-process Environment
    messages: list
    tools: list
    ids: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)
    policy: list = dataclasses.field(default_factory=list)     # bool per token
    calls: dict = dataclasses.field(default_factory=dict)      # message index -> parsed calls
    turns: int = 0
    n_calls: int = 0
    stop: str = ""
    verdict: object = None
    truncated: bool = False     # the last policy turn ran out of tokens
    timed_out: bool = False     # a step overran its limit
    spans: list = dataclasses.field(default_factory=list)
    note: str = ""              # why the stored ids do not spell the rendering, if they do not
    deadline: float = 0.0
    n_prompt: int = 0
    closed: bool = False        # env.close() was called (the episode ended)

    @property
    def policy_tokens(self) -> int:
        return int(sum(self.policy))


def render(messages, template, tok, tools):
    return render_chat(messages, template, tok, tools=tools or None)


def prompt_text(messages, template, tok, tools) -> str:
    """The rendering of `messages` up to where the next assistant turn's content starts."""
    r = render(messages + [{"role": "assistant", "content": ""}], template, tok, tools)
    return r.text[:r.part(len(messages), "content").start]


def assistant_message(history, text, calls, template, tok, tools) -> dict:
    """The stored message for a sampled turn: structured tool_calls when the template renders
    them back to exactly `text`, else the raw text (see the module doc)."""
    raw = {"role": "assistant", "content": text}
    if not calls or "<tool_call>" not in text:
        return raw
    content = text[:text.index("<tool_call>")].rstrip("\n")
    msg = {"role": "assistant", "content": content, "tool_calls": [c.to_message() for c in calls]}
    try:
        same = (render(history + [msg], template, tok, tools).text ==
                render(history + [raw], template, tok, tools).text)
    except InputError:
        same = False
    return msg if same else raw


def _budget(spec, eng, traj, seq_id, n_next: int) -> int:
    """Tokens the next turn may sample after `n_next` more context tokens (< 1: no room)."""
    col = eng.result(seq_id).col
    room_tok = spec.max_tokens - len(traj.ids) - n_next
    room_col = eng.lay.max_len - col - bucket_length(max(n_next, 1))
    return min(spec.max_new_tokens, room_tok, room_col)


class _Turns:
    """The host side of one batch of rollouts: what each finished turn does next."""

    def __init__(self, spec, tok, template, eos):
        self.spec, self.tok, self.template, self.eos = spec, tok, template, eos
        self.parse = spec.parser()

    def after_turn(self, traj: Trajectory, toks, lps, finish: str):
        """Append the turn, step the env; returns the observation text to append, or None when
        the episode ended (traj.stop set)."""
        spec, tok = self.spec, self.tok
        traj.ids += toks
        traj.logprobs += lps
        traj.policy += [True] * len(toks)
        stopped = finish == "stop"
        traj.truncated = not stopped
        traj.turns += 1
        bad = [t for t in toks if t >= tok.vocab_size]
        if bad:  # a model vocabulary padded past the tokenizer's: an id with no text
            traj.note = (f"the policy sampled token id {bad[0]}, which the tokenizer's "
                         f"{tok.vocab_size} tokens have no text for")
            traj.messages.append({"role": "assistant", "content": tok.decode(
                [t for t in toks[:-1 if stopped else None] if t < tok.vocab_size])})
            traj.verdict, traj.stop = Verdict(False, traj.note), "unknown_token"
            return None
        raw = tok.decode_bytes(toks[:-1] if stopped else toks)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:  # no text spells these bytes: nothing to render
            traj.note = f"the policy's turn {traj.turns} is not UTF-8 ({e.reason} at byte {e.start})"
            traj.messages.append({"role": "assistant", "content": raw.decode("utf-8", "replace")})
            traj.verdict, traj.stop = Verdict(False, traj.note), "invalid_utf8"
            return None
        try:
            calls, errors = self.parse(text, traj.n_calls)
        except Exception as e:  # a user's parser that raises: the policy's observation
            calls, errors = [], [f"the tool-call parser raised {type(e).__name__}: {e}"[:300]]
        traj.n_calls += len(calls)
        msg = assistant_message(traj.messages, text, calls, self.template, tok, traj.tools)
        if calls and "tool_calls" not in msg:
            traj.calls[str(len(traj.messages))] = [c.to_message() for c in calls]
        traj.messages.append(msg)
        if not calls and not errors:
            traj.verdict, traj.stop = _finish(traj, text), "answered"
            return None
        obs = [Observation("error: malformed tool call: " + e) for e in errors]
        done = False
        if calls:
            t0 = time.monotonic()
            limit = min(float(traj.env.step_timeout_s), traj.deadline - t0)
            got, done, traj.verdict = (traj.env.step(calls, traj.deadline)
                                       if isinstance(traj.env, RemoteEnv)
                                       else timed_step(traj.env, calls, traj.deadline))
            traj.timed_out = time.monotonic() - t0 >= limit
            obs = list(got) + obs
        traj.messages += [o.to_message() for o in obs]
        if done:
            traj.stop = "done"
            return None
        if traj.turns >= spec.max_turns:
            traj.stop = "max_turns"
            return None
        return self.delta(traj, prompt_text(traj.messages, self.template, tok, traj.tools))

    def delta(self, traj: Trajectory, full: str):
        """The text after what traj.ids spell, or None (traj.note says why) when the template
        rewrote the history instead of extending it."""
        head = self.tok.decode_bytes(traj.ids)
        body = full.encode("utf-8")
        if not body.startswith(head):
            k = next((i for i, (a, b) in enumerate(zip(head, body)) if a != b), len(body))
            traj.note = (f"the template's rendering of the history differs from the tokens so far "
                         f"at byte {k}; the episode stops")
            traj.stop = "template_mismatch"
            return None
        return body[len(head):].decode("utf-8")

    def finish(self, traj: Trajectory):
        """Close the record: the rendering's tail (the last observations, a truncated turn's end
        marker) as context tokens, then the per-message span map."""
        tok = self.tok
        full = render(traj.messages, self.template, tok, traj.tools).text
        if not traj.note:
            tail = self.delta(traj, full)
            if tail:
                tail = tail[:-1] if tail.endswith("\n") else tail  # as single-turn rows end
                ids = tok.encode(tail)
                traj.ids += ids
                traj.logprobs += [0.0] * len(ids)
                traj.policy += [False] * len(ids)
        traj.spans = message_spans(traj, full, tok, self.template)


def _finish(traj: Trajectory, text: str):
    if isinstance(traj.env, RemoteEnv):
        return traj.env.finish(text, traj.deadline)
    return traj.env.finish(text)


def message_spans(traj: Trajectory, full: str, tok, template) -> list:
    """[message, first token, end token) of each message's rendered parts (header tokens are
    context between them); empty when the ids do not spell the rendering."""
    if traj.note:
        return []
    r = render(traj.messages, template, tok, traj.tools)
    lens = tok.token_byte_lengths(np.asarray(traj.ids, np.int64))
    bends = np.cumsum(lens)
    starts, ends = byte_to_char_offsets(full, bends - lens, bends)
    out = []
    for i in range(len(traj.messages)):
        parts = [p for p in r.message_parts(i) if p.end > p.start]
        if not parts:
            continue
        cs, ce = min(p.start for p in parts), max(p.end for p in parts)
        t0 = int(np.searchsorted(ends, cs, side="right"))
        t1 = int(np.searchsorted(starts, ce, side="left"))
        out.append([i, t0, t1])
    return out


def rollouts(model_cfg, params, tok, tasks, spec: AgentSpec, *, group: int, temperature: float,
             top_p: float = 1.0, top_k: int = 0, seed: int = 0, template: str = "chatml",
             partitioner=None, threads: int | None = None,
             envs: list | None = None) -> list[Trajectory]:
    """`group` agent episodes of each task (rows i*group + j, as single-turn GRPO orders them).
    `threads`: env steps waited on at once (default: one per episode; a step's limit is counted
    from when it is sent). `envs`: RemoteEnv handles to reuse (their workers keep the env
    between episodes, reset per episode: a corpus env indexes once), extended in place to one
    per episode; a handle of another spec, or whose worker was lost, is replaced."""
    if tok.eos_id is None:
        raise ConfigError("the tokenizer has no end-of-turn token (eos) to end a policy turn.")
    turns = _Turns(spec, tok, template, tok.eos_id)
    part = sharding.as_partitioner(partitioner)
    mult = 1 if part is None else part.batch_size_multiple()
    n = len(tasks) * group
    envs = [] if envs is None else envs
    envs += [RemoteEnv(spec) for _ in range(n - len(envs))]
    for k, e in enumerate(envs[:n]):
        if not isinstance(e, RemoteEnv) or e.spec != spec or e.lost:
            envs[k] = RemoteEnv(spec)
        envs[k].start()  # the workers boot while the engine builds
    eng = Engine(model_cfg, params, slots=-(-n // mult) * mult, max_len=spec.cache_len(),
                 partitioner=part, n_stop=1, chunk=min(spec.max_new_tokens, 16))
    trajs, by_seq = [], {}
    for i, task in enumerate(tasks):
        group_envs = envs[i * group:(i + 1) * group]
        opening = [e.reset(task) for e in group_envs]
        if any(m != opening[0] for m in opening):
            raise InputError(f"environment {spec.env!r}: reset of task {task.get('id')!r} gave "
                             f"different messages for candidates of one group; it must be "
                             f"deterministic (the group shares one prefill).")
        tools = list(group_envs[0].tools) if spec.tools_in_prompt else []
        prompt = tok.encode(prompt_text(opening[0], template, tok, tools))
        group_trajs = [Trajectory(task, j, e, [dict(m) for m in opening[0]], tools,
                                  n_prompt=len(prompt)) for j, e in enumerate(group_envs)]
        for t in group_trajs:
            t.ids, t.logprobs, t.policy = list(prompt), [0.0] * len(prompt), [False] * len(prompt)
        budget = min(spec.max_new_tokens, spec.max_tokens - len(prompt),
                     eng.lay.max_len - bucket_length(max(len(prompt), 1)))
        if budget < 1:
            raise ConfigError(f"task {task.get('id')!r}: its {len(prompt)}-token prompt leaves no "
                              f"room in config.agent.max_tokens ({spec.max_tokens}).")
        sp = SamplingParams(budget, float(temperature), float(top_p), int(top_k), (tok.eos_id,),
                            (int(seed) % (1 << 32)) << 32 | i)
        for t, sid in zip(group_trajs, eng.submit(prompt, sp, n=group, hold=True)):
            t.deadline = time.monotonic() + float(spec.episode_timeout_s)
            by_seq[sid] = t
        trajs += group_trajs
    try:
        _drive(eng, turns, spec, tok, by_seq, threads)
        for t in trajs:
            turns.finish(t)
    finally:  # an env holding resources (bash's scratch copy) lets them go
        for t in trajs:
            _close(t)
    for k, t in enumerate(trajs):
        if t.timed_out or t.env.lost:  # an overrun step may still run: that env is not reused
            t.env.shutdown()
            envs[k] = RemoteEnv(spec)
    return trajs


def _close(traj: Trajectory):
    """env.close() once, when the episode ends."""
    if not traj.closed:
        traj.closed = True
        traj.env.close()


def _drive(eng, turns, spec, tok, by_seq, threads):
    """Decode until every episode ended, stepping envs as turns end."""
    with cf.ThreadPoolExecutor(max_workers=max(1, threads or len(by_seq))) as pool:
        while eng.busy:
            ended = [u for u in eng.step() if u.finished]
            if not ended:
                continue
            # Environment steps in parallel; the engine is driven from this thread only.
            jobs = [(u.seq_id, pool.submit(turns.after_turn, by_seq[u.seq_id],
                                           *_turn_of(eng, u.seq_id, by_seq[u.seq_id]),
                                           u.finish_reason)) for u in ended]
            for sid, fut in sorted(jobs, key=lambda x: x[0]):
                traj, text = by_seq[sid], fut.result()
                ids = tok.encode(text) if text else []
                b = _budget(spec, eng, traj, sid, len(ids)) if text is not None else 0
                if text is not None and (not ids or b < 1):
                    traj.stop = "context_budget"
                if traj.stop:
                    eng.release(sid)
                    _close(traj)
                    continue
                traj.ids += ids
                traj.logprobs += [0.0] * len(ids)
                traj.policy += [False] * len(ids)
                eng.extend(sid, ids, max_new_tokens=b)


def _turn_of(eng, seq_id, traj):
    """The tokens and log-probs of the sequence's latest turn (the engine keeps every turn's)."""
    s = eng.result(seq_id)
    k = int(sum(traj.policy))
    return list(s.tokens[k:]), list(s.logprobs[k:])
