"""Bad and foreign input (issues 14 and 18): every row ends kept, withheld(reason) or
invalid(reason); a stopped run leaves no half-written output; the inputs other tools write are
read; a curated dir that does not fit the model is one sentence before step 1."""

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from xla_flags import xla_flags

from rossjax.cli import parse_config
from rossjax.curate import pipeline
from rossjax.curate.compiled import read_compiled
from rossjax.curate.masks import compile_rollout
from rossjax.curate.schema import iter_records
from rossjax.templates import render_chat
from rossjax.tokenizers import load_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "curate.py")
OK = {"name": "math", "passed": True}


def _cfg(**over):
    argv = [f"--config={CONFIG}"] + [f"--config.{k}={v}" for k, v in over.items()]
    saved, sys.argv = sys.argv, ["rossjax", *argv]
    try:  # ml-collections reads overrides from sys.argv
        return parse_config(argv, default_config=CONFIG)[0]
    finally:
        sys.argv = saved


def _positive(**over):
    """Unreviewed, verifier-positive rows: the positive_sft recipe, stored verdicts only."""
    return _cfg(rows="verifier_positive", mask_mode="eligible", verify="stored", progress=False,
                **over)


def _row(rid, answer="4", **extra):
    r = {"messages": [{"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": answer}], "verifier": OK, **extra}
    if rid is not None:
        r["id"] = rid
    return r


def _write(path, rows):
    path.write_bytes(b"".join(r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n"
                              for r in rows))
    return str(path)


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f]


def _adds_up(rep):
    assert rep["input_rows"] == sum(rep["buckets"].values())


def test_lone_surrogate_row_is_invalid_and_the_run_goes_on(tmp_path):
    src = _write(tmp_path / "s.jsonl", [_row("a"), b'{"id": "b", "messages": [{"role": "user", '
                                        b'"content": "x\\ud800"}, {"role": "assistant", '
                                        b'"content": "y"}], "verifier": {"passed": true}}\n',
                                        _row("c", "5")])
    out = str(tmp_path / "out")
    rep = pipeline.curate(_positive(input=src, output=out))
    _adds_up(rep)
    assert rep["buckets"] == {"kept": 2, "withheld": 0, "invalid": 1}
    (bad,) = _lines(os.path.join(out, "invalid.jsonl"))
    assert bad["row"] == 2 and bad["id"] == "b"
    assert "messages[0].content" in bad["detail"] and "surrogate" in bad["detail"]


def test_bad_byte_spoils_only_its_line(tmp_path):
    rows = [_row(f"r{i}", str(i)) for i in range(6)]
    blob = [json.dumps(r).encode() + b"\n" for r in rows]
    blob[2] = blob[2].replace(b'"2+2?"', b'"2+2\xff?"')  # a bad byte in line 3 only
    for name, data in (("b.jsonl", b"".join(blob)), ("b.jsonl.gz", gzip.compress(b"".join(blob)))):
        path = tmp_path / name
        path.write_bytes(data)
        got = list(iter_records(str(path)))
        assert [r.row for r in got] == [1, 2, 3, 4, 5, 6]
        assert [r.record is None for r in got] == [False, False, True, False, False, False]
        assert f"{name} row 3" in got[2].reason and "UTF-8" in got[2].reason
    out = str(tmp_path / "out")
    rep = pipeline.curate(_positive(input=str(tmp_path / "b.jsonl"), output=out))
    assert rep["buckets"] == {"kept": 5, "withheld": 0, "invalid": 1}
    assert _lines(os.path.join(out, "invalid.jsonl"))[0]["row"] == 3


def test_duplicate_ids_keep_the_first(tmp_path, capsys):
    src = _write(tmp_path / "d.jsonl", [_row("a", "1"), _row("b", "2"), _row("a", "3"),
                                        _row("a", "4")])
    out = str(tmp_path / "out")
    rep = pipeline.curate(_positive(input=src, output=out))
    _adds_up(rep)
    assert rep["buckets"]["kept"] == 2 and rep["reasons"]["withheld"] == {"duplicate_id": 2}
    assert rep["ids"]["duplicate"] == 2
    assert [x["row"] for x in _lines(os.path.join(out, "withheld.jsonl"))] == [3, 4]
    assert [ex["id"] for ex in read_compiled(out)] == ["a", "b"]
    assert "2 rows repeat an earlier row's id" in capsys.readouterr().err
    rep = pipeline.curate(_positive(input=src, output=out, duplicates="keep"))
    assert rep["buckets"]["kept"] == 4 and rep["ids"]["duplicate"] == 2


