"""`code` verifier: run the rollout's program in the sandbox against the task's tests.

The program is the last ```python block of the last assistant message (answers.py). The task
carries one of two test styles:
  - HumanEval: `task.tests` (source defining `check(candidate)`), `task.entry_point`, and an
    optional `task.code_prefix` (e.g. the HumanEval prompt with imports and signature; when absent,
    `task.prompt` is used if it is code containing `def <entry_point>(`). The program
    is `code_prefix + program` — joined directly when the program is an indented body
    continuation, on a new line when it is a full definition (which then replaces the stub);
  - stdin/stdout: `task.cases = [{"input": str, "output": str}, ...]`; each case is a separate
    sandboxed run, and outputs compare line by line with trailing whitespace ignored.
Optional `task.timeout_s` (default 10) bounds each run.
"""

from __future__ import annotations

from rossjax.verify import sandbox
from rossjax.verify.answers import extract_code, last_assistant_content
from rossjax.verify.verdict import Verdict


def _norm(out: str) -> list[str]:
    lines = [ln.rstrip() for ln in out.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def program_of(record: dict) -> str | None:
    content = last_assistant_content(record)
    return None if content is None else extract_code(content)


def verify(record: dict) -> Verdict:
    task = record.get("task") or {}
    code = program_of(record)
    if code is None:
        return Verdict(False, "no ```python block in the last assistant message")
    timeout = float(task.get("timeout_s") or 10.0)
    if task.get("tests") and task.get("entry_point"):
        prefix = task.get("code_prefix")
        if prefix is None:
            prompt = task.get("prompt") or ""
            prefix = prompt if f"def {task['entry_point']}(" in prompt else ""
        program = prefix + code if code[:1] in (" ", "\t") else f"{prefix}\n{code}"
        return sandbox.run_tests(program, task["tests"], task["entry_point"], timeout_s=timeout)
    cases = task.get("cases")
    if not cases:
        return Verdict(None, "task has neither tests+entry_point nor stdin/stdout cases")
    for i, case in enumerate(cases):
        res = sandbox.run(code, stdin=str(case.get("input", "")), timeout_s=timeout)
        if not res.ok:
            return Verdict(False, f"case {i}: {res.reason}")
        if _norm(res.stdout) != _norm(str(case.get("output", ""))):
            got = res.stdout.strip().splitlines()[:1]
            return Verdict(False, f"case {i}: wrong output (first line {got[0][:60]!r} )"
                           if got else f"case {i}: no output")
    return Verdict(True, f"{len(cases)}/{len(cases)} stdin/stdout cases passed")
