"""The first hour of a TRL or verl user (issue 29), walked through the command line: nothing is
lost silently in training, curate's verifiers read the rows users have, GRPO runs relearn with
any reward, exports carry a tokenizer, `rossjax generate` and `rossjax inspect --list`."""

import json
import os

import numpy as np
import pytest

from rossjax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SFT = os.path.join(ROOT, "configs", "ross_sft.py")
CURATE = os.path.join(ROOT, "configs", "curate.py")


def _compiled(out, lengths, vocab_top=200):
    """A curated dir of compiled rows of the given lengths (the second half of each supervised)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    from rossjax.curate.compiled import encode_example

    os.makedirs(out)
    w = ArrayRecordWriter(os.path.join(out, "compiled-00000.array_record"), "group_size:1")
    rng = np.random.default_rng(0)
    for i, n in enumerate(lengths):
        mask = np.r_[np.zeros(n // 2), np.ones(n - n // 2)].astype(np.uint8)
        w.write(encode_example({"id": f"e{i}", "input_ids": rng.integers(0, vocab_top, n),
                                "loss_mask": mask, "eligible_mask": mask}))
    w.close()
    return str(out)


def _train(data, workdir, *extra):
    return cli.main(["train", f"--config={SFT}:runlocal", f"--config.data.train={data}",
                     "--config.train.num_steps=1", "--config.data.seq_len=128",
                     f"--workdir={workdir}", *extra])


def test_rows_longer_than_seq_len_stop_the_run_or_are_counted(tmp_path, capsys):
    """The default (too_long=error) stops before step 1 with the count and the three fixes; drop
    and truncate train, and say how many rows they dropped or cut in the banner, the metrics and
    WORKDIR/too_long.jsonl."""
    data = _compiled(tmp_path / "c", [40, 300, 50, 60, 200, 70, 80, 90])
    assert _train(data, tmp_path / "w0") == 2
    err = capsys.readouterr().err
    assert "2 of the 8 rows of" in err and "longer than config.data.seq_len=128" in err
    assert "the longest has 300" in err and "config.data.too_long=drop" in err
    assert "config.data.too_long=truncate" in err and "Traceback" not in err

    assert _train(data, tmp_path / "w1", "--config.data.too_long=drop") == 0
    err = capsys.readouterr().err
    assert "2 of 8 rows longer than data.seq_len=128 (2 dropped" in err
    rows = [json.loads(x) for x in open(tmp_path / "w1" / "too_long.jsonl")]
    assert [(r["id"], r["tokens"], r["result"]) for r in rows] == [("e1", 300, "dropped"),
                                                                   ("e4", 200, "dropped")]
    m = [json.loads(x) for x in open(tmp_path / "w1" / "metrics.jsonl")][-1]
    assert (m["data_too_long"], m["data_dropped"], m["data_truncated"]) == (2, 2, 0)

    assert _train(data, tmp_path / "w2", "--config.data.too_long=truncate") == 0
    assert "(2 truncated to their last 128 tokens" in capsys.readouterr().err
    m = [json.loads(x) for x in open(tmp_path / "w2" / "metrics.jsonl")][-1]
    assert (m["data_too_long"], m["data_dropped"], m["data_truncated"]) == (2, 0, 2)

    assert _train(data, tmp_path / "w3", "--config.data.too_long=cut") == 2
    assert "config.data.too_long 'cut' is not one of error, drop, truncate" in capsys.readouterr().err