def test_a_stopped_run_leaves_the_previous_output_whole(tmp_path, monkeypatch):
    src = _write(tmp_path / "r.jsonl", [_row(f"r{i}", str(i)) for i in range(12)])
    out = str(tmp_path / "out")
    first = pipeline.curate(_positive(input=src, output=out, examples_per_shard=4))
    before = sorted(os.listdir(out))
    assert first["buckets"]["kept"] == 12 and len(first["shards"]) == 3

    calls = {"n": 0}
    real_write = pipeline.ShardWriter.write

    def dies(self, blob):  # a kill after some shards of the new run were written
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        real_write(self, blob)

    monkeypatch.setattr(pipeline.ShardWriter, "write", dies)
    with pytest.raises(KeyboardInterrupt):
        pipeline.curate(_positive(input=src, output=out, examples_per_shard=2))
    visible = sorted(n for n in os.listdir(out) if not n.startswith("."))
    assert visible == before  # the old run, whole: no shard of the new one mixed in
    rep = json.load(open(os.path.join(out, "report.json")))
    assert [s["path"] for s in rep["shards"]] == [n for n in before if n.endswith(".array_record")]
    assert len(list(read_compiled(out))) == 12

    monkeypatch.setattr(pipeline.ShardWriter, "write", real_write)
    again = pipeline.curate(_positive(input=src, output=out, examples_per_shard=2))
    assert len(again["shards"]) == 6 and ".partial" not in os.listdir(out)
    assert len(os.listdir(out)) == 6 + 3 + 1  # shards, report and lists, run.lock


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}}}}]


def test_foreign_rows_are_read(tmp_path):
    rows = [
        # TRL conversational, no id; OpenAI developer role, text parts, reasoning_content, tools
        {"messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                      {"role": "user", "content": [{"type": "text", "text": "Weather in "},
                                                   {"type": "text", "text": "Oslo?"}]},
                      {"role": "assistant", "reasoning_content": "Call the tool.", "content": "",
                       "tool_calls": [{"type": "function", "function": {
                           "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]}],
         "tools": TOOLS},
        {"prompt": "2+2?", "completion": "4"},  # TRL prompt/completion, strings
        {"prompt": [{"role": "user", "content": "3+3?"}],  # TRL, message lists
         "completion": [{"role": "assistant", "content": "6"}]},
        {"input": "5+5?", "output": "10", "score": 1.0, "step": 7},  # verl rollout dump
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
                      {"role": "assistant", "content": "x"}]},  # not text: invalid
    ]
    got = list(iter_records(_write(tmp_path / "f.jsonl", rows)))
    assert [r.record is None for r in got] == [False, False, False, False, True]
    assert "content[0] is a 'image_url' part" in got[4].reason
    a, b, c, d = (r.record for r in got[:4])
    assert [m["role"] for m in a["messages"]] == ["system", "user", "assistant"]
    assert a["messages"][1]["content"] == "Weather in Oslo?"
    assert a["messages"][2]["reasoning"] == "Call the tool."
    assert all(r.derived_id for r in got[:4]) and a["id"].startswith("sha-")
    assert a["id"] == next(iter_records(_write(tmp_path / "g.jsonl", rows[:1]))).record["id"]
    assert b["messages"] == [{"role": "user", "content": "2+2?"},
                             {"role": "assistant", "content": "4"}]
    assert c["messages"][1] == {"role": "assistant", "content": "6"}
    assert d["reward"] == 1.0 and d["source"] == {"step": 7}

    # tools are context, in the model's own layout; the tool call is supervised
    r = render_chat(a["messages"], "chatml", tools=a["tools"])
    assert r.text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '\n{"type": "function", "function": {"name": "get_weather"' in r.text
    elig = "".join(r.text[s:e] for s, e in r.eligible_intervals())
    assert "# Tools" not in elig and "<think>\nCall the tool." in elig and "get_weather" in elig


