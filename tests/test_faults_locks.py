"""Locks, records and manifests never follow links (issue 36, item 7): a planted symlink where
rossjax keeps a lock, a resume record, a report or a curate stage is refused in one sentence or
replaced, and the file it points to is never written; a checksum manifest refuses a listed file
that became a link."""

import json
import os

import pytest
from ml_collections import ConfigDict
from test_faults_input import _positive, _row, _write

from rossjax import runlock
from rossjax.errors import InputError

PRECIOUS = "the user's file, which no rossjax run may write\n"


def _planted(tmp_path, link):
    """A symlink at `link` pointing at a file that must stay as it is."""
    os.makedirs(tmp_path, exist_ok=True)
    target = tmp_path / "precious.txt"
    target.write_text(PRECIOUS)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(target, link)
    return target


def test_a_symlinked_run_lock_is_refused_and_its_target_never_written(tmp_path):
    work = tmp_path / "run"
    target = _planted(tmp_path, work / "run.lock")
    with pytest.raises(InputError) as e:
        runlock.acquire(str(work), "rossjax train")
    assert str(e.value) == (f"{work}/run.lock is a symbolic link (to {target}); rossjax never "
                            f"follows a link for a run lock, since it would write the file the "
                            f"link points to; remove the link.")
    assert target.read_text() == PRECIOUS
    os.remove(work / "run.lock")
    os.mkfifo(work / "run.lock")  # not a regular file either: refused, not blocked on
    with pytest.raises(InputError, match=r"run.lock is not a regular file"):
        runlock.acquire(str(work), "rossjax train")
    os.remove(work / "run.lock")
    runlock.acquire(str(work), "rossjax train").release()  # a plain lock file works as before


def test_train_with_a_symlinked_lock_is_one_sentence(tmp_path, capsys):
    from test_sft_loop import write_curated

    from rossjax import cli

    data = write_curated(tmp_path / "data", n=20)
    work = tmp_path / "run"
    target = _planted(tmp_path, work / "run.lock")
    argv = ["train", f"--config={os.path.dirname(__file__)}/../configs/ross_sft.py:runlocal",
            f"--config.data.train={data}", f"--workdir={work}"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("rossjax train: ") and "run.lock is a symbolic link" in err, err
    assert target.read_text() == PRECIOUS


def test_resume_and_workdir_records_never_write_through_a_link(tmp_path):
    from rossjax.train import resume, workdir

    work = tmp_path / "run"
    cfg = ConfigDict({"lr": 1.0, "resume_changes": ""})
    names = ("resume.json.tmp", "config.json", "config.py", "config.json.tmp")
    targets = [_planted(tmp_path / name, work / name) for name in names]
    resume.check(str(work), cfg, "train", resuming=False, data=[], data_field="data.train",
                 lead=True)
    workdir.save_config(str(work), cfg)
    assert [t.read_text() for t in targets] == [PRECIOUS] * len(names)
    assert json.load(open(work / "resume.json"))["config"]["lr"] == 1.0
    assert not os.path.islink(work / "config.json") and "ConfigDict" in open(work / "config.py").read()
    os.remove(work / "resume.json")
    target = _planted(tmp_path / "r", work / "resume.json")  # another run's record, linked in
    with pytest.raises(InputError, match=r"resume.json is a symbolic link .* remove the link"):
        resume.check(str(work), cfg, "train", resuming=True, data=[], data_field="data.train",
                     lead=True)
    assert target.read_text() == PRECIOUS


def test_a_report_is_never_written_through_a_link(tmp_path):
    from rossjax.curate.ledger import write_json

    target = _planted(tmp_path, tmp_path / "out" / "report.json.tmp")
    write_json(str(tmp_path / "out" / "report.json"), {"rows": 1})
    assert target.read_text() == PRECIOUS
    assert json.load(open(tmp_path / "out" / "report.json")) == {"rows": 1}


@pytest.mark.parametrize("folder", [".partial", ".previous"])
def test_a_symlinked_curate_stage_is_refused_and_its_target_kept(tmp_path, folder):
    from rossjax.curate import pipeline

    src = _write(tmp_path / "r.jsonl", [_row("a")])
    out = str(tmp_path / "out")
    pipeline.curate(_positive(input=src, output=out))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text(PRECIOUS)
    os.symlink(elsewhere, out + folder)
    with pytest.raises(InputError, match=rf"out{folder} is a symbolic link .*; rossjax never "
                                         rf"follows a link for its stage"):
        pipeline.curate(_positive(input=src, output=out))
    assert os.listdir(elsewhere) == ["keep.txt"] and (elsewhere / "keep.txt").read_text() == PRECIOUS
    assert not os.path.exists(os.path.join(out, "keep.txt"))


def test_a_manifest_refuses_a_listed_file_that_became_a_link(tmp_path):
    from rossjax import checksums

    root = tmp_path / "step"
    root.mkdir()
    (root / "a.bin").write_bytes(b"weights")
    files = checksums.digest_folder(root)
    (tmp_path / "copy.bin").write_bytes(b"weights")
    os.remove(root / "a.bin")
    os.symlink(tmp_path / "copy.bin", root / "a.bin")  # same bytes, but not the folder's own file
    with pytest.raises(checksums.ChecksumError, match=r"a.bin is a symbolic link, not the file "
                                                      r"its checksum manifest lists"):
        checksums.verify_folder(root, files, what="checkpoint step 1")
