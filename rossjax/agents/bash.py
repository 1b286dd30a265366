"""`bash`: a sandboxed shell over a scratch copy of a repository.

    env = make_env("bash")
    messages = env.reset({"prompt": "...", "repo": "data/swe/textkit"})
    obs, done, verdict = env.step([ToolCall("bash", {"command": "python -m pytest -q"})])

`reset` copies the task's repository (regular files only, rossjax.verify.repo) into a fresh
scratch directory; the original is never handed to the sandbox, so nothing can write it. Each
call runs one command with `rossjax.verify.sandbox.run_shell`: the scratch copy is the writable
cwd, the rest is as confined as a program (no network, no host files outside the interpreter,
/usr/bin and `read_roots`: by default the episode runtime of rossjax.verify.repo, a venv of
only pytest and its requirements, so `python -m pytest` works; never the running venv, which in
a wheel install holds rossjax's clean data/swe sources, an episode's answer), under a
per-step timeout the kernel enforces (every process of the step dies with it). The observation
is the exit code, stdout and stderr, cut to `max_output_chars` with a note saying how much.

The verdict, when the policy answers without a tool call: `grader(workdir, task)` if given
(the SWE solver's suite check, rossjax/agents/swe.py), else the task's `check` command run in
the sandbox over the scratch copy (passed iff it exits 0), else none.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

from rossjax.agents.builtin import _schema
from rossjax.agents.env import Environment, Observation, ToolCall
from rossjax.errors import InputError
from rossjax.verify import sandbox
from rossjax.verify.repo import copy_tree, default_read_roots, package_exposed, shell_env
from rossjax.verify.sandbox_host import get_host
from rossjax.verify.verdict import Verdict

_MARGIN_S = 0.3  # the sandbox's own start and teardown, inside the thread deadline of timed_step


def _disk_use(root: str) -> int:
    """Bytes allocated below `root` (links not followed)."""
    total = 0
    for d, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(d, name)).st_blocks * 512
            except OSError:
                pass
    return total


def clip(text: str, limit: int) -> str:
    """`text`, or its head and tail with a note of how many characters were cut."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


@dataclass
class BashEnv(Environment):
    name: str = "bash"
    system: str = ("You are in a shell at the root of a repository. Run one command per bash "
                   "call; each returns its exit code, stdout and stderr. Reply without a tool "
                   "call when you are done.")
    limits: sandbox.Limits = field(default_factory=lambda: sandbox.Limits(
        procs=64, memory_mb=2048, output_bytes=1 << 20, disk_mb=64))
    read_roots: tuple = field(default_factory=default_read_roots)
    max_output_chars: int = 8000
    grader: Callable[[str, dict], Verdict] | None = None
    tools: list = field(default_factory=lambda: [_schema(
        "bash", "Run a bash command at the repository root; returns the exit code, stdout "
        "and stderr.", "command", "a bash command line")])

    def __post_init__(self):
        self.workdir = self._scratch = None
        self.task: dict = {}
        self._deadline = 0.0

    def reset(self, task: dict) -> list[dict]:
        if not isinstance(task, dict) or not isinstance(task.get("prompt"), str):
            raise InputError(f"bash task must be an object with a string prompt, got {task!r:.80}")
        repo = task.get("repo")
        if not isinstance(repo, str) or not os.path.isdir(repo):
            raise InputError(f"bash task {task.get('id', '')!r}: field 'repo' must name a "
                             f"directory, got {repo!r:.120}")
        where = package_exposed([*self.read_roots, *get_host().ro_dirs, "/usr/bin", "/bin"])
        if where:  # e.g. rossjax installed into the interpreter's own prefix, not a venv
            raise InputError(f"bash environment: the sandbox may read {where}, which holds the "
                             "rossjax package and its clean SWE sources (an episode's answer); "
                             "install rossjax in a venv, or grant read roots that exclude it")
        self.close()
        self._scratch = tempfile.mkdtemp(prefix="rossjax-bash-")
        os.chmod(self._scratch, 0o711)  # a sandbox uid on the host's tree must reach the copy
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._scratch, True)
        self.workdir = os.path.join(self._scratch, "repo")
        copy_tree(repo, self.workdir)
        self.task = task
        self._deadline = time.monotonic() + float(self.episode_timeout_s)
        return ([{"role": "system", "content": self.system}] if self.system else []) + [
            {"role": "user", "content": task["prompt"]}]

    def close(self):
        """Remove the scratch copy (also done at the next reset and when the env is freed)."""
        if self._scratch:
            self._finalizer()
            self._scratch = self.workdir = None

    def run(self, command: str, timeout_s: float | None = None) -> sandbox.RunResult:
        """One command in the sandbox over the scratch copy (also used by graders)."""
        if self.workdir is None:
            raise InputError("bash environment: reset(task) before running commands")
        t = min(float(timeout_s or self.step_timeout_s) - _MARGIN_S, self.limits.max_timeout_s)
        return sandbox.run_shell(command, self.workdir, max(t, 0.05), limits=self.limits,
                                 read_roots=self.read_roots, env=shell_env(self.read_roots))

    def step(self, tool_calls: list[ToolCall]):
        obs = []
        for c in tool_calls:
            left = self._deadline - time.monotonic()
            if left <= _MARGIN_S + 0.05:
                obs.append(Observation("error: episode time limit reached", c.id, c.name))
                return obs, True, Verdict(False, f"bash episode over its "
                                                 f"{self.episode_timeout_s:g} s limit")
            obs.append(self.call(c, min(float(self.step_timeout_s), left)))
            used = _disk_use(self.workdir)
            if used > self.limits.disk_mb << 20:  # the copy is no size-capped tmpfs: checked here
                obs[-1].content += (f"\n[disk_limit: the repository copy holds {used >> 20} MB, "
                                    f"over {self.limits.disk_mb} MB; the episode ends]")
                return obs, True, Verdict(False, f"bash: the repository copy grew past "
                                                 f"{self.limits.disk_mb} MB")
        return obs, False, None

    def call(self, c: ToolCall, timeout_s: float) -> Observation:
        if c.name != "bash":
            return Observation(f"error: unknown tool {c.name!r}; the tool is bash", c.id, c.name)
        cmd = c.arguments.get("command")
        if not isinstance(cmd, str) or not cmd.strip():
            return Observation("error: bash needs a non-empty string argument 'command'",
                               c.id, c.name)
        r = self.run(cmd, timeout_s)
        head = f"exit code: {r.returncode}" if r.returncode is not None else "exit code: none"
        if r.reason and not r.reason.startswith("exit_code"):
            head += f" [{r.reason}]"
        body = f"{head}\n[stdout]\n{r.stdout}" + (f"\n[stderr]\n{r.stderr}" if r.stderr else "")
        return Observation(clip(body, self.max_output_chars), c.id, c.name)

    def finish(self, final_text: str) -> Verdict | None:
        if self.grader is not None:
            return self.grader(self.workdir, self.task)
        check = self.task.get("check")
        if not isinstance(check, str):
            return None
        r = self.run(check, self.step_timeout_s)
        if r.reason and r.reason.startswith("sandbox_error"):
            return Verdict(None, r.reason)
        return Verdict(r.returncode == 0, f"check {check[:60]!r} exited {r.returncode}"
                       + (f" ({r.reason})" if r.reason else ""))
