"""Rollout records: every row ends up either as a validated record or with a reason naming the field."""

import gzip
import json

import pytest

from rossjax.curate.schema import iter_records, validate_record


def good(i=0, **kw):
    rec = {"id": f"r{i}", "task": {"id": "t", "domain": "math", "prompt": "p", "reference": "4"},
           "source": {"run": "run", "step": 3},
           "messages": [{"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "4", "reasoning": "2+2=4"}],
           "reward": 1.0, "verifier": {"name": "math", "passed": True, "evidence": "ok"},
           "annotation": {"status": "accept", "keep": [{"message": 1, "start": "4", "end": "4"}]}}
    rec.update(kw)
    return rec


def write_jsonl(path, lines, gz=False):
    data = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(data)
    else:
        path.write_text(data, encoding="utf-8")


BAD = [
    ("{not json", "row 2: line is not valid JSON"),
    (json.dumps(good(messages=[{"role": "robot", "content": "x"}])),
     "row 3: messages[0].role 'robot' is not one of system, user, assistant, tool"),
    (json.dumps({k: v for k, v in good().items() if k != "messages"}),
     "row 4: messages must be a non-empty list"),
    (json.dumps(good(reward="high")), "row 5: reward must be a number, got str"),
    (json.dumps(good(annotation={"exclude": [{"message": 9, "line": 1, "quote": "x"}]})),
     "row 6: annotation.exclude[0].message 9 points at a message that does not exist"),
    (json.dumps(good(annotation={"status": "maybe"})), "row 7: annotation.status 'maybe'"),
    (json.dumps(good(token_ids=[1, -2])), "row 8: token_ids[1] must be a non-negative integer"),
    (json.dumps(good(messages=[{"role": "user", "content": 3}])),
     "row 9: messages[0].content must be a string, got int"),
    (json.dumps(good(annotation={"exclude": [{"message": 1, "line": 0}]})),
     "row 10: annotation.exclude[0].line must be an integer >= 1"),
    (json.dumps([1, 2]), "row 11: record must be a JSON object"),
]


@pytest.mark.parametrize("gz", [False, True])
def test_jsonl_rows_and_reasons(tmp_path, gz):
    path = tmp_path / ("rollouts.jsonl.gz" if gz else "rollouts.jsonl")
    lines = [json.dumps(good(0))] + [b for b, _ in BAD] + [json.dumps(good(99))]
    write_jsonl(path, lines, gz)
    rows = list(iter_records(path))
    assert len(rows) == len(lines)  # the run continues past every bad row
    assert [r.row for r in rows] == list(range(1, len(lines) + 1))
    assert rows[0].record["id"] == "r0" and rows[0].reason is None
    assert rows[-1].record["id"] == "r99"
    for row, (_, want) in zip(rows[1:-1], BAD):
        assert row.record is None
        assert row.reason.startswith(path.name + " "), row.reason
        assert want in row.reason, (want, row.reason)


def test_blank_lines_are_skipped_but_rows_keep_line_numbers(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(good(1)) + "\n\n" + "{bad\n", encoding="utf-8")
    rows = list(iter_records(path))
    assert [(r.row, r.record is not None) for r in rows] == [(1, True), (3, False)]


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = [good(0), good(1, annotation={"status": "drop"}), good(2)]
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "r.parquet")
    rows = list(iter_records(tmp_path / "r.parquet"))
    assert [r.record["id"] for r in rows] == ["r0", "r1", "r2"]
    assert rows[0].record["messages"][1]["reasoning"] == "2+2=4"
    assert "reasoning" not in rows[0].record["messages"][0]  # nulls read as absent fields
    assert rows[1].record["annotation"]["status"] == "drop"


def test_validate_tool_calls_and_roles():
    rec = good(messages=[{"role": "user", "content": "ls"},
                         {"role": "assistant", "content": None,
                          "tool_calls": [{"type": "function",
                                          "function": {"name": "bash", "arguments": {"cmd": "ls"}}}]},
                         {"role": "tool", "name": "bash", "content": "a.txt"}],
               annotation=None)
    assert validate_record(rec) is None
    rec["messages"][2]["tool_calls"] = []
    assert validate_record(rec) == "messages[2].tool_calls is only allowed on assistant messages, not tool"
    rec["messages"][2].pop("tool_calls")
    rec["messages"][1]["tool_calls"][0]["function"].pop("name")
    assert validate_record(rec) == "messages[1].tool_calls[0].name must be a non-empty string"


def test_missing_file_and_unknown_suffix(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(iter_records(tmp_path / "nope.jsonl"))
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(ValueError, match="x.csv"):
        list(iter_records(tmp_path / "x.csv"))


def test_verl_dataset_fields_map_to_the_task(tmp_path):
    """docs/data.md: `data_source` + `extra_info.index` -> task.id, `ability` -> task.domain,
    `reward_model.ground_truth` -> task.reference, `data_source` -> source.run."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"data_source": "openai/gsm8k", "ability": "math",
         "prompt": [{"role": "user", "content": f"What is {i}*7?"}],
         "reward_model": {"style": "rule", "ground_truth": str(7 * i)},
         "extra_info": {"index": 10 + i, "split": "train"},
         "response": f"\\boxed{{{7 * i}}}"} for i in range(3)]), path)
    recs = [r.record for r in iter_records(str(path))]
    assert [r["task"]["id"] for r in recs] == ["openai/gsm8k-10", "openai/gsm8k-11",
                                               "openai/gsm8k-12"]
    assert [r["task"]["reference"] for r in recs] == ["0", "7", "14"]
    assert {r["task"]["domain"] for r in recs} == {"math"}
    assert recs[1]["source"]["run"] == "openai/gsm8k"
    assert recs[1]["messages"] == [{"role": "user", "content": "What is 1*7?"},
                                   {"role": "assistant", "content": "\\boxed{7}"}]
