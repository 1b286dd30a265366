"""Runs under faults (issue 18 items 4-7, issue 14 items 6, 7, 9): kill -9 then resume with
metrics rewound (no step twice), SIGHUP checkpoints as SIGTERM, a finished workdir says so,
read-only and full workdirs are one sentence before step 1, stale temporary checkpoints go,
the full config / plot / W&B / remote (gs://) workdir files, and custom GRPO reward functions."""

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest
from test_sft_loop import write_curated
from xla_flags import xla_flags

from rossjax import cli
from rossjax.errors import InputError
from rossjax.monitor import MetricsWriter, read_metrics, write_plot
from rossjax.train import workdir as workdir_lib
from rossjax.train.checkpoint import PreemptionGuard
from rossjax.train.rl.history import HistoryWriter, read_history

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")


# ---------------------------------------------------------------- helpers

def _events(path):
    """(step, what) of a TensorBoard event file: 'start' for a session start, else the tag."""
    from tensorboardX.proto import event_pb2

    out, data = [], open(path, "rb").read()
    i = 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
        i += 12 + n + 4
        if ev.HasField("session_log"):
            out.append((ev.step, "start"))
        for v in ev.summary.value:
            out.append((ev.step, v.tag))
    return out


@contextlib.contextmanager
def _mount(size: str, *opts):
    """A tmpfs of `size` (mount options `opts`, e.g. 'ro'), or None where mounting is not allowed."""
    import tempfile

    d = tempfile.mkdtemp(prefix="rossjax-tmpfs-")
    o = ",".join((f"size={size}",) + opts)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", o, "tmpfs", d],
                        capture_output=True).returncode == 0
    try:
        yield d if ok else None
    finally:
        if ok:
            subprocess.run(["umount", d], check=False)
        os.rmdir(d)


def _steps(work, split="train"):
    return [r["step"] for r in read_metrics(work, split)]


def _wait_for_step(proc, work, at_least, timeout=600):
    t0 = time.time()
    while time.time() - t0 < timeout:
        s = _steps(work)
        if s and s[-1] >= at_least:
            return s[-1]
        if proc.poll() is not None:
            raise AssertionError(proc.communicate()[0][-3000:])
        time.sleep(0.01)
    raise AssertionError("timed out")


