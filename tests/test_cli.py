"""The shared command-line front: one sentence for every config mistake, never a traceback."""

import ast
import importlib
import os
import re
import subprocess
import sys

import pytest

from rossjax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CFG = "configs/ross_sft.py"


@pytest.mark.parametrize("argv, expected", [
    ([f"--config={CFG}:bogus"], "variant 'bogus' is not one of"),
    (["--config=configs/does_not_exist.py"], "could not be loaded"),
    ([f"--config={CFG}", "--config.train.bogus=1"], "--config.train.bogus: the config has no field"),
    ([f"--config={CFG}", "--config.train.epochs=abc"], "--config.train.epochs"),
])
def test_config_mistakes_are_one_sentence(argv, expected):
    with pytest.raises(cli.UsageError) as e:
        cli.parse_config(argv)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_overrides_come_from_the_given_argv_not_sys_argv(monkeypatch):
    monkeypatch.setattr("sys.argv", ["pytest"])
    cfg, fv, rest = cli.parse_config([f"--config={CFG}:runlocal", "--config.train.num_steps=7",
                                      "--workdir=w", "extra"])
    assert cfg.train.num_steps == 7 and fv.workdir == "w" and rest == ["extra"]


def test_command_config_requires_config_workdir_and_no_stray_arguments():
    with pytest.raises(cli.UsageError, match="needs --config"):
        cli.command_config([], "train", CFG)
    with pytest.raises(cli.UsageError, match="unexpected arguments"):
        cli.command_config([f"--config={CFG}", "--workdir=w", "stray"], "train", CFG)
    with pytest.raises(cli.UsageError, match="--workdir"):
        cli.command_config([f"--config={CFG}"], "train", CFG)
    cfg, workdir, _ = cli.command_config([f"--config={CFG}", "--workdir=w"], "train", CFG)
    assert workdir == "w"


