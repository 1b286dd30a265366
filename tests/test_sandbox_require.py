"""config.sandbox.require: every command that runs model-written code can refuse a machine whose
kernel does not enforce the wall it asks for (issue 36, item 2)."""

import os

import pytest

from rossjax.cli.flags import parse_config
from rossjax.errors import UsageError
from rossjax.verify import sandbox

CODE_RUNNING = ["curate", "grpo_verifier", "grpo_agentic", "label_corpus", "propel_azr",
                "propel_math", "propel_sil", "propel_swe", "eval_generator"]


@pytest.mark.parametrize("name", CODE_RUNNING)
def test_every_config_that_runs_code_has_the_section(name):
    cfg, _, _ = parse_config([f"--config=configs/{name}.py"])
    assert cfg.sandbox.require == ""


def test_require_reaches_the_sandbox_and_a_bad_value_is_one_sentence(monkeypatch):
    # setenv first: delenv of an absent key records nothing, and parse_config's value would stay
    # in this worker's environment for every later test (it did: namespaces refused elsewhere).
    monkeypatch.setenv("ROSSJAX_SANDBOX_REQUIRE", "")
    monkeypatch.delenv("ROSSJAX_SANDBOX_REQUIRE")
    parse_config(["--config=configs/curate.py"])
    assert "ROSSJAX_SANDBOX_REQUIRE" not in os.environ and sandbox.Limits().require is None
    parse_config(["--config=configs/curate.py", "--config.sandbox.require=namespaces"])
    assert sandbox.Limits().require == "namespaces"
    with pytest.raises(UsageError, match="sandbox.require='kernel'"):
        parse_config(["--config=configs/curate.py", "--config.sandbox.require=kernel"])


def test_a_required_mode_the_limits_switch_off_refuses_to_run(monkeypatch):
    monkeypatch.setenv("ROSSJAX_SANDBOX_REQUIRE", "landlock")
    with pytest.raises(sandbox.SandboxUnavailable):
        sandbox.run("print(1)", limits=sandbox.Limits(landlock=False, namespaces=False))


def test_curate_report_names_the_sandbox_mode_its_verdicts_came_from(tmp_path):
    """issue 36 item 2: the mode is in report.json (hook-only is the one a reader must notice)."""
    import json

    from rossjax.curate.pipeline import curate

    cfg, _, _ = parse_config(["--config=configs/curate.py", "--config.tokenizer=ascii",
                              "--config.input=data/rollouts/sample.jsonl", "--config.progress=False",
                              f"--config.output={tmp_path / 'out'}"])
    curate(cfg)
    with open(tmp_path / "out" / "report.json") as f:
        verify = json.load(f)["verify"]
    assert verify["sandbox"] == sandbox.isolation() and "rlimits" in verify["sandbox"]
    cfg.verify, cfg.output = "stored", str(tmp_path / "stored")
    curate(cfg)
    with open(tmp_path / "stored" / "report.json") as f:
        assert json.load(f)["verify"]["sandbox"] is None  # no program ran