def _cli_sub(*argv):
    return subprocess.Popen([sys.executable, "-m", "rossjax.cli", *argv], env=ENV, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _ckpt_steps(work):
    return sorted(int(s) for s in os.listdir(os.path.join(work, "checkpoints")) if s.isdigit())


# ---------------------------------------------------------------- monitor and workdir units

def test_metrics_rewind_to_the_restored_step_in_jsonl_and_tensorboard(tmp_path):
    w = MetricsWriter(str(tmp_path), resume_step=0)
    for s in range(1, 6):
        w.write(s, {"loss": 1.0 / s})
    w.close()
    w = MetricsWriter(str(tmp_path), resume_step=3)  # checkpoint 3 restored: 4 and 5 are redone
    for s in (4, 5):
        w.write(s, {"loss": 0.5})
    w.close()
    assert _steps(str(tmp_path)) == [1, 2, 3, 4, 5]
    assert [r["loss"] for r in read_metrics(str(tmp_path))][3:] == [0.5, 0.5]
    files = sorted((tmp_path / "tb").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    assert len(files) == 2
    # the second file starts with a session start at step 4: TensorBoard purges 4 and later
    ev = _events(files[1])
    assert ev[0] == (4, "start") and [s for s, t in ev[1:]] == [4, 5]
    png = write_plot(str(tmp_path), [("loss", ("train", "eval"))])
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_wandb_writer_only_when_asked_and_resumes_its_run(tmp_path, monkeypatch):
    calls = []

    class Run:
        def log(self, d, step):
            calls.append(("log", step, d))

        def finish(self):
            calls.append(("finish",))

    class Util:
        @staticmethod
        def generate_id():
            return "abc123"

    fake = type(sys)("wandb")
    fake.util = Util
    fake.init = lambda **kw: calls.append(("init", kw)) or Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    w = MetricsWriter(str(tmp_path), resume_step=0)  # not asked: wandb untouched
    w.write(1, {"loss": 2.0})
    w.close()
    assert calls == []
    for resume in (0, 1):
        w = MetricsWriter(str(tmp_path), resume_step=resume, wandb="proj", config={"a": {"b": 1}})
        w.write(resume + 1, {"loss": 1.5})
        w.close()
    inits = [c[1] for c in calls if c[0] == "init"]
    assert [(k["project"], k["id"], k["resume"]) for k in inits] == [("proj", "abc123", "allow")] * 2
    assert inits[0]["config"] == {"a": {"b": 1}}
    assert ("log", 2, {"train/loss": 1.5}) in calls and calls[-1] == ("finish",)


def test_remote_workdir_files_go_through_epath(tmp_path):
    """A gs:// workdir (epath's backend redirected to a local folder, no network): metrics,
    TensorBoard, history (cut back on resume) and the config land under the workdir."""
    from etils.epath import backend, testing

    local = lambda p: os.fspath(p).replace("gs://bucket", str(tmp_path))  # noqa: E731
    os_b = backend.os_backend

    def fn(name, two=False):
        def mock(_orig, path, *a, **k):
            if two:
                a = (local(a[0]),) + a[1:]
            return getattr(os_b, name)(local(path), *a, **k)
        return mock

    names = ("exists", "glob", "isdir", "listdir", "makedirs", "mkdir", "open", "remove",
             "rmtree", "stat", "walk")
    with testing.mock_epath(**{n: fn(n) for n in names}, copy=fn("copy", True),
                            rename=fn("rename", True), replace=fn("replace", True)):
        work = "gs://bucket/run"
        workdir_lib.check_writable(work, "grpo")
        w = MetricsWriter(work, resume_step=0)
        w.write(1, {"reward_mean": 0.25})
        w.close()
        h = HistoryWriter(work + "/history.jsonl")
        h.append([{"a": 1}])
        size = h.tell()
        h.append([{"a": 2}])
        h.close()
        h = HistoryWriter(work + "/history.jsonl", resume_bytes=size)
        h.close()
        import ml_collections

        workdir_lib.save_config(work, ml_collections.ConfigDict({"grpo": {"steps": 3}}))
        assert read_metrics(work)[0]["reward_mean"] == 0.25
        assert write_plot(work, [("reward_mean", ("train",))]) == work + "/metrics.png"
    assert read_history(str(tmp_path / "run" / "history.jsonl")) == [{"a": 1}]
    assert os.listdir(tmp_path / "run" / "tb") and (tmp_path / "run" / "metrics.png").exists()
    assert json.load(open(tmp_path / "run" / "config.json")) == {"grpo": {"steps": 3}}


def test_saved_config_reads_back_with_overrides(tmp_path):
    from rossjax.cli.flags import parse_config

    over = ["--config.train.num_steps=7", "--config.data.train=/x,/y", "--config.log.wandb=p"]
    cfg, _, _ = parse_config([f"--config={ROOT}/configs/ross_sft.py:runlocal", *over])
    workdir_lib.save_config(str(tmp_path), cfg)
    back, _, _ = parse_config([f"--config={tmp_path}/config.py"])
    assert back.to_dict() == cfg.to_dict() and back.train.num_steps == 7
    assert json.load(open(tmp_path / "config.json"))["log"]["wandb"] == "p"


def test_stale_temporary_checkpoints_are_removed(tmp_path):
    ck = tmp_path / "checkpoints"
    (ck / "5").mkdir(parents=True)
    (ck / "10.orbax-checkpoint-tmp-1733011200").mkdir()
    (ck / "10.orbax-checkpoint-tmp-1733011200" / "state").mkdir()
    assert workdir_lib.clean_stale(ck) == ["10.orbax-checkpoint-tmp-1733011200"]
    assert os.listdir(ck) == ["5"]


def test_free_space_check(tmp_path, capsys):
    with pytest.raises(InputError, match=r"has 0\.5 MiB free but one checkpoint .* about 1\.0 MiB"):
        workdir_lib.check_free_space(str(tmp_path), 2**20, 3, "train", free=2**19)
    workdir_lib.check_free_space(str(tmp_path), 2**20, 3, "train", free=2 * 2**20)
    assert "less than the 4 checkpoints" in capsys.readouterr().err
    workdir_lib.check_free_space("gs://b/run", 2**40, 3, "train", free=0)  # remote: not checked


def test_preemption_guard_takes_sighup_as_sigterm():
    for sig in (signal.SIGHUP, signal.SIGTERM):
        before = signal.getsignal(sig)  # SIG_IGN for SIGHUP under nohup
        with PreemptionGuard() as g:
            assert signal.getsignal(sig) != before
            os.kill(os.getpid(), sig)
            time.sleep(0.05)
            assert g.requested and g.signal_name == signal.Signals(sig).name
        assert signal.getsignal(sig) == before  # the handler it found is put back


# ---------------------------------------------------------------- unwritable and full workdirs

def _train_argv(data, work, *extra):
    # seq_len 128: this module's rows are short (runlocal's 1,280 fits the shipped sample)
    return ["train", f"--config={ROOT}/configs/ross_sft.py:runlocal", f"--config.data.train={data}",
            f"--workdir={work}", "--config.data.seq_len=128", *extra]


def test_read_only_and_full_workdirs_are_one_sentence(tmp_path, capsys, monkeypatch):
    data = write_curated(tmp_path / "data", n=40)
    with _mount("256k", "ro") as ro:
        if ro is None:  # no mounting here: a folder this user may not write (not for root)
            ro = str(tmp_path / "ro")
            os.makedirs(ro)
            os.chmod(ro, 0o500)
            if os.access(ro, os.W_OK):
                pytest.skip("cannot make a read-only folder here")
        assert cli.main(_train_argv(data, os.path.join(ro, "run"))) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("rossjax train: --workdir ") and "is not writable" in err[-1]
        assert "Traceback" not in "\n".join(err)
    with _mount("256k") as small:  # ~1.1 MiB of tiny_qwen2 params + Adam moments: does not fit
        if small is None:
            small = str(tmp_path / "small")
            real = workdir_lib.check_free_space
            monkeypatch.setattr(workdir_lib, "check_free_space",
                                lambda *a, **k: real(*a, **{**k, "free": 256 * 1024}))
        work = os.path.join(small, "run")
        assert cli.main(_train_argv(data, work)) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "free but one checkpoint of this run takes about" in err, err
        assert not os.path.exists(os.path.join(work, "metrics.jsonl"))  # before step 1


# ---------------------------------------------------------------- kill -9, SIGHUP, finished runs

@pytest.mark.slow
def test_train_kill9_sighup_resume_and_finished_workdir(tmp_path):
    data = write_curated(tmp_path / "data", n=200)
    work = str(tmp_path / "run")
    argv = _train_argv(data, work, "--config.train.num_steps=12", "--config.train.epochs=3",
                       "--config.checkpoint.save_every=5", "--config.train.eval_every=-1")
    p = _cli_sub(*argv, "--config.train.debug_kill_at_step=7")  # checkpoint 5, metrics to 7
    out = p.communicate(timeout=600)[0]
    assert p.returncode == -9, out[-3000:]
    assert _ckpt_steps(work) == [5] and _steps(work) == list(range(1, 8))
    # a temporary folder of a save the kill interrupted is removed on the next start
    os.makedirs(os.path.join(work, "checkpoints", "10.orbax-checkpoint-tmp-1"))
    p = _cli_sub(*argv)
    hup = _wait_for_step(p, work, 8)
    p.send_signal(signal.SIGHUP)
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0, out[-3000:]
    assert "from step 5" in out and "removed 1 unfinished checkpoint" in out
    stopped = max(_ckpt_steps(work))
    assert f"SIGHUP at step {stopped}; checkpoint saved" in out and hup <= stopped < 12
    assert _steps(work) == list(range(1, stopped + 1))  # 6 and 7 redone, not recorded twice
    p = _cli_sub(*argv)
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0 and f"from step {stopped}" in out, out[-3000:]
    assert _steps(work) == list(range(1, 13))
    assert len(os.listdir(os.path.join(work, "tb"))) == 3
    assert open(os.path.join(work, "metrics.png"), "rb").read(4) == b"\x89PNG"
    saved = json.load(open(os.path.join(work, "config.json")))
    assert saved["train"]["num_steps"] == 12 and saved["data"]["train"] == data
    p = _cli_sub(*argv)  # finished: said so, nothing trained, nothing rewritten
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0 and "is already complete (checkpoint at step 12" in out, out[-3000:]
    assert _steps(work) == list(range(1, 13))


@pytest.mark.slow
def test_train_eval_row_of_a_checkpointed_step_survives_a_kill_after_its_save(tmp_path):
    # Step 2 is both an eval and a checkpoint step; the kill comes right after its save, so a
    # resume starts past step 2 and its eval row must already be on disk.
    data = write_curated(tmp_path / "data", n=40)
    work = str(tmp_path / "run")
    argv = _train_argv(data, work, f"--config.data.eval={data}", "--config.train.num_steps=4",
                       "--config.checkpoint.save_every=2", "--config.train.eval_every=2")
    p = _cli_sub(*argv, "--config.train.debug_kill_at_step=2")
    out = p.communicate(timeout=600)[0]
    assert p.returncode == -9 and _ckpt_steps(work) == [2], out[-3000:]
    assert _steps(work, "eval") == [2]
    p = _cli_sub(*argv)
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0 and "from step 2" in out, out[-3000:]
    assert _steps(work) == [1, 2, 3, 4] and _steps(work, "eval") == [2, 4]


# 4 x 4 candidates a step, pinned (the assertions count 16 history rows a step).
GRPO = ["grpo", "--config=configs/grpo_verifier.py:runlocal", "--config.grpo.max_new_tokens=8",
        "--config.grpo.contexts=4", "--config.grpo.group_size=4",
        "--config.data.tasks=gen:contains", "--config.reward.functions=('contains',)",
        "--config.reward.weights=(1.0,)", "--config.reward.workers=0",
        "--config.checkpoint.async_save=False", "--config.sample_every=1"]


@pytest.mark.slow
def test_grpo_kill9_resume_and_finished_workdir(tmp_path):
    work = str(tmp_path / "run")
    argv = [*GRPO, f"--workdir={work}", "--config.grpo.steps=8", "--config.checkpoint.save_every=3"]
    p = _cli_sub(*argv)
    seen = _wait_for_step(p, work, 4)
    p.kill()  # SIGKILL between checkpoints 3 and 6
    p.communicate(timeout=60)
    ck = max(_ckpt_steps(work))
    assert p.returncode == -9 and seen > ck == 3
    p = _cli_sub(*argv)
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0 and "from step 3" in out, out[-3000:]
    assert _steps(work) == list(range(1, 9))
    samples = [json.loads(x)["step"] for x in open(os.path.join(work, "samples.jsonl"))]
    assert sorted(set(samples)) == samples[::len(samples) // 8] == list(range(1, 9))
    hist = read_history(os.path.join(work, "history.jsonl"))
    assert [r["source"]["step"] for r in hist[::16]] == list(range(8)) and len(hist) == 8 * 16
    assert os.path.exists(os.path.join(work, "metrics.png"))
    assert json.load(open(os.path.join(work, "config.json")))["grpo"]["steps"] == 8
    p = _cli_sub(*argv)
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0, out[-3000:]
    assert "is already complete (checkpoint at step 8, the run's last step" in out and "nan" not in out


# ---------------------------------------------------------------- custom reward functions

def test_grpo_custom_reward_fn_runs_on_the_workers(tmp_path, monkeypatch):
    from test_grpo import tiny_config

    from rossjax.train.rl import grpo

    mod = tmp_path / "mods"
    mod.mkdir()
    (mod / "my_reward.py").write_text(
        "import os\n"
        "def score(prompt, completion, task):\n"
        "    open(os.environ['PIDS'], 'a').write(f'{os.getpid()}\\n')\n"
        "    return len(completion) % 3 + (0.5 if task['reference'] in prompt else 0.0)\n")
    monkeypatch.syspath_prepend(str(mod))
    monkeypatch.setenv("PYTHONPATH", f"{mod}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("PIDS", str(tmp_path / "pids"))
    c = tiny_config(steps=1)
    c.reward.fn, c.reward.workers = "my_reward:score", 1
    out = grpo.run(c, str(tmp_path / "run"))
    assert tuple(c.reward.functions) == ("fn",)  # set alone: the run's reward
    import my_reward

    hist = read_history(out["history"])
    assert len(hist) == 16
    for r in hist:
        want = my_reward.score(r["messages"][-2]["content"], r["messages"][-1]["content"], r["task"])
        assert r["rewards"]["fn"] == r["reward"] == want
    pids = set(open(tmp_path / "pids").read().split())
    # the run scored in its worker process; the check above added this process's pid
    assert str(os.getpid()) in pids and len(pids) == 2

    c = tiny_config(steps=1)
    c.reward.fn = "my_reward:nope"
    with pytest.raises(InputError, match=r"config.reward.fn 'my_reward:nope': my_reward has no "):
        grpo.run(c, str(tmp_path / "bad"))
    c.reward.fn = "no_such_module_x:score"
    with pytest.raises(InputError, match="cannot be imported"):
        grpo.run(c, str(tmp_path / "bad"))


# ---------------------------------------------------------------- runs never mix (issue 22 item 4)

HOLD = ("import sys\nfrom rossjax import runlock\n"
        "lock = runlock.acquire(sys.argv[1], 'rossjax train')\n"
        "print('locked', flush=True)\nsys.stdin.read()\n")  # holds the lock until killed


def _holder(folder):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, env=ENV, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_a_locked_workdir_refuses_a_second_run_and_a_dead_holders_lock_is_taken_over(tmp_path, capsys):
    import io
    import socket

    from rossjax import runlock

    work = tmp_path / "run"
    p = _holder(work)
    body = json.load(open(work / "run.lock"))
    assert (body["host"], body["pid"], body["command"]) == (socket.gethostname(), p.pid, "rossjax train")
    with pytest.raises(runlock.LockHeld) as e:
        runlock.acquire(str(work), "rossjax grpo")
    assert f"host {socket.gethostname()}, pid {p.pid}, started {body['started']}" in str(e.value)
    # a live run's unfinished save must survive the second run's start (stale folders are removed
    # only once the lock is held)
    tmp_save = work / "checkpoints" / "10.orbax-checkpoint-tmp-1"
    tmp_save.mkdir(parents=True)
    data = write_curated(tmp_path / "data", n=40)
    assert cli.main(_train_argv(data, str(work))) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"rossjax train: {work} is in use by `rossjax train` (host ") and f"pid {p.pid}," in err
    assert tmp_save.exists() and sorted(os.listdir(work)) == ["checkpoints", "run.lock"]
    p.kill()  # SIGKILL: the holder never releases; the kernel drops its flock
    p.wait()
    log = io.StringIO()
    lock = runlock.acquire(str(work), "rossjax train", log=log)
    note = log.getvalue().strip()
    assert note.startswith(f"rossjax train: note: took over the lock of {work} from `rossjax train`")
    assert f"pid {p.pid}," in note and "ended without releasing it (killed or crashed)." in note
    assert json.load(open(work / "run.lock"))["pid"] == os.getpid()
    lock.release()
    log = io.StringIO()
    runlock.acquire(str(work), "rossjax train", log=log).release()
    assert log.getvalue() == ""  # released cleanly: nothing to take over
    assert runlock.acquire("gs://bucket/run", "rossjax train", log=log) is None
    assert "not locked against a second run" in log.getvalue()
    (work / "run.lock").write_text('{"host": "h", "pi')  # a body cut short by a crash
    log = io.StringIO()
    runlock.acquire(str(work), "rossjax train", log=log).release()
    assert "from `an unknown run (its lock file is unreadable)`" in log.getvalue()


def test_data_fingerprint_names_what_changed(tmp_path):
    import shutil

    from rossjax.train import resume

    d = write_curated(tmp_path / "a", n=10)
    (tmp_path / "a" / "report.json").write_text('{"kept": 10, "elapsed_s": 1.5, "rows_per_s": 6.7}')
    before = resume.curated_fingerprint([d])
    (tmp_path / "a" / "report.json").write_text('{"elapsed_s": 2.0, "kept": 10, "rows_per_s": 5}')
    assert resume.curated_fingerprint([d]) == before  # a re-curate of the same rows: only timing differs
    shutil.copytree(d, tmp_path / "moved")
    assert resume._data_changes(before, resume.curated_fingerprint([str(tmp_path / "moved")])) == []
    (tmp_path / "a" / "report.json").write_text('{"kept": 11}')
    shutil.copy(os.path.join(d, "compiled-00000.array_record"), os.path.join(d, "compiled-00001.array_record"))
    changes = resume._data_changes(before, resume.curated_fingerprint([d]))
    assert changes[0].startswith(f"{d}: report.json ") and changes[1] == f"{d}: shard compiled-00001.array_record is new"
    assert resume._data_changes(before, before + before) == ["1 training path(s) then, 2 now"]
    nan = float("nan")
    assert resume.changed_fields({"a": {"x": nan, "y": [1, 2]}}, {"a": {"x": nan, "y": [1, 3], "z": 0}}) == [
        ("a.y", [1, 2], [1, 3]), ("a.z", "(not set)", 0)]


def _big_shard(out, seed=0):
    """A curated dir with one shard of ~5 MiB (more than the first and last MiB), its report
    listing it without a hash (as the Beam runner, mix and older curates write it)."""
    import numpy as np
    from array_record.python.array_record_module import ArrayRecordWriter

    from rossjax.curate.compiled import encode_example

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = ArrayRecordWriter(os.path.join(out, "compiled-00000.array_record"), "group_size:1")
    for i in range(40):
        ones = np.ones(20000, np.uint8)  # random 31-bit ids: the shard compresses to little
        w.write(encode_example({"id": f"ex{i}", "input_ids": rng.integers(0, 2**31 - 1, 20000),
                                "loss_mask": ones, "eligible_mask": ones}))
    w.close()
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump({"shards": [{"path": "compiled-00000.array_record", "examples": 40}]}, f)
    return str(out)


def test_a_shard_whose_middle_bytes_change_is_not_resumed_silently(tmp_path):
    """Issue 36, item 7: the fingerprint hashes whole shards (curate's recorded sha256, else the
    whole file), so other bytes of the same size are other data."""
    from ml_collections import ConfigDict

    from rossjax.curate import pipeline
    from rossjax.train import resume

    d = _big_shard(tmp_path / "a")
    shard = os.path.join(d, "compiled-00000.array_record")
    before = resume.curated_fingerprint([d])
    size = os.path.getsize(shard)
    assert size > 3 << 20
    data = bytearray(open(shard, "rb").read())
    data[size // 2] ^= 0x01  # inside an example's tokens: neither the first nor the last MiB
    open(shard, "wb").write(bytes(data))
    assert os.path.getsize(shard) == size
    assert resume._data_changes(before, resume.curated_fingerprint([d])) == [
        f"{d}: shard compiled-00000.array_record holds other bytes"]
    # a record written before whole-shard hashes (first and last MiB) still resumes its data
    work = tmp_path / "run"
    work.mkdir()
    cfg = ConfigDict({"lr": 1.0, "resume_changes": ""})
    now = resume.curated_fingerprint([d])
    legacy = [{"path": now[0]["path"], "report_sha256": now[0]["report_sha256"],
               "shards": {"compiled-00000.array_record": [size, resume._ends_sha256(shard)]}}]
    (work / "resume.json").write_text(json.dumps({"config": cfg.to_dict(), "data": legacy}))
    resume.check(str(work), cfg, "train", resuming=True, data=now, data_field="data.train", lead=True)
    # a folder curate wrote: the fingerprint is the sha256 curate recorded while writing
    from test_faults_input import _positive, _row, _write

    out = str(tmp_path / "cur")
    rep = pipeline.curate(_positive(input=_write(tmp_path / "r.jsonl", [_row("x")]), output=out))
    fp = resume.curated_fingerprint([out])[0]
    assert fp["shards"] == {s["path"]: [s["bytes"], s["sha256"]] for s in rep["shards"]}


def test_two_trainers_on_one_workdir_never_write_the_same_steps(tmp_path, capsys):
    data = write_curated(tmp_path / "data", n=200)
    work = str(tmp_path / "run")
    argv = _train_argv(data, work, "--config.train.num_steps=20", "--config.checkpoint.save_every=1")
    p = _cli_sub(*argv)
    _wait_for_step(p, work, 1)
    os.kill(p.pid, signal.SIGSTOP)  # the first trainer, frozen mid-run, still holds the workdir
    try:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "is in use by `rossjax train` (host " in err and f"pid {p.pid}," in err, err
    finally:
        p.kill()
        p.communicate(timeout=60)
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert f"took over the lock of {work} from `rossjax train`" in err and f"pid {p.pid}," in err
    assert _steps(work) == list(range(1, 21))  # each step once: the runs did not interleave


def _flip(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(path, "wb").write(bytes(data))


def _largest_array_file(step_dir):
    files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs
             if os.sep + "d" + os.sep in os.path.join(r, f) or r.endswith(os.sep + "d")]
    return max(files, key=os.path.getsize)


@pytest.mark.slow
def test_resume_refuses_another_config_or_other_data_unless_accepted(tmp_path, capsys):
    data = write_curated(tmp_path / "data", n=40)
    work = str(tmp_path / "run")
    argv = _train_argv(data, work, "--config.checkpoint.save_every=1")
    assert cli.main([*argv, "--config.train.num_steps=2"]) == 0
    record = open(os.path.join(work, "resume.json")).read()
    capsys.readouterr()
    more = [*argv, "--config.train.num_steps=3"]
    assert cli.main([*more, "--config.optim.peak_lr=0.002", "--config.data.shuffle=False"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"rossjax train: --workdir {work} holds checkpoints of another run: its config "
                   f"differs in data.shuffle (true -> false), optim.peak_lr (0.001 -> 0.002); "
                   f"resuming would mix the two. Give a new --workdir, or accept the changes with "
                   f"--config.resume_changes=data.shuffle,optim.peak_lr."), err
    assert cli.main([*more, "--config.resume_changes=optim.peak_lr,optim.nope"]) == 2
    assert "config.resume_changes names 'optim.nope', which is not a field" in capsys.readouterr().err
    write_curated(tmp_path / "data", n=48, seed=1)  # re-curated in place: other rows, same path
    assert cli.main(more) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "its training data (data.train) differs: " in err and "compiled-00000.array_record" in err
    assert err.endswith("--config.resume_changes=data.train.")
    assert _steps(work) == [1, 2] and open(os.path.join(work, "resume.json")).read() == record
    # accepted: logged on stderr and in resume.json; the run's length and save interval are free
    assert cli.main([*more, "--config.optim.peak_lr=0.002", "--config.resume_changes=data.train,optim",
                     "--config.checkpoint.save_every=3"]) == 0
    err = capsys.readouterr().err
    assert "note: resuming with changes accepted by --config.resume_changes: optim.peak_lr (0.001 -> 0.002), data.train data (" in err
    assert "note: train.num_steps changed 2 -> 3 on resume" in err and "checkpoint.save_every (1 -> 3)" in err
    assert "from step 2" in err and _steps(work) == [1, 2, 3]
    rec = json.load(open(os.path.join(work, "resume.json")))
    assert rec["accepted"][0]["fields"] == {"optim.peak_lr": [0.001, 0.002]} and rec["accepted"][0]["data"]
    assert rec["config"]["resume_changes"] == "" and rec["config"]["optim"]["peak_lr"] == 0.002
    assert json.load(open(os.path.join(work, "config.json")))["resume_changes"] == ""


@pytest.mark.slow
def test_a_bit_flipped_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    data = write_curated(tmp_path / "data", n=80)
    work = str(tmp_path / "run")
    argv = _train_argv(data, work, "--config.checkpoint.save_every=2")
    assert cli.main([*argv, "--config.train.num_steps=4"]) == 0
    assert _ckpt_steps(work) == [2, 4]
    flipped = _largest_array_file(os.path.join(work, "checkpoints", "4"))
    _flip(flipped)  # a real bit flip in the saved weights (today: trains on NaN, exit 0)
    capsys.readouterr()
    assert cli.main([*argv, "--config.train.num_steps=6"]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "is damaged" in x)
    assert line.startswith(f"rossjax train: checkpoint step 4 of {work}/checkpoints is damaged: ")
    assert os.path.basename(flipped) in line and line.endswith("and falling back to step 2.")
    assert "from step 2" in err
    rows = read_metrics(work)
    assert [r["step"] for r in rows] == list(range(1, 7)) and all(r["loss"] < 10 for r in rows)
    assert os.listdir(os.path.join(work, "bad-checkpoints"))[0].startswith("4-")
    assert _ckpt_steps(work) == [2, 4, 6]  # 4 was trained again and saved again
    # A step written wrong before its checksums (finite weights, ~1e30: every norm overflows):
    # its first resumed step is non-finite, so it is set aside and the run stops; a rerun
    # resumes from the step before it.
    _rewrite_step(os.path.join(work, "checkpoints"), 6, lambda x: x * 1e30)
    assert cli.main([*argv, "--config.train.num_steps=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("rossjax train: the first step after resuming from checkpoint step 6 gave a "
                   "non-finite loss, so that checkpoint is damaged; it was moved to "
                   f"{work}/bad-checkpoints/{_newest(work, '6-')}; rerun `rossjax train` with the "
                   "same --workdir to resume from step 4."), err
    assert _ckpt_steps(work) == [2, 4] and _steps(work) == list(range(1, 7))
    for step in _ckpt_steps(work):  # every checkpoint damaged: one sentence, not a fresh start
        _flip(_largest_array_file(os.path.join(work, "checkpoints", str(step))))
    assert cli.main([*argv, "--config.train.num_steps=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"rossjax train: no checkpoint in {work}/checkpoints can be resumed (steps "
                          f"4, 2 are damaged and were moved to {work}/bad-checkpoints)"), err
    assert _steps(work) == list(range(1, 7)) and _ckpt_steps(work) == []


def _newest(work, prefix):
    return sorted(n for n in os.listdir(os.path.join(work, "bad-checkpoints")) if n.startswith(prefix))[-1]


def _rewrite_step(ckpt_dir, step, fn):
    """Replace checkpoint `step` by one whose float params are fn(params), saved and sealed as
    rossjax saves any step (so its checksums agree with the altered weights)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    from rossjax.train import checkpoint as ckpt_lib

    ck = ckpt_lib.Checkpointer(ckpt_dir, save_every=1, keep=10)
    raw = ck._mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                         data=ocp.args.JsonRestore()))
    state = dict(raw["state"])
    state["params"] = jax.tree.map(lambda x: fn(x) if np.issubdtype(x.dtype, np.floating) else x,
                                   state["params"])
    ck._mngr.delete(step)
    assert ck.save(step, state, ckpt_lib.decode_data_state(raw["data"]), force=True)
    ck.close()


def test_activation_store_checksums_and_lock(tmp_path):
    import jax

    from rossjax.models import get_preset, init_params
    from rossjax.probes import store as S
    from rossjax.runlock import LockHeld

    cfg = get_preset("tiny_qwen2")
    params = init_params(cfg, jax.random.PRNGKey(0))
    out = tmp_path / "acts"
    p = _holder(out)
    try:
        with pytest.raises(LockHeld, match=f"pid {p.pid},"):
            S.write_store(str(out), cfg, params, ["a", "b"], [[1, 2], [3]], (1,), progress=False)
    finally:
        p.kill()
        p.wait()
    man = S.write_store(str(out), cfg, params, ["a", "b"], [[1, 2], [3]], (1,), progress=False)
    assert "ids.json" in man["files"] and any(k.startswith("activations.zarr/") for k in man["files"])
    S.open_store(str(out)).read()
    chunk = max((k for k in man["files"] if k.startswith("activations.zarr/")),
                key=lambda k: man["files"][k][0])
    _flip(out / chunk)
    with pytest.raises(InputError) as e:
        S.open_store(str(out))
    assert str(e.value) == (f"activation store {out}: {out / chunk} does not match its sha256 in the "
                            f"checksum manifest (the file changed on disk after it was written).")
    os.truncate(out / chunk, 3)
    with pytest.raises(InputError, match=r"has 3 bytes but its checksum manifest says \d+; the file is truncated"):
        S.open_store(str(out))


@pytest.mark.slow
def test_grpo_resume_refuses_another_config_or_task_file(tmp_path):
    from test_grpo import tiny_config

    from rossjax.train import resume
    from rossjax.train.rl import grpo

    tasks = tmp_path / "tasks.jsonl"
    rows = [{"id": f"t{i}", "domain": "contains", "prompt": f"Write the letter {c}.", "reference": c}
            for i, c in enumerate("abcd")]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    work = str(tmp_path / "run")

    def config(**over):
        c = tiny_config(steps=1)
        c.data.tasks, c.checkpoint.save_every = str(tasks), 1
        for k, v in over.items():
            setattr(c.grpo, k, v)
        return c

    assert grpo.run(config(), work)["metrics"]
    with pytest.raises(resume.ResumeRefused, match=r"differs in grpo.temperature \(1.0 -> 0.7\); .*"
                                                    r"--config.resume_changes=grpo.temperature\.$"):
        grpo.run(config(steps=2, temperature=0.7), work)
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows[::-1]))  # other task order
    with pytest.raises(resume.ResumeRefused, match=r"its training data \(data.tasks\) differs: "
                                                    rf"{tasks}: sha256 "):
        grpo.run(config(steps=2), work)
    c = config(steps=2)
    c.resume_changes = "data.tasks"
    grpo.run(c, work)  # accepted; the ASCII model's filled-in vocab_size is no change
    assert _steps(work) == [1, 2]
    assert json.load(open(os.path.join(work, "resume.json")))["accepted"][0]["data"]


# ---------------------------------------------------------------- Ctrl-C saves (issue 42 item 1)

def train_signalled_at_step_2(tmp_path, sig):
    """A 40-step train run (no save before the end) sent `sig` once step 2 is logged:
    (process, workdir, argv, its output, the step seen)."""
    data = write_curated(tmp_path / "data", n=200)
    work = str(tmp_path / "run")
    argv = _train_argv(data, work, "--config.train.num_steps=40", "--config.train.epochs=3",
                       "--config.checkpoint.save_every=100", "--config.train.eval_every=-1")
    p = _cli_sub(*argv)
    seen = _wait_for_step(p, work, 2)
    p.send_signal(sig)
    return p, work, argv, p.communicate(timeout=300)[0], seen


@pytest.mark.slow  # two trainer processes, each compiling its step
def test_train_ctrl_c_saves_exits_130_and_the_printed_command_resumes(tmp_path):
    """The first Ctrl-C (SIGINT) finishes the step in progress, saves it and exits 130 with no
    traceback; the last line names the step and the command that resumes, which completes."""
    import shlex

    p, work, argv, out, seen = train_signalled_at_step_2(tmp_path, signal.SIGINT)
    assert p.returncode == 130 and "Traceback" not in out, out[-3000:]
    saved = _ckpt_steps(work)
    assert len(saved) == 1 and seen <= saved[0] < 40, (saved, out[-2000:])
    at = saved[0]  # save_every=100: only the Ctrl-C can have written this checkpoint
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"rossjax train: stopped early at step {at} of 40 (SIGINT; loss "), last
    cmd = shlex.split(last.split("Resume with: ", 1)[1])
    assert cmd == ["rossjax", *argv], last
    p = _cli_sub(*cmd[1:])
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 0 and f"from step {at}" in out, out[-3000:]
    assert _steps(work) == list(range(1, 41))


def test_grpo_stopped_by_a_signal_says_so_and_how_to_resume(tmp_path, monkeypatch, capsys):
    """After SIGTERM GRPO's last line says it stopped early at step N, not 'done in', and names
    the command that resumes it; that command completes the run."""
    import shlex

    from rossjax.train.rl import grpo

    work = str(tmp_path / "run")
    argv = [f"--config={ROOT}/configs/grpo_verifier.py:runlocal", *GRPO[2:],
            f"--workdir={work}", "--config.grpo.steps=3"]
    real = grpo.GRPOTrainer.train_step

    def preempted(self, step):  # SIGTERM arrives during step 1
        if step == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, step)

    monkeypatch.setattr(grpo.GRPOTrainer, "train_step", preempted)
    assert cli.main(["grpo", *argv]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("rossjax grpo: stopped early at step 1 of 3 (SIGTERM; "), out
    assert _ckpt_steps(work) == [1] and "done in" not in "\n".join(out)
    cmd = shlex.split(out[-1].split("Resume with: ", 1)[1])
    assert cmd == ["rossjax", "grpo", *argv]
    monkeypatch.undo()
    assert cli.main(cmd[1:]) == 0 and _steps(work) == [1, 2, 3]
    assert "rossjax grpo: done in" in capsys.readouterr().out
