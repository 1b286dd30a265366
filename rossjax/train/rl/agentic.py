"""Multi-turn agent rollouts on the rollout engine, with the exact tokens the policy saw.

    trajs = rollouts(model_cfg, params, tok, tasks, AgentSpec(env="calculator"), group=4,
                     temperature=1.0, seed=0, partitioner=part)

Each task's `group` candidates are live engine sequences (one shared prefill, `hold=True`).
When a candidate's turn ends (the end-of-turn token, or the turn's token budget), its sampled
text is taken by the one agent turn (rossjax.agents.episode: tool calls parsed by `style`
hermes | react | module:function, the env stepped in its own CPU worker process through
rossjax.agents.remote.RemoteEnv, an agents.EnvHandle), and the
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
import time

import numpy as np

from rossjax import sharding
from rossjax.agents.env import EnvSpec
from rossjax.agents.episode import Episode, Reply, StopReason
from rossjax.agents.parse import parser
from rossjax.agents.remote import RemoteEnv
from rossjax.engine import Engine, SamplingParams, bucket_length
from rossjax.engine.types import request_seed
from rossjax.errors import ConfigError, InputError
from rossjax.templates import render_chat, render_prompt
from rossjax.tokenizers import byte_to_char_offsets


@dataclasses.dataclass(frozen=True)
class AgentSpec(EnvSpec):
    """config.agent: the environment (agents.EnvSpec's fields) and the episode's budgets."""

    style: str = "hermes"           # hermes | react | module:function (text, n0) -> (calls, errors)
    max_turns: int = 4
    max_tokens: int = 1024          # context budget of a trajectory, in tokens
    max_new_tokens: int = 64        # per policy turn
    tools_in_prompt: bool = True    # render the env's tools into the prompt (and the row)

    @classmethod
    def from_config(cls, a, max_new_tokens: int) -> AgentSpec:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in a.to_dict().items() if k in fields},
                   max_new_tokens=int(max_new_tokens))

    def parser(self):
        return parser(self.style, "config.agent.style")

    def env_spec(self) -> EnvSpec:
        """The env part alone: handles are reused across specs that differ only in budgets."""
        return EnvSpec(**{f.name: getattr(self, f.name) for f in dataclasses.fields(EnvSpec)})

    def cache_len(self) -> int:
        """Slot columns: prompt and observations round up to engine buckets (at most 2x, or 16)."""
        return 2 * self.max_tokens + 16 * (self.max_turns + 1)


@dataclasses.dataclass(kw_only=True)
class Trajectory(Episode):
    """An episode (agents.Episode: env, messages, turns, stop, verdict, calls) on the engine,
    with the exact tokens: `ids`, the sampler's `logprobs`, `policy` (bool per token)."""

    task: dict
    sample: int
    tools: list
    ids: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)
    policy: list = dataclasses.field(default_factory=list)     # bool per token
    truncated: bool = False     # the last policy turn ran out of tokens
    spans: list = dataclasses.field(default_factory=list)
    note: str = ""              # why the stored ids do not spell the rendering, if they do not
    n_prompt: int = 0
    closed: bool = False        # env.close() was called (the episode ended)

    @property
    def policy_tokens(self) -> int:
        return int(sum(self.policy))

    def add(self, ids: list, logprobs: list | None = None):
        """Append tokens: sampled ones with their log-probs, else context (log-prob 0)."""
        self.ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.policy += [logprobs is not None] * len(ids)


def render(messages, template, tok, tools):
    return render_chat(messages, template, tok, tools=tools or None)


def prompt_text(messages, template, tok, tools) -> str:
    """The rendering of `messages` up to where the next assistant turn's content starts."""
    return render_prompt(messages, template, tok, tools)


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


