"""The errors a user can fix: bad input, a bad command line, a bad config.

The CLI prints an `InputError` as one sentence and exits 2; any other exception is a bug in
rossjax (or the environment) and keeps its traceback.
"""

from __future__ import annotations

import json


class InputError(ValueError):
    """Input that cannot be used: the message is one sentence naming the file, row and field."""


class UsageError(InputError):
    """A command line or config that cannot run."""


class ConfigError(InputError):
    """A config field whose value cannot work (names the field)."""


class Diverged(InputError):
    """Too many non-finite training steps in a row (SFT or GRPO; one sentence in the CLI)."""


def read_json(path: str, what: str):
    """The JSON file `path` (a `what`, e.g. "probe manifest"); a missing, unreadable or malformed
    one is an InputError naming the file, not a bare traceback."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise InputError(f"{path}: the {what} is missing.") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: the {what} is not valid JSON (line {e.lineno}, column "
                         f"{e.colno}: {e.msg}).") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: the {what} cannot be read ({e}).") from None
