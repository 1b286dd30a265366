"""Curate never loses data (issue 22, part 3): a SIGKILL at every point of publishing leaves the
previous output whole or the new one complete; an input curate would replace is refused; the
stage appears only once the inputs can be read; a pipe is read once with every row counted; a
corrupt Parquet page, a deeply nested row and a kill are each accounted for in one sentence."""

import errno
import json
import os
import signal
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_faults_input import _lines, _positive, _row, _write

from rossjax.curate import ledger, pipeline
from rossjax.curate.compiled import read_compiled
from rossjax.errors import ConfigError, InputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The child: one curate run that SIGKILLs itself at the named publish point (its `nth` time).
CHILD = r"""
import os, signal, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
from rossjax.curate import ledger, pipeline
from test_faults_input import _positive
point, nth, src, out, per_shard, mode = sys.argv[2:8]
seen = {"n": 0}
def step(name):
    if name == point:
        seen["n"] += 1
        if seen["n"] == int(nth):
            os.kill(os.getpid(), signal.SIGKILL)
ledger._step = step
pipeline.compile_rows = lambda ready, compiler, workers: map(compiler, ready)  # no grain/jax import
if mode == "rename":
    def no_exchange(a, b):
        raise OSError(22, "exchange not supported here")
    ledger._exchange = no_exchange
if point == "writing":  # mid-stage: after the first shard's first example
    real = pipeline.ShardWriter.write
    def write(self, blob):
        real(self, blob)
        os.kill(os.getpid(), signal.SIGKILL)
    pipeline.ShardWriter.write = write
pipeline.curate(_positive(input=src, output=out, examples_per_shard=int(per_shard)))
"""


def _killed_run(point, src, out, per_shard, mode="exchange", nth=1):
    env = {**os.environ, "PYTHONPATH": REPO, "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-c", CHILD, REPO, point, str(nth), src, out,
                        str(per_shard), mode], env=env, capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stderr


def _state(out, old_ids, new_ids):
    """"old" or "new" when `out` holds exactly that run's complete output, else a description."""
    if not os.path.exists(out) or os.listdir(out) == ["run.lock"]:
        return "missing"  # (a first run creates OUTPUT to hold its lock there, and nothing else)
    rep = json.load(open(os.path.join(out, "report.json")))
    shards = sorted(n for n in os.listdir(out) if n.endswith(".array_record"))
    assert shards == sorted(s["path"] for s in rep["shards"]), (shards, rep["shards"])
    ids = [ex["id"] for ex in read_compiled(out)]
    assert rep["buckets"]["kept"] == len(ids)
    assert {"invalid.jsonl", "withheld.jsonl"} <= set(os.listdir(out))
    return {tuple(old_ids): "old", tuple(new_ids): "new"}.get(tuple(ids), f"mixed {ids}")


def _setup(tmp_path):
    old_src = _write(tmp_path / "old.jsonl", [_row(f"o{i}", str(i)) for i in range(12)])
    out = tmp_path / "out"
    pipeline.curate(_positive(input=old_src, output=str(out), examples_per_shard=4))
    (out / "notes.txt").write_text("mine")  # not curate's: must survive every publish
    (out / "raw").mkdir()  # the next run's input lives inside the output folder
    new_src = _write(out / "raw" / "new.jsonl", [_row(f"n{i}", str(i)) for i in range(10)])
    return str(out), new_src, [f"o{i}" for i in range(12)], [f"n{i}" for i in range(10)]


POINTS = {"exchange": ["writing", "staged", "linked", "swapped", "carried"],
          "rename": ["staged", "linked", "aside", "swapped", "carried"]}


@pytest.mark.parametrize("mode", sorted(POINTS))
def test_a_kill_at_every_publish_point_leaves_old_whole_or_new_complete(tmp_path, mode):
    out, new_src, old_ids, new_ids = _setup(tmp_path)
    seen = set()
    for point in POINTS[mode]:
        rc, err = _killed_run(point, new_src, out, 3, mode)
        assert rc == -signal.SIGKILL, (point, rc, err[-2000:])
        # (a killed rename fallback between its two renames has no OUTPUT: the next run's
        # open_stage puts OUTPUT.previous back, which the rerun below checks)
        state = _state(out, old_ids, new_ids) if os.path.exists(out) else "aside"
        assert state in ("old", "new", "aside"), (point, state)
        if state != "aside":
            assert open(os.path.join(out, "notes.txt")).read() == "mine", point
        seen.add(state)
        # the next run (here the old one again, for the next point) undoes what the kill left:
        # OUTPUT.previous put back, the stage removed, nothing left beside OUTPUT
        pipeline.curate(_positive(input=str(tmp_path / "old.jsonl"), output=out,
                                  examples_per_shard=4))
        assert _state(out, old_ids, new_ids) == "old"
        assert open(os.path.join(out, "notes.txt")).read() == "mine"
        assert sorted(os.listdir(os.path.dirname(out))) == ["old.jsonl", "out"], point
    pipeline.curate(_positive(input=new_src, output=out, examples_per_shard=3))
    assert _state(out, old_ids, new_ids) == "new" and ".partial" not in os.listdir(out)
    assert open(os.path.join(out, "raw", "new.jsonl")).read().count("\n") == 10
    assert {"old", "new"} <= seen  # the points cover both sides of the swap


