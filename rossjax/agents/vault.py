"""`vault`: the demo environment whose reward a tiny model visibly learns with agentic GRPO on CPU.

Each task hides a one-digit code (0-9); the prompt is the same for every task and never holds
it. The tool `open()` returns the code (shown `repeat` times); the episode passes when the final
answer (the reply's text after "Answer:", else the whole reply) is the code. Without the call
the policy can only guess (1 in 10), so the reward measures what agentic RL should teach: call
the tool, then use what it returned.

The warm-up (`demonstrations`, data/agents/vault_sft.jsonl) is the verifier-positive episodes of
a prior policy that opens the vault in `call_share` of its episodes and otherwise answers at
once with a uniform guess (a guess row is one whose guess happened to be the code: the env
judges every row, so cloning them teaches "answer a random digit" on that branch, never the
code). A model cloned from them opens in about `call_share` of its episodes and passes about
call_share x (its copy accuracy) + (1 - call_share) / 10 of them; GRPO's groups then hold calls
that pass and guesses that fail, and the reply's first tokens (`Action` or a digit) carry the
advantage. Calls are ReAct (`agent.style="react"`, `Action: open[]`: 14 ASCII tokens; a hermes
call is ~45, more than a tiny model spells reliably after a short warm-up).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field

from rossjax.agents.builtin import _Answered
from rossjax.agents.env import Observation, ToolCall
from rossjax.errors import InputError

CODES = string.digits  # a token class the context holds nowhere else: the copy is one lookup
TOOL = "open"
CALL = f"Action: {TOOL}[]"


PROMPT = "Vault code?"  # the same for every task: only a tool tells them apart


def _tool(name: str, desc: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {}, "required": []}}}


@dataclass
class VaultEnv(_Answered):
    """`open()`: the task's code (task["answer"], one of 0-9). Another tool name or a non-empty
    argument is an error observation naming it, and the episode goes on.
    A ReAct `Action: open[]` parses as open(input="") and counts as no argument."""

    name: str = "vault"
    # the code shown `repeat` times ("7777..."): a tiny model learns to copy a digit it sees
    # once in a ~70-token context only after a long plateau (measured, docs/agents.md); the
    # answer is still the one digit
    repeat: int = 8
    system: str = ""   # the shipped demonstrations open with the user's question alone
    tools: list = field(default_factory=lambda: [
        _tool(TOOL, "Open the vault of this task; returns its code digit.")])

    def reset(self, task: dict) -> list[dict]:
        msgs = super().reset(task)
        code = task.get("answer")
        if not (isinstance(code, str) and len(code) == 1 and code in CODES):
            raise InputError(f"vault task {task.get('id')!r}: answer must be one digit 0-9 "
                             f"(the hidden code), got {code!r:.40}")
        return msgs

    def call(self, c: ToolCall) -> Observation:
        if c.name != TOOL:
            return self.unknown(c)
        if any(v not in ("", None) for v in c.arguments.values()):
            return Observation(f"error: {c.name} takes no arguments, got "
                               f"{', '.join(sorted(map(str, c.arguments)))[:80]}", c.id, c.name)
        return Observation(self.task["answer"] * self.repeat, c.id, c.name)


def tasks(n: int, seed: int, first_number: int = 0) -> list[dict]:
    """`n` vault tasks (ids vault-<first_number + k>) with uniform random codes."""
    rng = random.Random(seed)
    return [{"id": f"vault-{first_number + k:04d}", "prompt": PROMPT,
             "answer": rng.choice(CODES)} for k in range(n)]


def demonstrations(n: int, *, call_share: float, seed: int = 0, first_number: int = 1000,
                   **env_kwargs) -> list[dict]:
    """`n` passing episodes (rollout schema) of the prior the module doc describes, each played
    through the real VaultEnv and judged by it: `round(n * call_share)` open the vault and
    answer the digit it shows; the others answer at once with a uniform guess, at a task whose
    code is that guess (the prior's lucky guesses). Ids start at `first_number`, apart from the
    GRPO tasks'; the two kinds are shuffled by `seed`. A call is stored as agentic rollouts
    store a ReAct turn: its raw text."""
    if not 0.0 <= call_share <= 1.0:
        raise ValueError(f"call_share is {call_share}; it must be in [0, 1].")
    rng, env, rows = random.Random(seed), VaultEnv(**env_kwargs), []
    n_call = round(n * call_share)
    kinds = [True] * n_call + [False] * (n - n_call)
    rng.shuffle(kinds)
    for k, (task, opens) in enumerate(zip(tasks(n, seed + 1, first_number), kinds)):
        msgs = env.reset(task)
        if opens:
            (obs,), _, _ = env.step([ToolCall(TOOL, {"input": ""}, "call_0")])
            msgs += [{"role": "assistant", "content": CALL}, obs.to_message()]
            answer = obs.content[0]
        else:  # the guess, drawn before the code: rows are the guesses that were right
            answer = task["answer"]
        verdict = env.finish(answer)
        msgs.append({"role": "assistant", "content": answer})
        rows.append({"id": f"vault-demo-{k:04d}", "task": task, "messages": msgs,
                     "verifier": {"name": "agents.vault", "passed": verdict.passed,
                                  "evidence": verdict.evidence}})
    return rows
