"""Verifiers, their sandbox, GRPO's CPU rewards, and the one CPU worker pool that runs them.

`get(name)(record) -> Verdict(passed, evidence)`. Names: "math" (math-verify), "code" (sandboxed
unit tests or stdin/stdout cases), "induction" (Absolute-Zero-style function induction, plus
`task_valid`), "gym:<dataset>" (reasoning-gym's score_answer), "swe" (a bug patch against a
repository's pytest suite, swe.py); `register(name)` adds more. Where
each one finds the answer in a record is documented in answers.py. `verify_many(records,
workers)` runs them over CPU worker processes (pool.WorkerPool, also used for GRPO's rewards in
rewards.py). Never imports jax; verifier modules are imported on first use, so importing this
package stays cheap.
"""

from rossjax.verify.base import get, names, register, verifier_name, verify_one
from rossjax.verify.pool import WorkerPool, verify_many, verify_records
from rossjax.verify.verdict import Verdict, Verifier

__all__ = ["Verdict", "Verifier", "WorkerPool", "get", "names", "register", "verifier_name",
           "verify_many", "verify_one", "verify_records"]
