"""The errors a user can fix: bad input, a bad command line, a bad config.

The CLI prints an `InputError` as one sentence and exits 2; any other exception is a bug in
rossjax (or the environment) and keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Input that cannot be used: the message is one sentence naming the file, row and field."""


class UsageError(InputError):
    """A command line or config that cannot run."""


class ConfigError(InputError):
    """A config field whose value cannot work (names the field)."""