def test_a_kill_on_the_first_run_leaves_nothing_or_everything(tmp_path):
    src = _write(tmp_path / "r.jsonl", [_row(f"n{i}", str(i)) for i in range(10)])
    out = str(tmp_path / "out")
    for point in ("staged", "swapped"):
        rc, err = _killed_run(point, src, out, 3)
        assert rc == -signal.SIGKILL, err[-2000:]
        assert _state(out, [], [f"n{i}" for i in range(10)]) in ("missing", "new")
    assert _state(out, [], [f"n{i}" for i in range(10)]) == "new"


def test_in_place_fallback_never_shows_a_report_over_other_shards(tmp_path, monkeypatch):
    """Where OUTPUT's parent cannot hold a sibling, files move one by one: report.json goes
    first and comes last, so a folder with a report.json is always one run's whole output."""
    out, new_src, old_ids, new_ids = _setup(tmp_path)
    sibling, real_mkdir, real_rename = out + ".partial", os.mkdir, os.rename

    def refuse_sibling(real):
        def call(*a, **k):
            if sibling in a:
                raise PermissionError(errno.EACCES, "read-only parent")
            return real(*a, **k)
        return call

    monkeypatch.setattr(os, "mkdir", refuse_sibling(real_mkdir))
    monkeypatch.setattr(os, "rename", refuse_sibling(real_rename))
    calls, states = [], set()

    def stop_at(n):
        def step(name):
            calls.append(name)
            if len(calls) == n:
                raise KeyboardInterrupt
        return step

    for n in range(1, 40):
        calls.clear()
        monkeypatch.setattr(ledger, "_step", stop_at(n))
        try:
            pipeline.curate(_positive(input=new_src, output=out, examples_per_shard=3))
            break  # ran past the last point
        except KeyboardInterrupt:
            pass
        assert calls and os.path.isdir(os.path.join(out, ".partial"))
        if os.path.exists(os.path.join(out, "report.json")):
            states.add(_state(out, old_ids, new_ids))
        else:
            states.add("no report")
        assert open(os.path.join(out, "notes.txt")).read() == "mine"
    assert {"old", "no report"} <= states <= {"old", "no report", "new"}
    assert _state(out, old_ids, new_ids) == "new"
    with pytest.raises(InputError, match="holds no report.json"):
        os.remove(os.path.join(out, "report.json"))
        from rossjax.train.data import split_paths

        split_paths(out, "data.train")


@pytest.mark.parametrize("name", ["invalid.jsonl", "withheld.jsonl", "data.parquet"])
def test_an_input_curate_would_replace_is_refused_and_kept(tmp_path, name):
    out = tmp_path / "out"
    pipeline.curate(_positive(input=_write(tmp_path / "r.jsonl", [_row("a")]), output=str(out)))
    target = out / name
    if name == "data.parquet":
        pq.write_table(pa.table({"messages": [[{"role": "user", "content": "x"}]]}), target)
    else:
        _write(target, [_row("b")])
    before = target.read_bytes()
    for spec in (str(target), str(out)):  # named, or listed from the output folder
        with pytest.raises(ConfigError, match=r"\.(jsonl|parquet) of config.output .*this run "
                                              r"replaces that file, so the input would be lost"):
            pipeline.curate(_positive(input=spec, output=str(out)))
        assert target.read_bytes() == before
    assert not os.path.exists(str(out) + ".partial")


def test_the_stage_appears_only_once_the_inputs_can_be_read(tmp_path):
    out = str(tmp_path / "out")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    ok = _write(tmp_path / "ok.jsonl", [_row("a")])
    locked = _write(tmp_path / "locked.jsonl", [_row("b")])
    os.chmod(locked, 0)
    cases = [(f"{ok},{bad}", r"bad.parquet: not a readable Parquet file"),
             (f"{ok},{tmp_path / 'rows.txt'}", r"rows.txt: no such rollout file")]
    if os.geteuid() != 0:  # root reads a mode-0 file
        cases.append((f"{ok},{locked}", r"locked.jsonl: the input cannot be read"))
    (tmp_path / "rows.csv").write_text("a,b\n")
    cases.append((f"{ok},{tmp_path / 'rows.csv'}", r"rollout files must be .jsonl"))
    for spec, msg in cases:
        with pytest.raises((InputError, FileNotFoundError), match=msg):
            pipeline.curate(_positive(input=spec, output=out))
        assert not os.path.exists(out) and not os.path.exists(out + ".partial"), spec
    with pytest.raises(ConfigError, match=r"config.output .*ok.jsonl is a file"):
        pipeline.curate(_positive(input=ok, output=ok))
    assert open(ok).read().count("\n") == 1


