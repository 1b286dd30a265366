"""`rossjax <command> --config=configs/<recipe>.py --config.x=y [--workdir=DIR] [args]`.

One file per command in this package: each parses its flags (flags.py) and calls the library's
`run(cfg, workdir)`. Commands are imported lazily so `rossjax curate` never imports jax, and no
library module imports this package.
"""

from __future__ import annotations

import importlib
import sys

from rossjax.cli.flags import command_config, parse_config, repo_config  # noqa: F401
from rossjax.errors import InputError, UsageError  # noqa: F401

# command -> module in rossjax.cli; each module has main(argv) taking the argv after the name.
COMMANDS = {
    "demo": "demo",
    "curate": "curate",
    "inspect": "inspect",
    "select": "select",
    "mix": "mix",
    "retrogen": "retrogen",
    "review": "review",
    "train": "train",
    "export": "export",
    "extract": "extract",
    "probe-sweep": "probe_sweep",
    "grpo": "grpo",
    "eval-generator": "eval_generator",
    "bench": "bench",
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        print("\ncommands: " + ", ".join(sorted(COMMANDS)))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"rossjax: unknown command {name!r}; commands: {', '.join(sorted(COMMANDS))}",
              file=sys.stderr)
        return 2
    mod = importlib.import_module(f"rossjax.cli.{COMMANDS[name]}")
    try:
        return int(mod.main(rest) or 0)
    except (InputError, ValueError, FileNotFoundError) as e:
        # Bad input is reported as one sentence naming the file and field, not a stack trace.
        # (ValueError is caught until every input error is an InputError; see rossjax.errors.)
        print(f"rossjax {name}: {e}", file=sys.stderr)
        return 2
