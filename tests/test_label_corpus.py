"""`rossjax label-corpus`: pool -> K trials on hidden inputs -> labels whose ids match the
activation store `rossjax extract` builds from its inputs.jsonl (no hand assembly)."""

import json

import numpy as np

from rossjax.probes import labels as labels_mod
from rossjax.probes.store import open_store

PROG = "def f(a, b):\n    return a * b + {c}\n"


def _task(c, n=10, message="multiply"):
    return {"program": PROG.format(c=c), "inputs": [f"{a}, {a + 3}" for a in range(n)],
            "message": message}


def test_label_corpus_then_extract_ids_match(tmp_path, capsys):
    from rossjax.cli import main

    rows = [{"id": f"t{c}", "group": f"g{c % 2}", **_task(c)} for c in range(4)]
    rows.append({"id": "short", **_task(9, n=9)})                  # 9 inputs: invalid
    answer = ("```python\n" + PROG.format(c=1) + "```\n```inputs\n"
              + "\n".join(f"{a}, {a + 3}" for a in range(10)) + "\n```\n```message\nm\n```")
    rows.append({"id": "run-s3-x-g0", "messages": [{"role": "user", "content": "write a task"},
                                                  {"role": "assistant", "content": answer}],
                 "rewards": {"probe_score": 0.7}, "source": {"step": 3}})
    pool = tmp_path / "pool.jsonl"
    pool.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "lc"
    assert main(["label-corpus", "--config=configs/label_corpus.py", f"--config.pool={pool}",
                 f"--config.output={out}", "--config.tokenizer=ascii", "--config.solver.kind=lookup",
                 "--config.k=3"]) == 0
    labs = [json.loads(x) for x in open(out / "labels.jsonl")]
    assert [r["id"] for r in labs] == [r["id"] for r in rows]
    by = {r["id"]: r for r in labs}
    # the lookup solver memorises the 5 shown pairs and fails every hidden input
    assert by["t0"]["trials"] == [False] * 3 and by["t0"]["valid"] == 1 and by["t0"]["group"] == "g0"
    assert by["short"]["valid"] == 0 and by["short"]["trials"] == []
    # each invalid task says why (labels.jsonl and report.json), the valid ones carry no reason
    assert by["short"]["invalid_reason"] and "invalid_reason" not in by["t0"]
    rep = json.load(open(out / "report.json"))
    assert rep["invalid"] == {r["id"]: r["invalid_reason"] for r in labs if not r["valid"]}
    assert f"invalid short: {by['short']['invalid_reason']}" in capsys.readouterr().out
    assert by["run-s3-x-g0"]["probe_score"] == 0.7 and by["run-s3-x-g0"]["step"] == 3
    assert by["t1"]["family"] == "arithmetic"
    tasks = [json.loads(x) for x in open(out / "tasks.jsonl")]
    assert len(tasks) == 5 and all(len(t["inputs"]) == 5 == len(t["hidden_inputs"]) for t in tasks)
    # extract reads inputs.jsonl; the store's ids are the label ids, so the sweep's join holds
    store_dir = tmp_path / "acts"
    assert main(["extract", "--config=configs/extract.py", "--config.model=preset:tiny_qwen2",
                 f"--config.input={out / 'inputs.jsonl'}", f"--config.output={store_dir}",
                 "--config.layers=(1,)"]) == 0
    store = open_store(str(store_dir))
    assert store.ids == [r["id"] for r in rows]
    idx, lab, groups = labels_mod.align_labels(labs, store.ids, min_valid=2)
    assert len(idx) == 5 and lab.y.tolist() == [0] * 5     # 0 of 3 solved: out of band
    inputs = [json.loads(x) for x in open(out / "inputs.jsonl")]
    assert "```message\nmultiply\n```" in inputs[0]["text"]
    assert np.all(np.asarray(inputs[0]["input_ids"]) >= 0)
    capsys.readouterr()
    assert main(["label-corpus", "--config=configs/label_corpus.py", f"--config.output={out}",
                 f"--config.pool={tmp_path / 'none.jsonl'}", "--config.solver.kind=oracle"]) == 2
    assert "field 'pool'" in capsys.readouterr().err
