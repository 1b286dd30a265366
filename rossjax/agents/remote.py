"""An environment in a CPU worker process of its own: what agentic rollouts step.

    env = RemoteEnv(spec)   # spec: an agents.EnvSpec (env, kwargs(), limits)
    messages = env.reset(task); obs, done, verdict = env.step(calls, deadline)

RemoteEnv is an agents.EnvHandle, as LocalEnv (an env in process) is: episodes step either
the same way, and both end a failed step with env.py's observations and verdicts.

The env is built in the worker (rossjax.verify.pool.Worker: spawned, jax-free) by make_env,
reset, stepped, judged and closed there; only picklable values cross. A step past its limit
kills the worker (the episode ends failed and the caller replaces the handle); a worker that
dies fails its episode with the reason; a tool that raises is the policy's observation.
What the worker answers is checked for shape (the class is a user's): a reset or start-up that
is not what Environment promises is one InputError naming the env and task; a step or finish
answer of the wrong shape ends the episode unjudged (Verdict None) with the reason, as a raise
does; none of them reaches the trainer as a TypeError.
"""

from __future__ import annotations

from rossjax.agents.env import (
    EnvSpec,
    Observation,
    episode_over,
    failed_step,
    make_env,
    step_limit,
    step_overran,
    step_raised,
)
from rossjax.errors import InputError
from rossjax.verify.pool import START_TIMEOUT_S, Worker, WorkerDied, WorkerError, WorkerTimeout
from rossjax.verify.verdict import Verdict


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 120 else r[:117] + "..."


def _bad_messages(msgs) -> str | None:
    """Why `msgs` is not a list of {role: str, content: str} messages (None when it is)."""
    if not isinstance(msgs, list):
        return f"{type(msgs).__name__} {_short(msgs)}, not a list of messages"
    for i, m in enumerate(msgs):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            return f"message {i} {_short(m)}, not a {{role: str, content: str}} object"
    return None


def _bad_step(got) -> str | None:
    """Why `got` is not step's (list of Observation, bool done, Verdict or None)."""
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return f"{_short(got)}"
    obs, done, verdict = got
    if not isinstance(obs, (list, tuple)) or not all(
            isinstance(o, Observation) and isinstance(o.content, str) for o in obs):
        return f"observations {_short(obs)}"
    if not isinstance(done, bool):
        return f"done={_short(done)}"
    if verdict is not None and not isinstance(verdict, Verdict):
        return f"verdict={_short(verdict)}"
    return None


_STEP_SHAPE = "(list of Observation with str content, bool done, Verdict or None)"


class RemoteEnv:
    """An environment of `spec` in its own worker process: an agents.EnvHandle (`step` and
    `finish` take the episode's deadline and never raise or hang)."""

    def __init__(self, spec: EnvSpec):  # its env, kwargs() and limits are read
        self.spec, self.name, self.tools = spec, spec.env, []
        self.step_timeout_s, self.episode_timeout_s = spec.step_timeout_s, spec.episode_timeout_s
        self._w = None

    @property
    def lost(self) -> str:
        """Why the worker is spent ("" while usable): a replaced handle is never reused."""
        return self._w.dead if self._w is not None and self._w.dead != "closed" else ""

    @property
    def pid(self) -> int | None:
        return self._w.pid if self._w is not None else None

    def start(self):
        if self._w is None:
            self._w = Worker(make_env, (self.spec.env,), dict(
                step_timeout_s=self.spec.step_timeout_s,
                episode_timeout_s=self.spec.episode_timeout_s, **self.spec.kwargs()),
                attrs=("name", "tools"))
        return self

    def reset(self, task: dict) -> list:
        try:
            info = self.start()._w.info(START_TIMEOUT_S)
            name, tools = info["name"], info["tools"] or []
            if not isinstance(name, str) or not isinstance(tools, list) or not all(
                    isinstance(t, dict) for t in tools):
                raise InputError(f"environment {self.spec.env!r}: its name {_short(name)} must be "
                                 f"a string and its tools {_short(tools)} a list of objects.")
            self.name, self.tools = name, list(tools)
            got = self._w.call("reset", task, timeout=self.episode_timeout_s)
        except (WorkerDied, WorkerError) as e:
            raise InputError(f"environment {self.spec.env!r}: reset of task {task.get('id')!r} in "
                             f"its worker process failed: {e}") from None
        why = _bad_messages(got)
        if why:
            raise InputError(f"environment {self.spec.env!r}: reset of task {task.get('id')!r} "
                             f"returned {why}.")
        return got

    def step(self, calls, deadline: float):
        left = step_limit(self.step_timeout_s, deadline)
        if left <= 0:
            return episode_over(calls, self.episode_timeout_s)
        try:
            got = self._w.call("step", calls, timeout=left)
        except WorkerTimeout:
            return step_overran(self.name, calls, left, "; its worker was killed")
        except WorkerDied as e:
            return failed_step(calls, "error: the environment's process died", f"{self.name}: {e}")
        except WorkerError as e:  # a broken tool is the policy's observation, the episode ends
            return step_raised(self.name, calls, str(e))
        why = _bad_step(got)
        if why:  # the env is broken, not the policy: the episode ends unjudged
            return failed_step(calls, f"error: the environment's step returned {why}",
                               f"{self.name} step returned {why}, not {_STEP_SHAPE}", None)
        return tuple(got)

    def finish(self, text: str, deadline: float):
        left = step_limit(self.step_timeout_s, deadline)
        try:
            got = self._w.call("finish", text, timeout=max(left, 0.0))
        except WorkerError as e:
            return Verdict(None, f"{self.name} finish raised {e}"[:300])
        except WorkerDied as e:
            return Verdict(False, f"{self.name} finish: {e}"[:300])
        if got is not None and not isinstance(got, Verdict):
            return Verdict(None, f"{self.name} finish returned {_short(got)}, not a Verdict or "
                                 f"None"[:300])
        return got

    def close(self):
        """env.close() in the worker, if the class has one (the worker stays, for reuse)."""
        if self._w is not None and not self._w.dead:
            try:
                self._w.call("close", timeout=float(self.step_timeout_s))
            except WorkerError:
                pass  # no close(), or it raised: the next reset starts over
            except WorkerDied:
                pass  # killed: nothing is left to release

    def shutdown(self):
        if self._w is not None:
            self._w.close()