@pytest.mark.parametrize("progress", [True, False])
def test_a_pipe_is_read_once_with_every_row_counted(tmp_path, progress):
    rows = [_row(f"r{i}", str(i)) for i in range(50)]
    fifo = str(tmp_path / "rows.jsonl")
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "wb") as f:  # blocks until curate opens the pipe for reading
            for r in rows:
                f.write(json.dumps(r).encode() + b"\n")

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    cfg = _positive(input=fifo, output=str(tmp_path / "out"))
    cfg.progress = progress  # the progress bar's row count once read the pipe ahead
    rep = pipeline.curate(cfg)
    t.join(30)
    assert rep["input_rows"] == 50 and rep["buckets"]["kept"] == 50
    assert [ex["id"] for ex in read_compiled(str(tmp_path / "out"))] == [f"r{i}" for i in range(50)]


def test_a_parquet_file_corrupt_mid_file_keeps_the_rows_before_the_break(tmp_path):
    path = tmp_path / "rows.parquet"
    rows = [_row(f"r{i}", str(i)) for i in range(30)]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=10, compression="none",
                   write_page_checksum=True)
    meta = pq.ParquetFile(path).metadata
    col = meta.row_group(1).column(0)  # flip bytes inside the second row group's first page
    start = col.data_page_offset + col.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[start:start + 8] = bytes(b ^ 0xFF for b in data[start:start + 8])
    path.write_bytes(bytes(data))
    out = str(tmp_path / "out")
    rep = pipeline.curate(_positive(input=str(path), output=out))
    assert rep["input_rows"] == 30 and rep["buckets"]["invalid"] == 10  # the whole broken group
    assert rep["buckets"]["kept"] == 20  # the rows before the break and the group after it
    bad = _lines(os.path.join(out, "invalid.jsonl"))
    assert [b["row"] for b in bad] == list(range(11, 21))
    assert all("rows.parquet row" in b["detail"] and "row group 1 (rows 11-20) is corrupt"
               in b["detail"] for b in bad)


def test_a_deeply_nested_row_is_one_invalid_row(tmp_path):
    deep = b'{"id": "deep", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    deepish = _row("deepish", task={"domain": "x", "meta": json.loads("[" * 200 + "]" * 200)})
    src = _write(tmp_path / "r.jsonl", [_row("a"), deep, deepish, _row("b")])
    out = str(tmp_path / "out")
    rep = pipeline.curate(_positive(input=src, output=out))
    assert rep["input_rows"] == 4 and rep["buckets"] == {"kept": 2, "withheld": 0, "invalid": 2}
    bad = _lines(os.path.join(out, "invalid.jsonl"))
    assert [b["row"] for b in bad] == [2, 3]
    assert all("nests lists and objects more than 128 levels deep" in b["detail"] for b in bad)


def test_train_refuses_a_curated_folder_without_its_report(tmp_path):
    from rossjax.train.data import split_paths

    out = tmp_path / "out"
    pipeline.curate(_positive(input=_write(tmp_path / "r.jsonl", [_row("a")]), output=str(out)))
    assert split_paths(str(out), "data.train") == [str(out)]
    os.remove(out / "report.json")
    with pytest.raises(InputError, match=r"out holds no report.json, so it is not a complete "
                                         r"curated folder"):
        split_paths(str(out), "data.train")


def test_an_inner_stage_is_published_by_the_same_swap(tmp_path, monkeypatch):
    """The Beam runner stages in OUTPUT/.partial: publish moves it beside OUTPUT (over a stale
    stage a killed run left) and swaps, so its outputs are atomic too."""
    out, new_src, old_ids, new_ids = _setup(tmp_path)
    inner = os.path.join(out, ".partial")
    pipeline.curate(_positive(input=new_src, output=str(tmp_path / "elsewhere"),
                              examples_per_shard=3))
    os.rename(tmp_path / "elsewhere", inner)
    os.makedirs(out + ".partial/stale")
    swapped = []
    real = ledger._exchange
    monkeypatch.setattr(ledger, "_exchange", lambda a, b: (swapped.append((a, b)), real(a, b)))
    ledger.publish(inner, out)
    assert swapped == [(out + ".partial", out)]
    assert _state(out, old_ids, new_ids) == "new" and not os.path.exists(out + ".partial")
    assert open(os.path.join(out, "notes.txt")).read() == "mine"
    assert os.path.exists(os.path.join(out, "raw", "new.jsonl"))


