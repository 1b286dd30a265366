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

from rossjax import cli
from rossjax.errors import InputError
from rossjax.monitor import MetricsWriter, read_metrics, write_plot
from rossjax.train import workdir as workdir_lib
from rossjax.train.checkpoint import PreemptionGuard
from rossjax.train.history import HistoryWriter, read_history

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")


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
        with PreemptionGuard() as g:
            os.kill(os.getpid(), sig)
            time.sleep(0.05)
            assert g.requested and g.signal_name == signal.Signals(sig).name
        assert signal.getsignal(sig) == signal.SIG_DFL


# ---------------------------------------------------------------- unwritable and full workdirs

def _train_argv(data, work, *extra):
    return ["train", f"--config={ROOT}/configs/ross_sft.py:runlocal", f"--config.data.train={data}",
            f"--workdir={work}", *extra]


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


GRPO = ["grpo", "--config=configs/grpo_verifier.py:runlocal", "--config.grpo.max_new_tokens=8",
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

    from rossjax.train import grpo

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
