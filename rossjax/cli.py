"""`rossjax <command> --config=configs/<recipe>.py --config.x=y [--workdir=DIR] [args]`.

One config system: an ml-collections `get_config()` file plus `--config.x=y` overrides, parsed
here once for every command. Commands are resolved lazily so `rossjax curate` never imports jax.
"""

from __future__ import annotations

import importlib
import sys

# command -> "module:function"; each function takes the argv after the command name.
COMMANDS = {
    "demo": "rossjax.demo:main",
    "curate": "rossjax.curate.pipeline:main",
    "inspect": "rossjax.curate.view:main",
    "select": "rossjax.curate.select_cli:main",
    "mix": "rossjax.curate.mixture:main",
    "retrogen": "rossjax.curate.retrogen:main",
    "review": "rossjax.review.run:main",
    "train": "rossjax.train.sft:main",
    "export": "rossjax.train.export:main",
    "extract": "rossjax.probes.activations:main",
    "probe-sweep": "rossjax.probes.sweep:main",
    "grpo": "rossjax.train.grpo:main",
    "eval-generator": "rossjax.train.eval_generator:main",
    "bench": "rossjax.bench:main",
}


class UsageError(ValueError):
    """A command line or config that cannot run; the message is one sentence for the user."""


def parse_config(argv, *, default_config: str | None = None, extra_flags=None):
    """Parse `--config=FILE --config.a.b=v --workdir=DIR` (plus `extra_flags`) from argv.

    Returns (config, flags, positional_args). `extra_flags` is a callable(flag_values) that
    defines command-specific absl flags. An unknown `--config.x` names the field in the error.
    """
    from absl import flags
    from ml_collections import config_flags

    fv = flags.FlagValues()
    argv = ["rossjax"] + list(argv)
    # sys_argv: the `--config.x=y` override flags are discovered from this list, not sys.argv,
    # so commands called from code (tests, the demo) parse their own argv.
    config_flags.DEFINE_config_file("config", default_config, "ml-collections config file.",
                                    flag_values=fv, lock_config=True, sys_argv=argv)
    flags.DEFINE_string("workdir", None, "Directory for outputs, checkpoints and metrics.",
                        flag_values=fv)
    if extra_flags is not None:
        extra_flags(fv)
    try:
        rest = fv(argv)[1:]
    except flags.Error as e:
        raise UsageError(_flag_error(str(e))) from None
    except (AttributeError, KeyError) as e:  # an override of a field the config does not have
        bad = [a.split("=")[0] for a in argv if a.startswith("--config.")]
        field = str(e).strip("'\"")
        flag = next((b for b in bad if b.split(".")[-1] == field), f"--config.{field}")
        raise UsageError(f"{flag}: the config has no field {field!r} "
                         f"(see the config file's get_config() for the fields it defines)") from None
    cfg = fv.config if fv["config"].present or default_config else None
    if cfg is not None and type(cfg).__name__ == "_ErrorConfig":  # ml-collections defers the error
        path = str(fv["config"].config_filename if hasattr(fv["config"], "config_filename")
                   else default_config)
        raise UsageError(f"--config={path}: the config file could not be loaded (does it exist?).")
    return cfg, fv, rest


def _flag_error(msg: str) -> str:
    """One sentence from absl's message; a config file that failed to load carries its traceback,
    whose last line is the config's own error."""
    lines = [ln for ln in msg.splitlines() if ln.strip()]
    if len(lines) > 1 and "Traceback" in msg:
        where = lines[0].split(": Error whilst")[0].removeprefix("flag ")
        return f"{where}: {lines[-1].split(': ', 1)[-1].strip()}"
    return lines[0] if lines else msg


def command_config(argv, command: str, example: str, *, default_config: str | None = None,
                   needs_workdir: bool = True, extra_flags=None):
    """The start of every config-driven command: parse, insist on a config, refuse stray
    arguments, resolve the workdir (--workdir, else config.workdir). Returns (cfg, workdir, flags)."""
    cfg, fv, rest = parse_config(argv, default_config=default_config, extra_flags=extra_flags)
    if cfg is None:
        raise UsageError(f"rossjax {command} needs --config={example}.")
    if rest:
        raise UsageError(f"unexpected arguments {' '.join(rest)!r}; options go in --config.x=y.")
    workdir = fv.workdir or cfg.get("workdir", "") or ""
    if needs_workdir and not workdir:
        raise UsageError("no output directory: pass --workdir=DIR.")
    return cfg, workdir, fv


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
    module, func = COMMANDS[name].split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("rossjax"):
            print(f"rossjax: command {name!r} is not available in this build ({e.name} missing)",
                  file=sys.stderr)
            return 2
        raise
    try:
        return int(getattr(mod, func)(rest) or 0)
    except (ValueError, FileNotFoundError) as e:
        # Bad input is reported as one sentence naming the file and field, not a stack trace.
        print(f"rossjax {name}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
