"""Built-in environments: `python` (code in the sandbox) and `calculator` (the shipped demo).

Both end an episode when the policy answers without a tool call: the final answer (the text
after the last "Answer:", else the whole reply) is compared with the task's `answer`: an
integer answer exactly, another number within the task's `tolerance` (absolute) or else
rel/abs 1e-9, anything else as text (`_same`).
"""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass, field
from fractions import Fraction

from rossjax.agents.env import Environment, Observation, ToolCall
from rossjax.verify import pysource, sandbox
from rossjax.verify.verdict import Verdict

_ANSWER = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)


def final_answer(text: str) -> str:
    found = _ANSWER.findall(text or "")
    return (found[-1] if found else (text or "")).strip().rstrip(".")


REL_TOL = ABS_TOL = 1e-9  # a float answer's tolerance, unless the task states `tolerance`
_INT = re.compile(r"[+-]?\d+")
_DEC = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE]([+-]?\d{1,4}))?")


def _number(x) -> Fraction | None:
    """The exact value of an int, a finite float or a decimal literal ("1e3", "0.1", "-7"),
    else None; exponents past 1000 are no number (10**(10**9) would hang the grader)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return Fraction(x) if math.isfinite(x) else None
    m = _DEC.fullmatch(x.strip()) if isinstance(x, str) and len(x) < 1000 else None
    if m is None or (m.group(1) and abs(int(m.group(1))) > 1000):
        return None
    return Fraction(m.group(0))


def _same(got: str, want, tolerance=None) -> bool:
    """Integers exactly (isclose at rel 1e-9 took 1000000000 for 1000000001, and floats lose
    digits past 2**53); any other number within `tolerance` (absolute, the task's, a number)
    or REL_TOL/ABS_TOL; anything else as text, case and surrounding space ignored."""
    g, w = _number(got), _number(want)
    if g is None or w is None:
        return got.strip().lower() == str(want).strip().lower()
    if isinstance(want, int) or (isinstance(want, str) and _INT.fullmatch(want.strip())):
        return g == w
    if tolerance is not None:
        return abs(g - w) <= tolerance
    return math.isclose(float(g), float(w), rel_tol=REL_TOL, abs_tol=ABS_TOL)


class _Answered(Environment):
    def reset(self, task: dict) -> list[dict]:
        if not isinstance(task, dict) or not isinstance(task.get("prompt"), str):
            from rossjax.errors import InputError
            raise InputError(f"{self.name} task must be an object with a string prompt, "
                             f"got {task!r:.80}")
        self.task = task
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": task["prompt"]}]

    def finish(self, final_text: str) -> Verdict | None:
        if self.task.get("answer") is None:
            return None
        got, tol = final_answer(final_text), self.task.get("tolerance")
        if tol is not None and (_number(tol) is None or _number(tol) < 0):
            return Verdict(None, f"task.tolerance {tol!r} is not a non-negative number")
        ok = _same(got, self.task["answer"], None if tol is None else _number(tol))
        return Verdict(ok, f"answer {got[:60]!r} {'==' if ok else '!='} {self.task['answer']!r}")

    def step(self, tool_calls: list[ToolCall]):
        return [self.call(c) for c in tool_calls], False, None

    def unknown(self, c: ToolCall) -> Observation:
        names = ", ".join(t["function"]["name"] for t in self.tools)
        return Observation(f"error: unknown tool {c.name!r}; the tools are {names}", c.id, c.name)


def _schema(name: str, desc: str, arg: str, arg_desc: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "properties": {arg: {"type": "string",
                                                              "description": arg_desc}},
                       "required": [arg]}}}


@dataclass
class PythonEnv(_Answered):
    """`python(code)`: runs the code in rossjax.verify.sandbox (kernel-confined, no network,
    no files of the host) and returns its stdout and stderr."""

    name: str = "python"
    system: str = ("Use the python tool to compute; it returns stdout. "
                   "Reply 'Answer: <value>' when done.")
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    tools: list = field(default_factory=lambda: [_schema(
        "python", "Run Python source; returns its stdout and stderr.", "code", "Python source")])

    def call(self, c: ToolCall) -> Observation:
        if c.name != "python":
            return self.unknown(c)
        code = c.arguments.get("code")
        if not isinstance(code, str):
            return Observation("error: python needs a string argument 'code'", c.id, c.name)
        timeout = min(float(self.step_timeout_s), self.limits.max_timeout_s)
        r = sandbox.run(code, timeout_s=timeout, limits=self.limits)
        text = r.stdout + (f"\n[stderr]\n{r.stderr}" if r.stderr else "")
        if not r.ok:
            text += f"\n[{r.reason}]"
        return Observation(text[-4000:] or "(no output)", c.id, c.name)


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expr: str) -> float:
    """Arithmetic only (numbers, + - * / // % **, parentheses): an AST walk, never eval."""
    def walk(n):
        if isinstance(n, ast.Expression):
            return walk(n.body)
        if isinstance(n, ast.Constant) and type(n.value) in (int, float):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            a, b = walk(n.left), walk(n.right)
            if isinstance(n.op, ast.Pow) and abs(b) > 64:
                raise ValueError("exponent over 64")
            return _OPS[type(n.op)](a, b)
        if isinstance(n, ast.UnaryOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](walk(n.operand))
        raise ValueError(f"unsupported syntax {type(n).__name__}")
    return walk(pysource.parse(expr, mode="eval"))


@dataclass
class CalculatorEnv(_Answered):
    """The shipped demo (data/agents/calculator.jsonl): `calculate(expression)` does arithmetic;
    the reward is the final answer matching. A tiny policy learns to call it, copy the number
    and answer, so the reward rises in a few GRPO steps."""

    name: str = "calculator"
    system: str = ("You can call calculate(expression) for arithmetic. "
                   "Reply 'Answer: <number>' when done.")
    tools: list = field(default_factory=lambda: [_schema(
        "calculate", "Evaluate an arithmetic expression.", "expression", "e.g. 17*23")])

    def call(self, c: ToolCall) -> Observation:
        if c.name != "calculate":
            return self.unknown(c)
        expr = c.arguments.get("expression")
        if not isinstance(expr, str) or len(expr) > 200:
            return Observation("error: calculate needs a string 'expression' (at most 200 "
                               "characters)", c.id, c.name)
        try:
            v = evaluate(expr)
        except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as e:
            return Observation(f"error: {type(e).__name__}: {e}", c.id, c.name)
        return Observation(f"{v:g}" if isinstance(v, float) else str(v), c.id, c.name)


CALC_OPS = ("+", "-", "*")


def calculator_demonstrations(n: int, seed: int = 0, exclude=(), **env_kwargs) -> list[dict]:
    """`n` solved calculator episodes in the rollout schema, for the demo's SFT warm-up: each is
    a two-operand task (operands 10-99, + - *, as data/agents/calculator.jsonl; none whose prompt
    is in `exclude`) played through the real environment (`CalculatorEnv(**env_kwargs)`): one `calculate` call of the
    task's own expression, its observation, then `Answer: <the observation>`, judged by
    `env.finish`. The warm-up learns the call format and the copying; the numbers come from
    the tool."""
    import random

    rng, env, rows, seen = random.Random(seed), CalculatorEnv(**env_kwargs), [], set(exclude)
    while len(rows) < n:
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice(CALC_OPS)
        prompt = f"What is {a} {op} {b}?"
        if prompt in seen:
            continue
        seen.add(prompt)
        task = {"id": f"calc-demo-{len(rows):04d}", "prompt": prompt,
                "answer": str(evaluate(f"{a} {op} {b}"))}
        msgs = env.reset(task)
        call = ToolCall("calculate", {"expression": f"{a} {op} {b}"}, "call_0")
        (obs,), _, _ = env.step([call])
        answer = f"Answer: {obs.content}"
        verdict = env.finish(answer)
        msgs += [{"role": "assistant", "content": "", "tool_calls": [call.to_message()]},
                 obs.to_message(), {"role": "assistant", "content": answer}]
        rows.append({"id": task["id"], "task": task, "messages": msgs,
                     "verifier": {"name": "agents.calculator", "passed": verdict.passed,
                                  "evidence": verdict.evidence}})
    return rows