class TokenTurns:
    """The token side of the engine's episodes: each finished turn is decoded and taken by
    agents.Episode.turn (the one agent turn); what it appends is kept as exact ids."""

    def __init__(self, spec: AgentSpec, tok, template: str):
        self.spec, self.tok, self.template = spec, tok, template
        self.parse = spec.parser()

    def start(self, task: dict, sample: int, env, opening: list, tools: list,
              prompt: list) -> Trajectory:
        """A trajectory whose context so far is `prompt` (the ids of `opening`'s rendering)."""
        t = Trajectory(env=env, messages=[dict(m) for m in opening], tools=tools, task=task,
                       sample=sample, max_turns=self.spec.max_turns, parse=self.parse,
                       n_prompt=len(prompt))
        t.add(list(prompt))
        return t

    def after_turn(self, traj: Trajectory, toks, lps, finish: str):
        """Append the turn, step the env; returns the observation text to append, or None when
        the episode ended (traj.stop set)."""
        traj.add(list(toks), list(lps))
        stopped = finish == "stop"
        traj.truncated = not stopped
        text = self._text(traj, toks, stopped)
        if text is None or traj.turn(Reply(text), self._message(traj)) is not None:
            return None
        return self.delta(traj, prompt_text(traj.messages, self.template, self.tok, traj.tools))

    def _text(self, traj: Trajectory, toks, stopped: bool) -> str | None:
        """The turn's text, or None when no text spells its tokens (the episode ended)."""
        tok = self.tok
        bad = [t for t in toks if t >= tok.vocab_size]
        if bad:  # a model vocabulary padded past the tokenizer's: an id with no text
            traj.note = (f"the policy sampled token id {bad[0]}, which the tokenizer's "
                         f"{tok.vocab_size} tokens have no text for")
            traj.unreadable(tok.decode([t for t in toks[:-1 if stopped else None]
                                        if t < tok.vocab_size]), StopReason.UNKNOWN_TOKEN,
                            traj.note)
            return None
        raw = tok.decode_bytes(toks[:-1] if stopped else toks)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:  # no text spells these bytes: nothing to render
            traj.note = (f"the policy's turn {traj.turns + 1} is not UTF-8 ({e.reason} at byte "
                         f"{e.start})")
            traj.unreadable(raw.decode("utf-8", "replace"), StopReason.INVALID_UTF8, traj.note)
            return None

    def _message(self, traj: Trajectory):
        return lambda history, text, calls: assistant_message(history, text, calls,
                                                              self.template, self.tok, traj.tools)

    def observe(self, traj: Trajectory, text: str | None, room) -> tuple | None:
        """(context ids of `text`, the next turn's token budget), appended to traj; None when
        the episode ended (CONTEXT_BUDGET when nothing fits). `room(n)`: the cache columns
        left for sampling after n more context tokens."""
        if text is None:
            return None
        ids = self.tok.encode(text)
        spec = self.spec
        budget = min(spec.max_new_tokens, spec.max_tokens - len(traj.ids) - len(ids),
                     room(len(ids)))
        if not ids or budget < 1:
            traj.end(StopReason.CONTEXT_BUDGET)
            return None
        traj.add(ids)
        return ids, budget

    def delta(self, traj: Trajectory, full: str):
        """The text after what traj.ids spell, or None (traj.note says why) when the template
        rewrote the history instead of extending it."""
        head = self.tok.decode_bytes(traj.ids)
        body = full.encode("utf-8")
        if not body.startswith(head):
            k = next((i for i, (a, b) in enumerate(zip(head, body)) if a != b), len(body))
            traj.note = (f"the template's rendering of the history differs from the tokens so far "
                         f"at byte {k}; the episode stops")
            traj.end(StopReason.TEMPLATE_MISMATCH)
            return None
        return body[len(head):].decode("utf-8")

    def close_record(self, traj: Trajectory):
        """Close the record: the rendering's tail (the last observations, a truncated turn's end
        marker) as context tokens, then the per-message span map."""
        tok = self.tok
        full = render(traj.messages, self.template, tok, traj.tools).text
        if not traj.note:
            tail = self.delta(traj, full)
            if tail:
                tail = tail[:-1] if tail.endswith("\n") else tail  # as single-turn rows end
                traj.add(tok.encode(tail))
        traj.spans = message_spans(traj, full, tok, self.template)


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
    per episode; a handle of another env spec, or whose worker was lost, is replaced."""
    if tok.eos_id is None:
        raise ConfigError("the tokenizer has no end-of-turn token (eos) to end a policy turn.")
    turns = TokenTurns(spec, tok, template)
    part = sharding.as_partitioner(partitioner)
    mult = 1 if part is None else part.batch_size_multiple()
    n = len(tasks) * group
    envs = _handles([] if envs is None else envs, spec.env_spec(), n)
    eng = Engine(model_cfg, params, slots=-(-n // mult) * mult, max_len=spec.cache_len(),
                 partitioner=part, n_stop=1, chunk=min(spec.max_new_tokens, 16))
    trajs, by_seq = [], {}
    for i, task in enumerate(tasks):
        sp = SamplingParams(1, float(temperature), float(top_p), int(top_k), (tok.eos_id,),
                            request_seed(seed, i))
        group_trajs = _start_group(eng, turns, task, envs[i * group:(i + 1) * group], sp, by_seq)
        trajs += group_trajs
    try:
        _drive(eng, turns, by_seq, threads)
        for t in trajs:
            turns.close_record(t)
    finally:  # an env holding resources (bash's scratch copy) lets them go
        for t in trajs:
            _close(t)
    for k, t in enumerate(trajs):
        if t.timed_out or t.env.lost:  # an overrun step may still run: that env is not reused
            t.env.shutdown()
            envs[k] = RemoteEnv(spec.env_spec())
    return trajs


def _handles(envs: list, env_spec: EnvSpec, n: int) -> list:
    """`envs` extended in place to `n` started RemoteEnvs of `env_spec` (others replaced)."""
    envs += [RemoteEnv(env_spec) for _ in range(n - len(envs))]
    for k, e in enumerate(envs[:n]):
        if not isinstance(e, RemoteEnv) or e.spec != env_spec or e.lost:
            envs[k] = RemoteEnv(env_spec)
        envs[k].start()  # the workers boot while the engine builds
    return envs


def _start_group(eng, turns: TokenTurns, task: dict, group_envs: list, sp: SamplingParams,
                 by_seq: dict) -> list:
    """Reset the group's envs and submit their one shared prompt (`sp` with its budget set)."""
    spec, tok, template = turns.spec, turns.tok, turns.template
    opening = [e.reset(task) for e in group_envs]
    if any(m != opening[0] for m in opening):
        raise InputError(f"environment {spec.env!r}: reset of task {task.get('id')!r} gave "
                         f"different messages for candidates of one group; it must be "
                         f"deterministic (the group shares one prefill).")
    tools = list(group_envs[0].tools) if spec.tools_in_prompt else []
    prompt = tok.encode(prompt_text(opening[0], template, tok, tools))
    budget = min(spec.max_new_tokens, spec.max_tokens - len(prompt),
                 eng.max_len - bucket_length(max(len(prompt), 1)))
    if budget < 1:
        raise ConfigError(f"task {task.get('id')!r}: its {len(prompt)}-token prompt leaves no "
                          f"room in config.agent.max_tokens ({spec.max_tokens}).")
    group = [turns.start(task, j, e, opening[0], tools, prompt) for j, e in enumerate(group_envs)]
    sp = dataclasses.replace(sp, max_new_tokens=budget)
    for t, sid in zip(group, eng.submit(prompt, sp, n=len(group), hold=True)):
        t.deadline = time.monotonic() + float(spec.episode_timeout_s)
        by_seq[sid] = t
    return group


def _close(traj: Trajectory):
    """env.close() once, when the episode ends."""
    if not traj.closed:
        traj.closed = True
        traj.env.close()


def _drive(eng, turns: TokenTurns, by_seq: dict, threads):
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
                traj = by_seq[sid]
                nxt = turns.observe(traj, fut.result(), lambda n, sid=sid: _room(eng, sid, n))
                if nxt is None:
                    eng.release(sid)
                    _close(traj)
                    continue
                ids, budget = nxt
                eng.extend(sid, ids, max_new_tokens=budget)


def _room(eng, seq_id, n_next: int) -> int:
    """Cache columns the sequence may still sample into after `n_next` more context tokens."""
    return eng.max_len - eng.result(seq_id).cache_used - bucket_length(max(n_next, 1))


def _turn_of(eng, seq_id, traj):
    """The tokens and log-probs of the sequence's latest turn (the engine keeps every turn's)."""
    s = eng.result(seq_id)
    k = int(sum(traj.policy))
    return list(s.tokens[k:]), list(s.logprobs[k:])
