"""`rossjax curate`: accounting adds up, shards read back, verify modes, CLI."""

import json
import os
import sys

import numpy as np
import pytest

from rossjax.cli import main as cli_main, parse_config
from rossjax.curate.compiled import decode_example, encode_example, read_compiled
from rossjax.curate.pipeline import curate
from rossjax.verify import sandbox

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "curate.py")
SAMPLE = os.path.join(REPO, "data", "rollouts", "sample.jsonl")


def _with_argv(argv, fn):
    # ml-collections reads --config overrides from sys.argv at definition time (cli.parse_config
    # does not pass `sys_argv=` yet), so tests must show it the same argv a shell would.
    saved, sys.argv = sys.argv, ["rossjax", *argv]
    try:
        return fn()
    finally:
        sys.argv = saved


def _cfg(**over):
    argv = [f"--config={CONFIG}"] + [f"--config.{k}={v}" for k, v in over.items()]
    return _with_argv(argv, lambda: parse_config(argv, default_config=CONFIG)[0])


def _cli(argv):
    return _with_argv(argv, lambda: cli_main(argv))


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_encode_decode_roundtrip():
    ex = {"id": "x", "input_ids": np.array([5, 70000, 3], np.int32),
          "loss_mask": np.array([0, 1, 1], np.uint8), "eligible_mask": np.array([0, 1, 1], np.uint8),
          "provenance": {"task_id": "t", "step": 3}, "turn_spans": [(1, 3)]}
    got = decode_example(encode_example(ex))
    assert got["id"] == "x" and got["provenance"] == ex["provenance"] and got["turn_spans"] == [(1, 3)]
    for k in ("input_ids", "loss_mask", "eligible_mask"):
        np.testing.assert_array_equal(got[k], ex[k])
        assert got[k].dtype == ex[k].dtype
    with pytest.raises(ValueError, match="magic"):
        decode_example(b"nope" + bytes(8))


def test_curate_sample_accounting_adds_up(tmp_path):
    out = str(tmp_path / "cur")
    rep = curate(_cfg(output=out, progress=False))
    with open(SAMPLE, encoding="utf-8") as f:
        n_rows = sum(1 for _ in f)
    b = rep["buckets"]
    assert rep["input_rows"] == n_rows == b["kept"] + b["withheld"] + b["invalid"]
    assert b["kept"] > 0 and b["withheld"] > 0 and b["invalid"] > 0
    for bucket in ("withheld", "invalid"):
        listed = _lines(os.path.join(out, f"{bucket}.jsonl"))
        assert len(listed) == b[bucket] == sum(rep["reasons"][bucket].values())
        assert all(isinstance(x["row"], int) and x["reason"] and x["detail"] for x in listed)
    assert rep["reasons"]["withheld"].get("verifier_failed", 0) >= 1  # stored verdicts trusted

    examples = list(read_compiled(out))
    assert len(examples) == b["kept"] == sum(s["examples"] for s in rep["shards"])
    assert rep == json.load(open(os.path.join(out, "report.json")))
    sup = sum(int(e["loss_mask"].sum()) for e in examples)
    elig = sum(int(e["eligible_mask"].sum()) for e in examples)
    assert rep["tokens"]["kept_supervised"] == sup > 0
    assert rep["tokens"]["kept_eligible"] == elig
    t = rep["tokens"]  # TER: response content only, end-of-turn markers excluded
    assert rep["ter"] == pytest.approx(t["kept_excluded_content"] / t["kept_content"])
    for e in examples:
        assert e["input_ids"].dtype == np.int32 and len(e["loss_mask"]) == len(e["input_ids"])
        assert not (e["loss_mask"] & ~e["eligible_mask"]).any()  # supervised implies eligible
        assert e["turn_spans"] and e["provenance"]["task_id"]
    assert rep["config"]["tokenizer"] == "qwen"

    # eligible mode keeps the same rows ("ROSS w/o mask") and supervises every eligible token.
    rep2 = curate(_cfg(output=out, progress=False, mask_mode="eligible"))
    assert rep2["buckets"] == rep["buckets"] and rep2["ter"] == 0.0
    assert len(list(read_compiled(out))) == b["kept"]  # old shards were replaced, not appended