def test_verl_parquet_dataset_and_field_mapping(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    verl = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"data_source": "openai/gsm8k", "ability": "math",
         "prompt": [{"role": "user", "content": "What is 6*7?"}],
         "reward_model": {"style": "rule", "ground_truth": "42"},
         "extra_info": {"index": i, "split": "train"},
         "response": "6*7 = \\boxed{42}" if i else "\\boxed{41}"} for i in range(3)]), verl)
    out = str(tmp_path / "v")
    # verify=auto runs the math verifier on task.reference = the ground truth
    rep = pipeline.curate(_cfg(input=str(verl), output=out, rows="verifier_positive",
                               mask_mode="eligible", progress=False, verify_workers=1))
    _adds_up(rep)
    assert rep["buckets"]["kept"] == 2 and rep["reasons"]["withheld"] == {"verifier_failed": 1}
    assert rep["ids"]["derived"] == 3

    mapped = _write(tmp_path / "m.jsonl", [{"q": "1+1?", "a": "2", "r": 0.9, "uid": 1},
                                           {"q": "1+2?", "a": "4", "r": 0.1, "uid": 2},
                                           {"q": "1+3?", "a": "4", "uid": 3}])
    rep = pipeline.curate(_positive(
        input=mapped, output=str(tmp_path / "m"), **{
            "fields.input_key": "q", "fields.label_key": "a", "fields.reward_key": "r",
            "fields.reward_threshold": 0.5, "fields.id_key": "uid"}))
    _adds_up(rep)
    assert rep["buckets"] == {"kept": 1, "withheld": 1, "invalid": 1}
    assert [ex["id"] for ex in read_compiled(str(tmp_path / "m"))] == ["1"]
    bad = _lines(str(tmp_path / "m" / "invalid.jsonl"))[0]
    assert bad["row"] == 3 and "config.fields.reward_key" in bad["detail"]


class _WithTemplate:
    """The Qwen tokenizer with a chat template of the test's choosing."""

    def __init__(self, src):
        self._tok, self.chat_template = load_tokenizer("qwen"), src

    def __getattr__(self, name):
        return getattr(self._tok, name)


