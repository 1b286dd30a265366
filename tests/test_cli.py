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