def test_curate_rerun_verifies_and_withholds(tmp_path):
    code_task = {"id": "t-add", "domain": "code", "entry_point": "add",
                 "prompt": "def add(a, b):\n    \"\"\"Sum.\"\"\"\n",
                 "tests": "def check(candidate):\n    assert candidate(2, 2) == 4\n"}

    def rec(i, task, answer, verifier=None):
        r = {"id": f"r{i}", "task": task, "annotation": {"status": "accept"},
             "messages": [{"role": "user", "content": "solve"},
                          {"role": "assistant", "content": answer}]}
        if verifier:
            r["verifier"] = verifier
        return r

    rows = [
        rec(0, code_task, "```python\ndef add(a, b):\n    return a + b\n```"),
        rec(1, code_task, "```python\ndef add(a, b):\n    return a * 3\n```",
            {"name": "code", "passed": True}),  # stored verdict is wrong; rerun catches it
        rec(2, {"domain": "math", "reference": "4"}, r"2+2 = \boxed{4}"),
        rec(3, {"domain": "math", "reference": "{{{"}, r"\boxed{4}"),  # gold unparseable
        rec(4, {"domain": "chat"}, "hello"),  # no verifier at all: withheld as unverified
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    out = str(tmp_path / "out")
    rep = curate(_cfg(input=str(src), output=out, progress=False, verify="rerun"))
    assert rep["input_rows"] == 6
    assert rep["buckets"] == {"kept": 2, "withheld": 3, "invalid": 1}
    assert rep["reasons"]["withheld"] == {"verifier_failed": 1, "verifier_undecided": 1,
                                          "unverified": 1}
    assert rep["verify"] == {"mode": "rerun", "unverified_policy": "withhold",
                             "undecided_policy": "withhold", "passed": 2, "failed": 1,
                             "undecided": 1, "unverified": 1, "rerun": 4,
                             "sandbox": sandbox.isolation()}
    assert sorted(e["id"] for e in read_compiled(out)) == ["r0", "r2"]
    withheld = {x["id"]: x for x in _lines(os.path.join(out, "withheld.jsonl"))}
    assert withheld["r1"]["reason"] == "verifier_failed" and "AssertionError" in withheld["r1"]["detail"]
    assert "config.unverified=keep" in withheld["r4"]["detail"]

    # unverified=keep trains on the row nobody checked (and says so in the counts).
    rep = curate(_cfg(input=str(src), output=out, progress=False, verify="rerun", unverified="keep"))
    assert rep["buckets"] == {"kept": 3, "withheld": 2, "invalid": 1}
    assert rep["verify"]["unverified"] == 1

    # auto (the default): r1's stored (wrong) verdict is trusted, the others are run.
    rep = curate(_cfg(input=str(src), output=out, progress=False))
    assert rep["verify"]["mode"] == "auto" and rep["verify"]["rerun"] == 3
    assert sorted(e["id"] for e in read_compiled(out)) == ["r0", "r1", "r2"]
    assert rep["reasons"]["withheld"] == {"verifier_undecided": 1, "unverified": 1}

    # stored: only r1 has a verdict; every other valid row is unverified, and nothing runs.
    rep = curate(_cfg(input=str(src), output=out, progress=False, verify="stored"))
    assert rep["buckets"] == {"kept": 1, "withheld": 4, "invalid": 1}
    assert rep["verify"]["unverified"] == 4 and rep["verify"]["rerun"] == 0
    assert all("verify=stored" in x["detail"] for x in _lines(os.path.join(out, "withheld.jsonl")))


def test_cli_curate_and_bad_config(tmp_path, capsys):
    out = str(tmp_path / "cli")
    assert _cli(["curate", f"--config={CONFIG}", f"--config.output={out}",
                 "--config.progress=False"]) == 0
    assert os.path.exists(os.path.join(out, "report.json"))
    assert _cli(["curate", f"--config={CONFIG}", f"--config.output={out}",
                 "--config.verify=maybe"]) == 2
    assert "config.verify" in capsys.readouterr().err
    assert _cli(["curate", f"--config={CONFIG}", f"--config.input={tmp_path}/none.jsonl",
                 f"--config.output={out}"]) == 2


def test_cli_bad_inputs_are_one_sentence_never_a_traceback(tmp_path, capsys):
    import gzip

    good = {"id": "g", "messages": [{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "hello"}],
            "verifier": {"name": "math", "passed": True}, "annotation": {"status": "accept"}}
    bad_role = {**good, "id": "b", "messages": [{"role": "robot", "content": "x"}]}
    rows = [{**good, "id": f"g{i}"} for i in range(50)] + [bad_role]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    trunc = tmp_path / "t.jsonl.gz"
    trunc.write_bytes(gzip.compress(body)[:-40])  # cut inside the stream
    out = str(tmp_path / "o")
    base = [f"--config={CONFIG}", f"--config.output={out}", "--config.progress=False"]

    # A truncated .gz: the readable rows count, the break is one invalid row, the report adds up.
    assert _cli(["curate", *base, f"--config.input={trunc}"]) == 0
    rep = json.load(open(os.path.join(out, "report.json")))
    assert rep["input_rows"] == sum(rep["buckets"].values()) and rep["buckets"]["invalid"] >= 1
    last = _lines(os.path.join(out, "invalid.jsonl"))[-1]
    assert "t.jsonl.gz row" in last["detail"] and "truncated" in last["detail"]

    # An invalid row keeps its id in invalid.jsonl when the id could be read; a run that kept
    # no row at all exits 2 naming the reasons (the report and lists are still written).
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps(bad_role) + "\n")
    capsys.readouterr()
    assert _cli(["curate", *base, f"--config.input={src}"]) == 2
    assert "none of the 1 rows was kept: 1 invalid as invalid_record" in capsys.readouterr().err
    assert _lines(os.path.join(out, "invalid.jsonl"))[0]["id"] == "b"

    # Not Parquet at all, a tokenizer that does not exist: one line naming the file / field.
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    assert _cli(["curate", *base, f"--config.input={junk}"]) == 2
    err = capsys.readouterr().err
    assert "junk.parquet" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert _cli(["curate", *base, f"--config.input={src}",
                 f"--config.tokenizer={tmp_path}/no-tok"]) == 2
    err = capsys.readouterr().err
    assert "config.tokenizer" in err and "no-tok" in err and "Traceback" not in err

    # An empty file is a documented outcome: an empty output and a warning, not a crash.
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert _cli(["curate", *base, f"--config.input={empty}"]) == 0
    assert "holds no rows" in capsys.readouterr().err
    assert json.load(open(os.path.join(out, "report.json")))["input_rows"] == 0