GEN_TEMPLATE = ("{%- if tools %}{{- 'TOOLS:' + tools | length | string + '\\n' }}{%- endif %}"
                "{%- if enable_thinking is false %}{{- 'NO-THINK\\n' }}{%- endif %}"
                "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
                "{%- if m.role == 'assistant' %}{% generation %}{{- m.content + '<|im_end|>' }}"
                "{% endgeneration %}{{- '\\n' }}{%- else %}{{- m.content + '<|im_end|>\\n' }}"
                "{%- endif %}{%- endfor %}"
                "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def test_generation_tag_tools_kwargs_and_template_errors():
    rec = {**_row("t"), "tools": TOOLS}
    ex = compile_rollout(rec, _WithTemplate(GEN_TEMPLATE), template="tokenizer",
                         template_kwargs={"enable_thinking": False})
    assert ex.status == "kept"
    tok = load_tokenizer("qwen")
    text = tok.decode(ex.input_ids.tolist())
    assert text.startswith("TOOLS:1\nNO-THINK\n<|im_start|>user\n2+2?")
    assert tok.decode(ex.input_ids[ex.loss_mask.astype(bool)].tolist()) == "4<|im_end|>"
    for src, code in (("{% if %}", "template_syntax"),
                      ("{{ raise_exception('no tools here') }}", "template_error"),
                      ("{{ messages[0].content.nope() }}", "template_error")):
        ex = compile_rollout(rec, _WithTemplate(src), template="tokenizer")
        assert (ex.status, ex.reason) == ("withheld", code)


def test_parquet_export_reads_back(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    src = _write(tmp_path / "r.jsonl", [_row(f"r{i}", "x " * (i + 1)) for i in range(5)])
    out = str(tmp_path / "out")
    report = pipeline.run(_positive(input=src, output=out, export_format="parquet"))
    table = pq.read_table(os.path.join(out, "data.parquet")).to_pylist()
    exs = list(read_compiled(out))
    assert len(table) == report["buckets"]["kept"] == len(exs) == 5
    for row, ex in zip(table, exs):
        ids, mask = np.array(row["input_ids"]), np.array(row["assistant_masks"])
        np.testing.assert_array_equal(ids, ex["input_ids"])
        np.testing.assert_array_equal(mask, ex["loss_mask"])
        labels = np.array(row["labels"])
        assert (labels[mask == 0] == -100).all() and (labels[mask == 1] == ids[mask == 1]).all()
        assert row["attention_mask"] == [1] * len(ids) and row["id"] == ex["id"]
        assert mask.sum() > 0 and (mask == 0).sum() > 0


def _cli(*argv, cwd):
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    env["XLA_FLAGS"] = xla_flags()
    return subprocess.run([sys.executable, "-m", "rossjax.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_journey_trl_rows_to_parquet_and_kept_nothing(tmp_path):
    """A user with TRL rows (no ids) curates them with the real CLI and gets Parquet; the same
    rows with a too small max_length exit 2 saying the rows were too long."""
    src = _write(tmp_path / "trl.jsonl", [{"prompt": f"{i}+1?", "completion": f"{i + 1}",
                                           "verifier": OK} for i in range(4)])
    base = ["curate", f"--config={CONFIG}", f"--config.input={src}", "--config.progress=False",
            "--config.rows=verifier_positive", "--config.mask_mode=eligible",
            "--config.verify=stored"]
    p = _cli(*base, f"--workdir={tmp_path / 'c'}", "--config.export_format=parquet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "4 rows had no id; each was given one derived from its content" in p.stderr
    assert os.path.exists(tmp_path / "c" / "data.parquet")
    p = _cli(*base, f"--workdir={tmp_path / 'd'}", "--config.max_length=3", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "none of the 4 rows was kept: 4 withheld as too_long" in p.stderr
    assert "longer than config.max_length=3" in p.stderr
    assert json.load(open(tmp_path / "d" / "report.json"))["buckets"]["withheld"] == 4


def _curated(out, vocab_top, length=40, n=8):
    from array_record.python.array_record_module import ArrayRecordWriter

    from rossjax.curate.compiled import encode_example

    os.makedirs(out)
    w = ArrayRecordWriter(os.path.join(out, "compiled-00000.array_record"), "group_size:1")
    rng = np.random.default_rng(0)
    for i in range(n):
        ids = rng.integers(0, vocab_top, length)
        ids[-1] = vocab_top - 1
        mask = np.r_[np.zeros(length // 2), np.ones(length - length // 2)].astype(np.uint8)
        w.write(encode_example({"id": f"e{i}", "input_ids": ids, "loss_mask": mask,
                                "eligible_mask": mask}))
    w.close()
    with open(os.path.join(out, "report.json"), "w") as f:  # train refuses a folder without one
        json.dump({"shards": [{"path": "compiled-00000.array_record", "examples": n}]}, f)
    return str(out)


def test_journey_train_refuses_data_that_does_not_fit_the_model(tmp_path):
    """Data curated with a larger vocabulary than the model's, or rows all longer than
    data.seq_len: `rossjax train` says so in one sentence before step 1 (was: loss nan, exit 0)."""
    sft = os.path.join(REPO, "configs", "ross_sft.py")
    big = _curated(tmp_path / "big", vocab_top=300)  # tiny_qwen2 (runlocal) has 256 ids
    p = _cli("train", f"--config={sft}:runlocal", f"--config.data.train={big}",
             f"--workdir={tmp_path / 'w1'}", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "holds token id 299 but the model's vocabulary has 256 ids" in p.stderr
    long = _curated(tmp_path / "long", vocab_top=200, length=600)
    p = _cli("train", f"--config={sft}:runlocal", f"--config.data.train={long}",
             "--config.data.seq_len=128", f"--workdir={tmp_path / 'w2'}", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "every row of" in p.stderr and "longer than config.data.seq_len=128" in p.stderr


def test_a_malformed_probe_or_store_manifest_names_its_file(tmp_path):
    from rossjax.errors import InputError
    from rossjax.probes import heads, store

    (tmp_path / "probe.json").write_text('{"head": "linear",')  # cut off mid-write
    with pytest.raises(InputError, match=r"probe\.json: the probe manifest is not valid JSON \(line 1"):
        heads.load_probe(str(tmp_path / "probe"))
    with pytest.raises(InputError, match=r"probe2\.json: the probe manifest is missing"):
        heads.load_probe(str(tmp_path / "probe2"))
    st = tmp_path / "store"
    st.mkdir()
    (st / "manifest.json").write_text("not json")
    with pytest.raises(InputError, match=r"manifest\.json: the activation store manifest is not valid JSON"):
        store.open_store(str(st))
