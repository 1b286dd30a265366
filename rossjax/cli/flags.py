"""One config system for every command: an ml-collections `get_config()` file plus
`--config.x=y` overrides, parsed here once."""

from __future__ import annotations

import ast
import os
import re
import sys

from rossjax.errors import UsageError
from rossjax.resources import config_path

HELP_FLAGS = ("-h", "--help", "--helpfull", "-help")


class HelpRequested(Exception):
    """`--help` was given: the dispatcher prints the command's docstring and this text, exit 0."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def parse_config(argv, *, default_config: str | None = None, extra_flags=None,
                 help_config: str | None = None):
    """Parse `--config=FILE --config.a.b=v --workdir=DIR` (plus `extra_flags`) from argv.

    Returns (config, flags, positional_args). `extra_flags` is a callable(flag_values) that
    defines command-specific absl flags. An unknown `--config.x` names the field in the error.
    With `--help` in argv it raises HelpRequested with the config file's docstring, its fields
    and their defaults (the `--config` given, else `help_config`, else `default_config`) and the
    command's flags.
    """
    argv = list(argv)
    if any(a in HELP_FLAGS for a in argv):
        rest = [a for a in argv if a not in HELP_FLAGS]
        given = any(a == "--config" or a.startswith("--config=") for a in rest)
        cfg, fv, _ = _parse(rest, default_config if given else (help_config or default_config),
                            extra_flags)
        raise HelpRequested(help_text(cfg, fv))
    return _parse(argv, default_config, extra_flags)


def _parse(argv, default_config, extra_flags):
    from absl import flags
    from ml_collections import config_flags

    fv = flags.FlagValues()
    argv = ["rossjax"] + [_shipped_config(a) for a in argv]
    try:
        # sys_argv: the `--config.x=y` override flags are discovered from this list, not
        # sys.argv, so commands called from code (tests, the demo) parse their own argv. A
        # default config applies its overrides here already, so a typo can raise here too.
        config_flags.DEFINE_config_file("config", default_config, "ml-collections config file.",
                                        flag_values=fv, lock_config=True, sys_argv=argv)
        flags.DEFINE_string("workdir", None, "Directory for outputs, checkpoints and metrics.",
                            flag_values=fv)
        if extra_flags is not None:
            extra_flags(fv)
        rest = fv(argv)[1:]
    except flags.Error as e:
        raise UsageError(_flag_error(str(e))) from None
    except (AttributeError, KeyError) as e:  # an override of a field the config does not have
        raise UsageError(_unknown_field(e, argv)) from None
    cfg = fv.config if fv["config"].present or default_config else None
    if cfg is not None and type(cfg).__name__ == "_ErrorConfig":  # ml-collections defers the error
        path = str(fv["config"].config_filename if hasattr(fv["config"], "config_filename")
                   else default_config)
        raise UsageError(f"--config={path}: the config file could not be loaded (does it exist?).")
    if cfg is not None and "sandbox" in cfg:
        _require_sandbox(cfg.sandbox.require)
    return cfg, fv, rest


def _require_sandbox(require: str) -> None:
    """config.sandbox.require reaches every sandbox the command starts, in its worker processes
    too, through the environment they inherit (verify/sandbox.Limits reads it there)."""
    if not require:
        return
    if require not in ("landlock", "namespaces"):
        raise UsageError(f"--config.sandbox.require={require!r}: must be '', 'landlock' or "
                         "'namespaces'.")
    os.environ["ROSSJAX_SANDBOX_REQUIRE"] = require


# The step count is train.num_steps in SFT configs and grpo.steps in GRPO configs: the other
# command's name gets the right one suggested.
STEP_FIELDS = {"train.num_steps": "grpo.steps", "grpo.steps": "train.num_steps"}


def _unknown_field(e: Exception, argv) -> str:
    """One sentence for a `--config.x` the config lacks: ml-collections' message carries the
    field quoted and escaped, and its 'Did you mean' suggestion, inside the repr of a repr."""
    text = str(e)
    for _ in range(3):  # unescape the nested reprs
        text = text.replace("\\\\", "\\").replace("\\'", "'").replace("\\n", "\n")
    names = re.findall(r"'(\w+)'", text)
    field = names[0] if names else text.strip("'\"")
    hint = re.search(r'Did you mean "([\w.]+)"', text)
    bad = [a.split("=")[0] for a in argv if a.startswith("--config.")]
    for b in bad:
        path = b.removeprefix("--config.")
        if path in STEP_FIELDS and field in path.split("."):
            return (f"{b}: the config has no field {field!r}; did you mean "
                    f"--config.{STEP_FIELDS[path]}? (train counts steps in train.num_steps, "
                    f"grpo in grpo.steps)")
    flag = next((b for b in bad if b.split(".")[-1] == field), f"--config.{field}")
    where = flag.removeprefix("--config.").rsplit(".", 1)
    fix = (f"; did you mean --config.{where[0] + '.' if len(where) > 1 else ''}{hint.group(1)}?"
           if hint else " (`--help` lists the fields)")
    return f"{flag}: the config has no field {field!r}{fix}"


def _shipped_config(arg: str) -> str:
    """`--config=configs/x.py[:variant]` that does not exist relative to the working directory
    names the shipped config of that file name (printed commands run from any directory)."""
    if not arg.startswith("--config="):
        return arg
    path, sep, variant = arg.removeprefix("--config=").partition(":")
    if not path or os.path.exists(path):
        return arg
    shipped = config_path(os.path.basename(path))
    if not os.path.isfile(shipped):
        return arg
    print(f"rossjax: --config={path} is not in {os.getcwd()}; using the shipped {shipped}.",
          file=sys.stderr)
    return f"--config={shipped}{sep}{variant}"


def _config_path(fv) -> str:
    """The config file a parse loaded, without its `:variant`."""
    return str(fv["config"].config_filename or "").split(":")[0]


def _docstring(source: str) -> str:
    """A file's docstring as written (its `\\` line continuations kept, as a reader copies it)."""
    body = ast.parse(source).body if source else []
    if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        return ""
    raw = ast.get_source_segment(source, body[0].value) or ""
    raw = raw.lstrip("rRuU")
    quote = raw[:3] if raw[:3] in ('"""', "'''") else raw[:1]
    return raw[len(quote):-len(quote)].strip()


