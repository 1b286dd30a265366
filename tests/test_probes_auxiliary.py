"""The auxiliary probe's set as PROPEL defines it: positives = the ORIGINAL corpus's band
positives (not the run's true positives); negatives = the run's false positives plus every task
of the dominant collapsed family; `rossjax aux-set` writes labels and extract rows, same ids."""

import json

import pytest

from rossjax.probes import auxiliary

IN, OUT = [True, False, False, False], [False] * 4   # 1/4 solved: in band; 0/4: out


def test_build_follows_the_paper_definition():
    original = [{"id": "o1", "trials": IN}, {"id": "o2", "trials": OUT}, {"id": "o3", "trials": IN}]
    run = [  # step, family, probe score, realized trials
        {"id": "r1", "step": 1, "family": "string", "probe_score": 0.9, "trials": OUT, "valid": 1},  # FP
        {"id": "r2", "step": 1, "family": "string", "probe_score": 0.9, "trials": IN, "valid": 1},   # TP
        {"id": "r3", "step": 2, "family": "list", "probe_score": 0.2, "trials": OUT, "valid": 1},
        {"id": "r4", "step": 3, "family": "list", "probe_score": 0.8, "trials": IN, "valid": 1},
        {"id": "r5", "step": 3, "family": "list", "probe_score": 0.7, "trials": OUT, "valid": 1},   # FP
        {"id": "r6", "step": 3, "family": "list", "probe_score": 0.9, "trials": [], "valid": 0},
    ]
    rows, rep = auxiliary.build(original, run, threshold=0.5)
    lab = {r["id"]: (r["label"], r["source"]) for r in rows}
    assert {i for i, (y, _) in lab.items() if y == 1} == {"o1", "o3"}   # r2, r4 (TPs) are not positives
    assert lab["r1"] == (0, "false_positive") and lab["r5"] == (0, "false_positive+collapsed_family")
    assert lab["r3"] == (0, "collapsed_family") and lab["r4"] == (0, "collapsed_family")
    assert "r2" not in lab and "r6" not in lab and "o2" not in lab
    assert rep["collapsed_family"] == "list" and rep["false_positives"] == 2
    # the family over the last step only
    rows, rep = auxiliary.build(original, run, threshold=0.5, last_steps=1)
    assert rep["collapsed_family"] == "list" and rep["collapsed_family_rows"] == 2
    with pytest.raises(ValueError, match="probe_score"):
        auxiliary.build(original, [{"id": "x", "trials": IN}])


def test_aux_set_command(tmp_path, capsys):
    from rossjax.cli import main

    def write(name, rows):
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in rows))
        return str(tmp_path / name)

    ol = write("ol.jsonl", [{"id": "o1", "trials": IN}, {"id": "o2", "trials": OUT}])
    oi = write("oi.jsonl", [{"id": "o1", "input_ids": [1, 2]}, {"id": "o2", "input_ids": [3]}])
    rl = write("rl.jsonl", [{"id": "r1", "family": "list", "probe_score": 0.9, "trials": OUT, "valid": 1}])
    ri = write("ri.jsonl", [{"id": "r1", "input_ids": [4, 5]}])
    argv = ["aux-set", "--config=configs/aux_set.py", f"--config.original_labels={ol}",
            f"--config.original_inputs={oi}", f"--config.run_labels={rl}", f"--config.run_inputs={ri}",
            f"--config.output={tmp_path / 'aux'}"]
    assert main(argv) == 0
    labs = [json.loads(x) for x in open(tmp_path / "aux" / "aux_labels.jsonl")]
    ins = [json.loads(x) for x in open(tmp_path / "aux" / "aux_inputs.jsonl")]
    assert [(r["id"], r["label"]) for r in labs] == [("o1", 1), ("r1", 0)]
    assert [r["id"] for r in ins] == ["o1", "r1"] and ins[1]["input_ids"] == [4, 5]
    capsys.readouterr()
    assert main(argv[:-1] + [f"--config.run_inputs={oi}", f"--config.output={tmp_path / 'b'}"]) == 2
    assert "no row in original_inputs" in capsys.readouterr().err