def _mixed_rows():
    """One row per case the recipes treat differently; verdicts stored (verify=stored runs none)."""
    ok, bad = {"name": "math", "passed": True}, {"name": "math", "passed": False, "evidence": "7 != 12"}
    answer = "Multiplying: 3*4 = 12.\nThe answer is \\boxed{12}."
    keep = {"status": "accept", "keep": [{"message": 1, "start": "The answer", "end": "{12}."}]}

    def rec(rid, verifier, annotation):
        r = {"id": rid, "task": {"id": "t-" + rid, "domain": "math", "reference": "12"},
             "messages": [{"role": "user", "content": "What is 3*4?"},
                          {"role": "assistant", "content": answer}]}
        if verifier is not None:
            r["verifier"] = verifier
        if annotation is not None:
            r["annotation"] = annotation
        return r

    return [
        rec("accept", ok, keep),
        rec("revise", ok, {"status": "revise", "exclude": [{"message": 1, "line": 1}]}),
        rec("drop", ok, {**keep, "status": "drop"}),
        rec("none", ok, None),
        rec("broken", ok, {"status": "accept", "keep": [{"message": 1, "start": "absent",
                                                         "end": "{12}."}]}),
        rec("failed", bad, keep),
        rec("failed_drop", bad, {"status": "drop"}),
        rec("failed_none", bad, None),
        rec("undecided", {"name": "math", "passed": None}, keep),
        rec("unverified", None, keep),
    ]


