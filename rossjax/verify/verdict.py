"""The outcome of a verifier (kept import-light: the registry, the sandbox and every verifier
import it)."""

from __future__ import annotations

from typing import Callable, NamedTuple


class Verdict(NamedTuple):
    """Outcome of a verifier: passed is True/False, or None when the check itself could not
    decide (unparseable gold answer, missing tests); evidence says why in one line."""

    passed: bool | None
    evidence: str


Verifier = Callable[[dict], Verdict]