# The first of two runs into one folder (issue 36, item 6): it stops after its first example
# until the parent says go, so the second run starts while the first is writing its stage.
PAUSED = r"""
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
from rossjax.curate import pipeline
from test_faults_input import _positive
src, out = sys.argv[2:4]
pipeline.compile_rows = lambda ready, compiler, workers: map(compiler, ready)  # no grain/jax import
real, paused = pipeline.ShardWriter.write, []
def write(self, blob):
    real(self, blob)
    if not paused:
        paused.append(1)
        print("writing", flush=True)
        sys.stdin.readline()
pipeline.ShardWriter.write = write
pipeline.curate(_positive(input=src, output=out, examples_per_shard=4))
"""


def _curate_argv(src, out):
    return ["curate", f"--config={os.path.join(REPO, 'configs', 'curate.py')}",
            f"--config.input={src}", f"--config.output={out}", "--config.rows=verifier_positive",
            "--config.mask_mode=eligible", "--config.verify=stored", "--config.progress=False"]


def test_two_curate_runs_into_one_folder_never_mix(tmp_path, capsys, monkeypatch):
    import socket

    from rossjax import cli

    first = _write(tmp_path / "first.jsonl", [_row(f"a{i}", str(i)) for i in range(12)])
    second = _write(tmp_path / "second.jsonl", [_row(f"b{i}", str(i)) for i in range(7)])
    out = str(tmp_path / "out")
    env = {**os.environ, "PYTHONPATH": REPO, "HF_HUB_OFFLINE": "1"}
    p = subprocess.Popen([sys.executable, "-c", PAUSED, REPO, first, out], env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == "writing", p.stderr.read()[-2000:]
        stage = os.listdir(out + ".partial")
        argv = _curate_argv(second, out)
        monkeypatch.setattr(sys, "argv", ["rossjax", *argv])  # ml-collections reads overrides there
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"rossjax curate: {out} is in use by `rossjax curate` (host "
                              f"{socket.gethostname()}, pid {p.pid}, started "), err
        assert os.listdir(out + ".partial") == stage  # the first run's stage was not touched
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.wait(120) == 0, p.stderr.read()[-2000:]
    finally:
        p.kill()
        p.communicate()
    assert _state(out, [f"a{i}" for i in range(12)], []) == "old"  # the first run's rows alone
    assert cli.main(argv) == 0  # the folder is free again once the first run ended
    assert _state(out, [], [f"b{i}" for i in range(7)]) == "new"


def _flip_middle(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(path, "wb").write(bytes(data))


def test_readers_open_exactly_the_shards_report_json_lists(tmp_path):
    import shutil

    from rossjax.curate.packing import length_census
    from rossjax.train.data import split_paths

    src = _write(tmp_path / "r.jsonl", [_row(f"r{i}", str(i)) for i in range(12)])
    out = tmp_path / "out"
    rep = pipeline.curate(_positive(input=src, output=str(out), examples_per_shard=4))
    names = [f"compiled-0000{i}.array_record" for i in range(3)]
    assert [s["path"] for s in rep["shards"]] == names
    for s in rep["shards"]:  # curate records each shard's size and whole-file sha256
        assert s["bytes"] == os.path.getsize(out / s["path"])
        assert s["sha256"] == ledger_sha(out / s["path"])

    def readers():  # training's first read of a folder, and the plain reader everything else uses
        split_paths(str(out), "data.train")
        length_census([str(out)], 64)
        return [ex["id"] for ex in read_compiled(str(out))]

    assert readers() == [f"r{i}" for i in range(12)]
    shutil.copy(out / names[0], out / "compiled-00003.array_record")  # another run's shard
    with pytest.raises(InputError, match=r"compiled-00003.array_record is not one of the 3 shards "
                                         r"its report.json lists"):
        readers()
    os.remove(out / "compiled-00003.array_record")
    os.rename(out / names[2], tmp_path / "away")
    with pytest.raises(InputError, match=r"compiled-00002.array_record is listed in its "
                                         r"report.json but missing"):
        readers()
    os.rename(tmp_path / "away", out / names[2])
    saved = (out / names[1]).read_bytes()
    _flip_middle(out / names[1])  # same name, same size, other bytes
    with pytest.raises(InputError, match=r"compiled-00001.array_record does not match the sha256 "
                                         r"its report.json records"):
        readers()
    (out / names[1]).write_bytes(saved)
    assert readers() == [f"r{i}" for i in range(12)]


def ledger_sha(path):
    import hashlib

    return hashlib.sha256(open(path, "rb").read()).hexdigest()
