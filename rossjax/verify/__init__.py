"""Verifiers: `get(name)(record) -> Verdict(passed, evidence)`.

Names: "math" (math-verify), "code" (sandboxed unit tests or stdin/stdout cases), "induction"
(Absolute-Zero-style function induction, plus `task_valid`), "gym:<dataset>" (reasoning-gym's
score_answer); `register(name)` adds more. Where each one finds the answer in a record is
documented in answers.py. `verify_many(records, workers)` runs them over CPU worker processes.
Modules are imported on first use, so importing this package stays cheap.
"""

from rossjax.curate.verifiers.base import Verdict, Verifier, get, names, register
from rossjax.curate.verifiers.pool import VerifierPool, verifier_name, verify_many, verify_one

__all__ = ["Verdict", "Verifier", "VerifierPool", "get", "names", "register", "verifier_name",
           "verify_many", "verify_one"]
