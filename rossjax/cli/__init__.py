"""`rossjax <command> --config=configs/<recipe>.py --config.x=y [--workdir=DIR] [args]`.

One file per command in this package: each parses its flags (flags.py) and calls the library's
`run(cfg, workdir)`. Commands are imported lazily so `rossjax curate` never imports jax, and no
library module imports this package.

`rossjax <command> --help` prints the command's usage, its config file's docstring and every
field with its default, exit 0. A command given no arguments at all prints its usage on stderr
and exits 2 (nothing is written anywhere); only `rossjax demo` runs with no arguments. Outputs go
under --workdir (a command's --config.output, where it has one, may name the folder instead).
"""

from __future__ import annotations

import importlib
import sys

from rossjax.cli.flags import (  # noqa: F401
    HELP_FLAGS,
    HelpRequested,
    command_config,
    parse_config,
    repo_config,
)
from rossjax.errors import InputError, UsageError  # noqa: F401

# command -> module in rossjax.cli; each module has main(argv) taking the argv after the name.
COMMANDS = {
    "demo": "demo",
    "curate": "curate",
    "inspect": "inspect",
    "select": "select",
    "mix": "mix",
    "retrogen": "retrogen",
    "reconstruct": "reconstruct",
    "retrogen-loop": "retrogen_loop",
    "review": "review",
    "train": "train",
    "export": "export",
    "generate": "generate",
    "extract": "extract",
    "probe-sweep": "probe_sweep",
    "label-corpus": "label_corpus",
    "swe-repos": "swe_repos",
    "swe-pool": "swe_pool",
    "swe-eval": "swe_eval",
    "aux-set": "aux_set",
    "grpo": "grpo",
    "distill": "distill",
    "eval-generator": "eval_generator",
    "bench": "bench",
    "repro": "repro",
    "serve": "serve",
    "plan": "plan",
}


# Errors the user can fix are printed as one sentence and exit 2: an InputError (bad input,
# command line or config; see rossjax.errors) or a path the user named that cannot be opened.
# Anything else (a plain ValueError included) is a bug in rossjax or the environment and keeps
# its traceback.
USER_ERRORS = (InputError, FileNotFoundError, PermissionError, IsADirectoryError,
               NotADirectoryError)

# Commands that do something useful with no arguments; any other prints its usage instead of
# running on a default input into a default folder.
RUN_WITHOUT_ARGUMENTS = ("demo",)

# Commands whose --help ends with the SFT recipe table (rossjax/defaults.py, no jax).
RECIPE_HELP = ("train", "curate")


def recipe_help() -> str:
    from rossjax.defaults import recipe_table

    return ("SFT recipes (config.recipe of `rossjax train`; curate a training dir with the "
            "recipe's flags, the trainer checks its report.json):\n\n" + recipe_table())


def _one_sentence(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    return str(e) or type(e).__name__


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
    usage = (mod.__doc__ or f"rossjax {name}").strip()
    if not rest and name not in RUN_WITHOUT_ARGUMENTS:
        print(f"{usage}\n\n(`rossjax {name} --help` lists the config's fields and defaults)",
              file=sys.stderr)
        return 2
    try:
        return int(mod.main(rest) or 0)
    except HelpRequested as h:
        print(f"{usage}\n\n{h.text}" + (f"\n\n{recipe_help()}" if name in RECIPE_HELP else ""))
        return 0
    except USER_ERRORS as e:
        print(f"rossjax {name}: {_one_sentence(e)}", file=sys.stderr)
        return 2