def test_main_prints_one_line_and_exits_2(capsys):
    assert cli.main(["train", f"--config={CFG}", "--config.nope=1", "--workdir=w"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rossjax train: --config.nope") and "\n" not in err
    assert cli.main(["no-such-command"]) == 2


def _fake_command(monkeypatch, exc):
    """A command `rossjax boom` whose main raises `exc`."""
    import sys
    import types

    mod = types.ModuleType("rossjax.cli._boom")

    def main(argv):
        raise exc

    mod.main = main
    monkeypatch.setitem(sys.modules, "rossjax.cli._boom", mod)
    monkeypatch.setitem(cli.COMMANDS, "boom", "_boom")


@pytest.mark.parametrize("exc, expected", [
    (cli.UsageError("--config.x: no such field."), "rossjax boom: --config.x: no such field."),
    (FileNotFoundError(2, "No such file or directory", "in.jsonl"),
     "rossjax boom: in.jsonl: No such file or directory"),
    (cli.InputError("in.jsonl row 3: field 'id' is missing."),
     "rossjax boom: in.jsonl row 3: field 'id' is missing."),
    (IsADirectoryError(21, "Is a directory", "out"), "rossjax boom: out: Is a directory"),
])
def test_user_errors_are_one_line_exit_2(monkeypatch, capsys, exc, expected):
    _fake_command(monkeypatch, exc)
    assert cli.main(["boom", "--x"]) == 2
    assert capsys.readouterr().err.strip() == expected


# A plain ValueError is a bug in rossjax (user-input checks raise InputError, a ValueError
# subclass), so it propagates: Python prints its traceback and exits 1.
@pytest.mark.parametrize("exc", [RuntimeError("a bug"), KeyError("k"), TypeError("t"),
                                 ValueError("a bug"), OSError(28, "No space left on device")])
def test_other_errors_keep_their_traceback(monkeypatch, exc):
    _fake_command(monkeypatch, exc)
    with pytest.raises(type(exc)):
        cli.main(["boom", "--x"])


def test_bench_with_an_unknown_name_is_a_usage_line(capsys):
    assert cli.main(["bench", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rossjax bench: usage: rossjax bench {model|") and "\n" not in err


# command -> a line its --help must print (a config field with its default, or a flag).
HELP_SHOWS = {
    "curate": "--config.mask_mode='annotated'", "inspect": "--template TEMPLATE",
    "select": "--config.input=", "mix": "--config.output=''", "retrogen": "--config.input=",
    "review": "--config.workdir=''", "train": "--config.model.path=''",
    "export": "--dtype=", "extract": "--config.output=''", "probe-sweep": "--config.output=''",
    "grpo": "--config.model.path=", "distill": "--config.distill.loss='reverse_kl_sampled'",
    "eval-generator": "--config.workdir=''",
    "label-corpus": "--config.pool=''", "aux-set": "--config.run_labels=''",
    "bench": "benchmarks:", "demo": "--steps=30", "repro": "--quick",
    "serve": "--max_len=2048", "generate": "--max_new_tokens=256",
    "reconstruct": "--config.max_tool_steps=30", "plan": "--topology=None",
    "retrogen-loop": "--config.loop.rounds=2",
    "swe-repos": "--candidates", "swe-pool": "--config.episodes_per_repo=16",
    "swe-eval": "--config.bugs_per_repo=16",
}
BENCHES = ("model", "sft", "sample", "curate", "select", "grpo", "distill")


def _rossjax(*argv, cwd=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "rossjax.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_every_command_is_in_the_help_table():
    assert set(HELP_SHOWS) == set(cli.COMMANDS)


@pytest.mark.parametrize("argv", [[c, "--help"] for c in HELP_SHOWS]
                         + [["bench", b, "--help"] for b in BENCHES])
def test_help_prints_usage_config_docstring_and_fields(argv, tmp_path):
    """The real CLI in a subprocess, from a folder that is not the checkout."""
    r = _rossjax(*argv, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "Unknown command line flag" not in out + r.stderr
    if argv[0] == "bench" and len(argv) == 3:
        mod = importlib.import_module(f"rossjax.bench.{argv[1]}")
        assert mod.__doc__.strip().splitlines()[0] in out
        assert f"usage: rossjax bench {argv[1]}" in out and "(default: " in out
        return
    assert HELP_SHOWS[argv[0]] in out, out[-3000:]
    mod = importlib.import_module(f"rossjax.cli.{cli.COMMANDS[argv[0]]}")
    assert mod.__doc__.strip().splitlines()[0].split(":")[0] in out  # the usage line
    if "--config." in HELP_SHOWS[argv[0]]:  # the config file's docstring and its fields
        assert "fields (override with --config.FIELD=VALUE)" in out
        config = re.search(r"^config (\S+):", out, flags=re.M).group(1)
        first = ast.get_docstring(ast.parse(open(config).read())).splitlines()[0]
        assert first in out
    assert list(tmp_path.iterdir()) == []  # --help writes nothing


@pytest.mark.parametrize("command", [c for c in cli.COMMANDS if c not in cli.RUN_WITHOUT_ARGUMENTS])
def test_a_command_without_arguments_prints_usage_and_exits_2(command, capsys, tmp_path,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert cli.main([command]) == 2
    err = capsys.readouterr().err
    assert f"rossjax {command}" in err and f"`rossjax {command} --help`" in err
    assert list(tmp_path.iterdir()) == []


def test_curate_writes_under_workdir_and_needs_one(tmp_path):
    sample = os.path.join(ROOT, "data", "rollouts", "sample.jsonl")
    r = _rossjax("curate", f"--config.input={sample}", "--config.verify=stored", cwd=tmp_path)
    assert r.returncode == 2 and "config.output is empty" in r.stderr
    r = _rossjax("curate", f"--config.input={sample}", "--config.verify=stored",
                 f"--workdir={tmp_path / 'w'}", "--config.progress=False", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "w" / "report.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]


def test_default_configs_ship_with_the_package():
    """repo_config finds configs through importlib.resources (rossjax/configs, copied into the
    wheel) and returns the real file, so a config's paths to data/ resolve from the checkout."""
    import importlib.resources
    import os

    shipped = importlib.resources.files("rossjax") / "configs" / "curate.py"
    assert shipped.is_file()
    path = cli.repo_config("curate.py")
    assert os.path.isabs(path) and path == os.path.realpath(str(shipped))
    assert os.path.samefile(path, os.path.join(os.path.dirname(__file__), "..", "configs",
                                               "curate.py"))
    cfg, _, _ = cli.parse_config([], default_config=path)
    assert os.path.isfile(cfg.input)  # the shipped sample, found from the config's own file


# Every shipped config with the variants it accepts (configs/common.py parses them).
CONFIG_VARIANTS = {
    "aux_set": (), "curate": (), "extract": (), "label_corpus": (), "probe_sweep": (),
    "review": (), "eval_generator": ("runlocal", "mixed_outcome"), "grpo_verifier": ("runlocal", "continued"),
    "distill_onpolicy": ("runlocal", "continued"), "grpo_agentic": ("runlocal",),
    "propel_azr": ("runlocal",), "propel_math": ("runlocal",), "propel_sil": ("runlocal", "math"),
    "propel_swe": ("runlocal", "sil", "label", "repos", "pool", "eval"),
    "mixture": ("by_recipe",),
    "retrogen": ("runlocal", "artifact_only"), "select_routes": ("runlocal",),
    "reconstruct": ("runlocal",), "retrogen_sft": ("runlocal",),
    "ross_sft": ("ross_no_mask", "positive_sft", "agentic", "token_budget", "runlocal"),
}

NO_JAX = r"""
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "flax", "optax", "orbax"):
            raise ImportError(f"blocked import of {name}")

sys.meta_path.insert(0, Block())
from rossjax.cli import parse_config
for arg in sys.argv[1:]:
    parse_config([f"--config={arg}"])
print("loaded", len(sys.argv) - 1)
"""


def test_every_shipped_config_loads_without_jax():
    """Loading a config (defaults from rossjax/defaults.py, helpers from configs/common.py) loads
    no trainer: each config and each of its variants parses with jax unimportable."""
    shipped = {os.path.basename(p)[:-3] for p in os.listdir(os.path.join(ROOT, "configs"))
               if p.endswith(".py")} - {"common"}
    assert shipped == set(CONFIG_VARIANTS)
    args = [f"configs/{n}.py" for n in CONFIG_VARIANTS]
    args += [f"configs/{n}.py:{v}" for n, vs in CONFIG_VARIANTS.items() for v in vs]
    args.append("configs/ross_sft.py:positive_sft,token_budget,runlocal")
    r = subprocess.run([sys.executable, "-c", NO_JAX, *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"loaded {len(args)}" in r.stdout


@pytest.mark.parametrize("name", [n for n, vs in CONFIG_VARIANTS.items() if vs])
def test_an_unknown_variant_is_one_sentence_naming_the_config(name):
    with pytest.raises(cli.UsageError) as e:
        cli.parse_config([f"--config=configs/{name}.py:{CONFIG_VARIANTS[name][0]},bogus"])
    msg = str(e.value)
    assert f"configs/{name}.py: variant 'bogus' is not one of" in msg and "\n" not in msg
    assert all(v in msg for v in CONFIG_VARIANTS[name])


def test_configs_import_each_other_as_rossjax_configs():
    """configs/ is rossjax/configs (a link here, a copy in the wheel): a config derives from
    another by a plain import, and propel_math is propel_azr but for its task, gate and KL."""
    from rossjax.configs import common, propel_azr, propel_math

    assert os.path.samefile(common.ROOT, ROOT)
    azr, math = propel_azr.get_config().to_dict(), propel_math.get_config().to_dict()
    assert azr["grpo"].pop("beta") == 0.05 and math["grpo"].pop("beta") == 0.1
    for c in (azr, math):
        c.pop("run_name"), c["data"].pop("tasks"), c["reward"]["probe"].pop("validity")
    # math's generator context (its two in-context problems) is a section of its own
    assert math["data"].pop("math") == {"context": "paper", "examples": "", "n_examples": 2}
    assert "math" not in azr["data"]
    assert azr == math


def test_the_recipe_table_is_generated_for_help_and_matches_the_readme(capsys):
    """One recipe table: rossjax/defaults.py's RECIPES, printed by `train|curate --help` and
    carried verbatim by README.md; the trainer's check reads the same dict."""
    from rossjax.defaults import RECIPES, recipe_table
    from rossjax.train.sft import step as sft

    table = recipe_table()
    assert sft.RECIPES is RECIPES and set(RECIPES) == {"ross", "ross_no_mask", "positive_sft", "sft"}
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert table.replace("\n", "\n  ") in readme, "README's recipe table is not recipe_table()"
    for name, r in RECIPES.items():
        assert f"| `{name}` | `--config.rows={r['rows']} --config.mask_mode={r['mask_mode']}" in table
    for command in ("train", "curate"):
        assert cli.main([command, "--help"]) == 0
        assert table in capsys.readouterr().out
    assert cli.main(["select", "--help"]) == 0 and table not in capsys.readouterr().out