def _field_comments(source: str) -> dict[str, str]:
    """`field -> its trailing comment` from a config file's `c.a.b = value  # comment` lines."""
    out = {}
    for m in re.finditer(r"^\s*\w+\.([\w.]+)\s*=[^#\n]*#\s*(.+)$", source, flags=re.M):
        out.setdefault(m.group(1), m.group(2).strip())
    return out


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def help_text(cfg, fv) -> str:
    """The config file's docstring, every field with its default (and the comment beside it in
    the file), then the command's flags."""
    parts = []
    if cfg is not None:
        path = _config_path(fv)
        source = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
        doc = _docstring(source)
        parts.append(f"config {path}:\n\n{doc.strip()}" if doc else f"config {path}")
        notes = _field_comments(source)
        rows = [(f"--config.{k}={v!r}", notes.get(k, "")) for k, v in _flatten(cfg.to_dict())]
        width = min(max(len(r[0]) for r in rows), 48) if rows else 0
        parts.append("fields (override with --config.FIELD=VALUE):\n" + "\n".join(
            f"  {flag:<{width}}  {note}".rstrip() for flag, note in rows))
    names = [n for n in fv if n != "config"]
    parts.append("flags:\n" + "\n".join(
        f"  --{n}={fv[n].default!r}  {fv[n].help}" for n in sorted(names)))
    return "\n\n".join(parts)


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
    arguments, resolve the workdir (--workdir, else config.workdir). Returns (cfg, workdir, flags).
    `example` starts with the shipped config whose fields --help lists ("configs/x.py ...")."""
    shipped = example.split()[0]
    help_config = repo_config(os.path.basename(shipped)) if shipped.startswith("configs/") else None
    given = any(a == "--config" or a.startswith("--config=") for a in argv)
    if (default_config is None and help_config and not given
            and any(a.startswith("--config.") for a in argv)):
        # `--config.x=y` alone overrides the command's shipped config, as curate's do
        print(f"rossjax {command}: no --config given; using {shipped}.", file=sys.stderr)
        default_config = help_config
    cfg, fv, rest = parse_config(argv, default_config=default_config, extra_flags=extra_flags,
                                 help_config=help_config)
    if cfg is None:
        raise UsageError(f"rossjax {command} needs --config={example}.")
    if rest:
        raise UsageError(f"unexpected arguments {' '.join(rest)!r}; options go in --config.x=y.")
    workdir = fv.workdir or cfg.get("workdir", "") or ""
    if needs_workdir and not workdir:
        raise UsageError("no output directory: pass --workdir=DIR.")
    return cfg, workdir, fv


def complete_message(command: str, workdir: str, step: int, last: str, steps_field: str) -> str:
    """What a training command says when its workdir already holds the run's last step."""
    return (f"rossjax {command}: {workdir} is already complete (checkpoint at step {step}, the "
            f"run's last step; last logged {last}); nothing to do. Raise --config.{steps_field} "
            f"or give a new --workdir to train more.")


# The shipped default configs: commands and applications (demo, repro) name them by file name.
repo_config = config_path
