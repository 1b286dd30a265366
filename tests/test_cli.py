"""The shared command-line front: one sentence for every config mistake, never a traceback."""

import pytest

from rossjax import cli

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
])
def test_user_errors_are_one_line_exit_2(monkeypatch, capsys, exc, expected):
    _fake_command(monkeypatch, exc)
    assert cli.main(["boom"]) == 2
    assert capsys.readouterr().err.strip() == expected


@pytest.mark.parametrize("exc", [RuntimeError("a bug"), KeyError("k"), TypeError("t")])
def test_other_errors_keep_their_traceback(monkeypatch, exc):
    _fake_command(monkeypatch, exc)
    with pytest.raises(type(exc)):
        cli.main(["boom"])


def test_bench_without_a_name_is_a_usage_line(capsys):
    assert cli.main(["bench"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rossjax bench: usage: rossjax bench {model|") and "\n" not in err


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