@pytest.mark.parametrize("recipe", ["ross", "ross_no_mask", "positive_sft"])
def test_recipe_rows_and_reasons(tmp_path, recipe):
    from types import SimpleNamespace

    from rossjax.train.sft import step as sft, trainer as loop

    src = tmp_path / "mixed.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _mixed_rows()) + "{not json\n")
    want = {k: sft.RECIPES[recipe][k] for k in ("rows", "mask_mode")}  # the curate fields
    out = str(tmp_path / recipe)
    rep = curate(_cfg(input=str(src), output=out, progress=False, verify="stored", **want))

    common = {"verifier_failed": 3, "verifier_undecided": 1, "unverified": 1}
    if want["rows"] == "accepted":
        kept = ["accept", "revise"]
        reasons = {**common, "annotation_drop": 1, "not_annotated": 1, "anchor_missing": 1}
        review = {"accept": 1, "revise": 1, "drop": 0, "none": 0}
    else:  # reviews ignored: drops, unannotated and unresolvable annotations all train
        kept = ["accept", "broken", "drop", "none", "revise"]
        reasons = common
        review = {"accept": 2, "revise": 1, "drop": 1, "none": 1}
    examples = {e["id"]: e for e in read_compiled(out)}
    assert sorted(examples) == kept
    assert rep["reasons"] == {"withheld": reasons, "invalid": {"invalid_record": 1}}
    b = rep["buckets"]
    assert rep["input_rows"] == 11 == b["kept"] + b["withheld"] + b["invalid"]
    assert b == {"kept": len(kept), "withheld": sum(reasons.values()), "invalid": 1}
    assert rep["kept_by_review"] == review
    withheld = {x["id"]: x["reason"] for x in _lines(os.path.join(out, "withheld.jsonl"))}
    assert withheld["failed_drop"] == withheld["failed_none"] == "verifier_failed"
    assert len(withheld) == b["withheld"]

    sup = sum(int(e["loss_mask"].sum()) for e in examples.values())
    elig = sum(int(e["eligible_mask"].sum()) for e in examples.values())
    assert rep["tokens"]["kept_supervised"] == sup and rep["tokens"]["kept_eligible"] == elig
    if want["mask_mode"] == "eligible":
        assert rep["ter"] == 0.0
        assert all((e["loss_mask"] == e["eligible_mask"]).all() for e in examples.values())
    else:
        assert 0 < rep["ter"] < 1 and sup < elig

    # the curated dir is accepted by its own recipe and refused by the others
    assert loop.check_recipe(SimpleNamespace(recipe=recipe), [out]) == []
    # (sft and positive_sft train on the same rows and mask, differing only in curate's verify
    # and unverified policies, so each accepts the other's dir)
    for other in {o for o, r in sft.RECIPES.items()
                  if (r["rows"], r["mask_mode"]) != (want["rows"], want["mask_mode"])}:
        with pytest.raises(ValueError, match="curate with --config"):
            loop.check_recipe(SimpleNamespace(recipe=other), [out])


def test_ross_and_ross_no_mask_keep_the_same_rows(tmp_path):
    src = tmp_path / "mixed.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _mixed_rows()))
    got = {}
    for mode in ("annotated", "eligible"):
        out = str(tmp_path / mode)
        rep = curate(_cfg(input=str(src), output=out, progress=False, verify="stored",
                          mask_mode=mode))
        got[mode] = rep, {e["id"]: e for e in read_compiled(out)}, _lines(
            os.path.join(out, "withheld.jsonl"))
    (ra, ea, wa), (re_, ee, we) = got["annotated"], got["eligible"]
    assert ra["buckets"] == re_["buckets"] and ra["reasons"] == re_["reasons"] and wa == we
    assert sorted(ea) == sorted(ee) == ["accept", "revise"]
    for rid in ea:  # same tokens; the annotated mask is a strict subset of the eligible one
        np.testing.assert_array_equal(ea[rid]["input_ids"], ee[rid]["input_ids"])
        np.testing.assert_array_equal(ee[rid]["loss_mask"], ee[rid]["eligible_mask"])
        assert (ea[rid]["loss_mask"] <= ee[rid]["loss_mask"]).all()
        assert ea[rid]["loss_mask"].sum() < ee[rid]["loss_mask"].sum()


def test_rows_config_checked_in_one_sentence(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _mixed_rows()))
    out = str(tmp_path / "o")
    with pytest.raises(ValueError, match=r"config\.rows='verifier_positive'.*config\.mask_mode"):
        curate(_cfg(input=str(src), output=out, rows="verifier_positive"))
    with pytest.raises(ValueError, match=r"config\.rows 'reviewed' must be one of accepted"):
        curate(_cfg(input=str(src), output=out, rows="reviewed"))
    assert not os.path.exists(out)  # refused before touching the output dir
    assert _cli(["curate", f"--config={CONFIG}", f"--config.input={src}", f"--config.output={out}",
                 "--config.rows=verifier_positive", "--config.mask_mode=annotated"]) == 2
    err = capsys.readouterr().err
    assert "config.rows" in err and "config.mask_mode" in err and "Traceback" not in err


def test_input_may_name_several_files(tmp_path):
    """A directory, a glob or a comma list of rollout files is read in order as one input: rows
    count on across files, every row is accounted for, and a pattern matching nothing is one
    clear error."""
    from rossjax.curate.pipeline import curate
    from rossjax.curate.schema import expand_inputs, iter_records

    lines = open(SAMPLE).read().splitlines()
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        (shards / f"part-{i}.jsonl").write_text("\n".join(lines[i * 10:(i + 1) * 10]) + "\n")
    (shards / "notes.txt").write_text("not a rollout file")
    files = expand_inputs(str(shards))
    assert [os.path.basename(f) for f in files] == ["part-0.jsonl", "part-1.jsonl", "part-2.jsonl"]
    assert expand_inputs(str(shards / "part-*.jsonl")) == files
    assert expand_inputs(",".join(files[::-1])) == files[::-1]
    rows = list(iter_records(str(shards)))
    whole = list(iter_records(SAMPLE))
    assert [r.row for r in rows] == [r.row for r in whole] == list(range(1, 31))
    assert [r.id for r in rows] == [r.id for r in whole]
    assert {r.source for r in rows} == set(files)
    bad = [r for r in rows if r.record is None]
    assert bad and all(os.path.basename(r.source) in r.reason for r in bad)

    rep_all = curate(_cfg(output=str(tmp_path / "one"), progress=False))
    rep_parts = curate(_cfg(output=str(tmp_path / "parts"), input=str(shards / "part-*.jsonl"),
                            progress=False))
    assert rep_parts["buckets"] == rep_all["buckets"] and rep_parts["input_rows"] == 30
    with pytest.raises(FileNotFoundError, match="no file matches"):
        curate(_cfg(output=str(tmp_path / "none"), input=str(shards / "nope-*.jsonl")))
