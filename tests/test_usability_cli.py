"""Issue 29: the commands rossjax prints run as printed, from any working directory."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

from rossjax.resources import config_path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(REPO, "data", "rollouts", "sample.jsonl")


def _rossjax(args, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "rossjax.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_shipped_config_resolves_by_name_outside_a_checkout(tmp_path):
    out = tmp_path / "curated"
    r = _rossjax(["curate", "--config=configs/curate.py", f"--config.input={SAMPLE}",
                  f"--config.output={out}"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"using the shipped {config_path('curate.py')}" in r.stderr
    assert (out / "report.json").is_file()


def test_missing_config_without_a_shipped_namesake_is_one_sentence(tmp_path):
    r = _rossjax(["curate", "--config=configs/nope.py"], cwd=tmp_path)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "configs/nope.py" in r.stderr


def test_grpo_relearn_command_runs_as_printed(tmp_path, monkeypatch, capsys):
    """The relearn hint names its output folder; run as printed (in another cwd) it curates."""
    from rossjax.cli import grpo as grpo_cli
    from rossjax.train.rl import grpo

    workdir = tmp_path / "run"
    monkeypatch.setattr(grpo, "run", lambda cfg, wd: dict(
        metrics={"reward_mean": 0.5}, history=SAMPLE, tokenizer="qwen", step=1))
    assert grpo_cli.main(["--config=configs/grpo_verifier.py", f"--workdir={workdir}"]) == 0
    line = capsys.readouterr().out
    cmd = re.search(r"relearn: (rossjax curate [^)]*)\)", line).group(1)
    assert f"--config.output={workdir / 'relearn'}" in cmd
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    r = _rossjax(shlex.split(cmd)[1:], cwd=cwd)
    assert r.returncode == 0, r.stderr
    report = json.loads((workdir / "relearn" / "report.json").read_text())
    assert report["config"]["mask_mode"] == "eligible"


def test_config_field_typo_is_one_sentence_with_the_suggestion(capsys):
    """Issue 29 part 8: with and without --config= (a default config applies overrides while
    it is defined), nested fields keep their section, no escaped quotes or newlines."""
    from rossjax import cli

    cases = [(["curate", "--config.ouput=x"],
              "rossjax curate: --config.ouput: the config has no field 'ouput'; "
              "did you mean --config.output?"),
             (["train", "--config=configs/ross_sft.py", "--config.data.seq_lenn=4", "--workdir=w"],
              "rossjax train: --config.data.seq_lenn: the config has no field 'seq_lenn'; "
              "did you mean --config.data.seq_len?"),
             (["train", "--config=configs/ross_sft.py", "--config.zzzqq=4", "--workdir=w"],
              "rossjax train: --config.zzzqq: the config has no field 'zzzqq' "
              "(`--help` lists the fields)")]
    for argv, want in cases:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == want
        assert "Traceback" not in "\n".join(err) and "\\" not in err[-1]


def test_plain_sft_recipe_curates_and_trains_a_trl_dataset(tmp_path, capsys):
    """Issue 29 part 3: TRL conversational rows with no verdicts or reviews curate and train with
    `--config.recipe=sft` on both commands; every valid row kept, every assistant token
    supervised, nothing verified."""
    from rossjax import cli
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    tok = write_ascii_tokenizer(str(tmp_path / "tok"))
    rows = tmp_path / "trl.jsonl"
    with open(rows, "w") as f:
        for i in range(6):
            f.write(json.dumps({"messages": [
                {"role": "user", "content": f"what is {i} + 1?"},
                {"role": "assistant", "content": f"it is {i + 1}."}]}) + "\n")
    out = tmp_path / "curated"
    assert cli.main(["curate", "--config.recipe=sft", f"--config.input={rows}",
                     f"--config.output={out}", f"--config.tokenizer={tok}",
                     "--config.progress=False"]) == 0
    assert "recipe sft: rows=verifier_positive mask_mode=eligible verify=stored " \
           "unverified=keep" in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["buckets"]["kept"] == 6, report["buckets"]
    assert report["verify"]["rerun"] == 0 and report["verify"]["unverified"] == 6
    assert report["config"]["mask_mode"] == "eligible"
    assert cli.main(["train", f"--config={config_path('ross_sft.py')}:runlocal",
                     "--config.recipe=sft", f"--config.data.train={out}",
                     "--config.train.num_steps=1", "--config.data.seq_len=128",
                     f"--workdir={tmp_path / 'w'}"]) == 0
    # Without the recipe the same rows are withheld (nothing kept: exit 2), and the reason
    # names the one-flag fix.
    capsys.readouterr()
    assert cli.main(["curate", f"--config.input={rows}", f"--config.output={tmp_path / 'c2'}",
                     f"--config.tokenizer={tok}", "--config.progress=False"]) == 2
    withheld = [json.loads(x) for x in open(tmp_path / "c2" / "withheld.jsonl")]
    assert len(withheld) == 6 and "--config.recipe=sft" in json.dumps(withheld[0])


def test_empty_messages_and_unknown_columns_get_their_own_reasons(tmp_path):
    """Issue 29 part 8: not 'id must be a non-empty string' for a row whose id could not be
    derived because it has no turns or no messages column at all."""
    rows = tmp_path / "bad.jsonl"
    rows.write_text('{"messages": []}\n{"question": "q", "answer": "a"}\n')
    out = tmp_path / "out"
    r = _rossjax(["curate", f"--config.input={rows}", f"--config.output={out}",
                  "--config.progress=False"], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    details = [json.loads(x)["detail"] for x in open(out / "invalid.jsonl")]
    assert details == [
        "bad.jsonl row 1: messages is empty (a row needs at least one turn)",
        "bad.jsonl row 2: no messages column (the row has 'answer', 'question'); map the prompt "
        "and completion columns with --config.fields.input_key=COLUMN "
        "--config.fields.label_key=COLUMN"]


def test_probe_heatmap_colour_scale_covers_the_data():
    """Issue 29 part 8: below-chance cells are inside the colour scale, not clipped to it."""
    import numpy as np

    from rossjax.probes.sweep import color_range

    assert color_range(np.array([[0.62, 0.9], [0.7, np.nan]])) == (0.5, 1.0)
    assert color_range(np.array([[0.31, 0.55]])) == (0.31, 1.0)
    assert color_range(np.full((2, 2), np.nan)) == (0.5, 1.0)


def test_runlocal_fits_the_shipped_sample_curated_with_the_ascii_tokenizer(tmp_path):
    """Issue 42 items 4 and 7: `--config.tokenizer=ascii` (the GRPO configs' name) works on
    curate, and every valid row of the shipped sample then fits ross_sft.py:runlocal's model and
    seq_len (it stopped on a too-long row)."""
    from rossjax import cli
    from rossjax.cli.flags import parse_config
    from rossjax.models import PRESETS

    out = tmp_path / "cur"
    assert cli.main(["curate", "--config.tokenizer=ascii", "--config.recipe=sft",
                     f"--config.output={out}", "--config.progress=False"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["buckets"]["kept"] >= 20, report["buckets"]
    cfg, _, _ = parse_config([f"--config={config_path('ross_sft.py')}:runlocal"])
    assert report["kept_lengths"]["max"] <= cfg.data.seq_len, report["kept_lengths"]
    assert report["token_ids"]["max"] < PRESETS[cfg.model.preset].vocab_size


def test_train_overrides_without_config_and_the_recipe_hint_names_train(tmp_path, capsys):
    """Issue 42 item 4: `--config.recipe` without `--config=` overrides the shipped ross_sft.py
    (as on curate), and a dir curated for another recipe says `train --config.recipe=...`."""
    from rossjax import cli

    cur = tmp_path / "cur"
    cur.mkdir()
    (cur / "report.json").write_text(json.dumps(
        {"config": {"recipe": "sft", "rows": "verifier_positive", "mask_mode": "eligible"}}))
    assert cli.main(["train", f"--config.data.train={cur}", f"--workdir={tmp_path / 'w'}"]) == 2
    err = capsys.readouterr().err
    assert "no --config given; using configs/ross_sft.py" in err
    assert "curated for recipe 'sft'" in err and "train it with --config.recipe=sft" in err


def test_review_that_asks_nothing_names_the_setting(tmp_path, capsys):
    """Issue 42 item 4: the shipped sample stores few verdicts, so review's defaults send nothing
    to the reviewer; the run says so and names --config.unverified=keep."""
    from rossjax import cli

    assert cli.main(["review", f"--workdir={tmp_path / 'rev'}", "--config.endpoint.model=m",
                     "--config.endpoint.base_url=http://127.0.0.1:9/v1",
                     "--config.progress=False"]) == 0
    err = capsys.readouterr().err
    assert "no row was sent to the reviewer (0 requests)" in err
    assert "withheld as unverified" in err and "--config.unverified=keep" in err


def test_reconstruct_next_line_on_an_empty_output_says_so(tmp_path, monkeypatch, capsys):
    """Issue 42 item 4: a `next:` command that would read an empty file is not printed."""
    from rossjax import cli
    from rossjax.reconstruct import run as rc_run

    traj = str(tmp_path / "rc" / "trajectories.jsonl")
    report = {"buckets": {"kept": 0, "withheld": 2, "invalid": 0}, "input_rows": 2,
              "resumed": 0, "requests": {"requests": 4, "cache_hits": 0},
              "reasons": {"withheld": {"no_draft": 2}, "invalid": {}},
              "outputs": {"trajectories": traj, "withheld": "withheld.jsonl"},
              "next": f"rossjax retrogen --config.input={traj} --config.output=x"}
    monkeypatch.setattr(rc_run, "run", lambda cfg, out, serve_model=None: report)
    assert cli.main(["reconstruct", f"--workdir={tmp_path / 'rc'}",
                     "--config.endpoint.model=m"]) == 0
    out = capsys.readouterr().out
    assert "rossjax retrogen --config.input" not in out
    assert f"next: nothing yet: {traj} holds no trajectory" in out


def test_step_count_under_the_other_commands_name_suggests_the_right_one(capsys):
    """Issue 42 item 5: train counts steps in train.num_steps, grpo in grpo.steps."""
    from rossjax import cli

    assert cli.main(["grpo", "--config=configs/grpo_verifier.py", "--config.train.num_steps=3",
                     "--workdir=w"]) == 2
    assert "did you mean --config.grpo.steps?" in capsys.readouterr().err
    assert cli.main(["train", "--config=configs/ross_sft.py", "--config.grpo.steps=3",
                     "--workdir=w"]) == 2
    assert "did you mean --config.train.num_steps?" in capsys.readouterr().err


def test_generate_samples_when_more_than_one_answer_is_asked(monkeypatch, tmp_path, capsys):
    """Issue 42 item 5: --num_samples=3 with no --temperature samples at 1.0 (greedy gave three
    identical answers silently); one sample stays greedy; greedy for three says so."""
    import types

    import numpy as np

    from rossjax import cli, sample
    from rossjax.train.export import model as export_model

    seen = []

    def fake_generate(cfg, params, ids, max_new, *, temperature, num_samples, **kw):
        seen.append(temperature)
        n = len(ids) * num_samples
        return types.SimpleNamespace(tokens=np.full((n, 2), 65), lengths=np.full(n, 2),
                                     finish_reason=["length"] * n)

    monkeypatch.setattr(export_model, "load_model_dir", lambda *a: (
        types.SimpleNamespace(vocab_size=256), None, "ascii", "chatml", "a model"))
    monkeypatch.setattr(sample, "generate", fake_generate)
    for extra, want, note in ((["--num_samples=3"], 1.0, "sampling at temperature 1.0"),
                              ([], 0.0, "greedy"),
                              (["--num_samples=3", "--temperature=0"], 0.0,
                               "the 3 samples of a prompt are the same answer")):
        assert cli.main(["generate", f"--model={tmp_path}", "--prompt=hi", *extra]) == 0
        assert seen[-1] == want and note in capsys.readouterr().err


def test_inspect_writes_html_only_where_named_and_lists_whole_words(tmp_path, capsys):
    """Issue 42 item 5: inspect wrote ID.html into the data folder (DIR/inspect); it writes under
    --workdir or --out only. --list cut reasons mid-word."""
    import shutil

    from rossjax import cli
    from rossjax.curate.view import format_list

    rows = tmp_path / "data" / "sample.jsonl"
    rows.parent.mkdir()
    shutil.copy(SAMPLE, rows)
    rid = json.loads(rows.read_text().splitlines()[0])["id"]
    base = ["inspect", str(rows), "--id", rid, "--tokenizer=ascii", "--no-color"]
    assert cli.main(base) == 0
    assert os.listdir(rows.parent) == ["sample.jsonl"]
    assert "--workdir=DIR or --out=FILE.html" in capsys.readouterr().out
    assert cli.main(base + [f"--workdir={tmp_path / 'views'}"]) == 0
    assert os.listdir(tmp_path / "views") and os.listdir(rows.parent) == ["sample.jsonl"]
    detail = ("sample.jsonl row 7: " + "the verifier could not parse the final answer " * 6).strip()
    line = format_list([{"id": "x", "status": "withheld", "row": 7, "reason": "r",
                         "detail": detail}]).splitlines()[0]
    shown = line.split(" (", 1)[1].removesuffix(")").removesuffix(" ...").split()
    assert shown == detail.split()[:len(shown)] and len(shown) < len(detail.split())
