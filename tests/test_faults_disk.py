"""Unwritable and full disks as root (issue 30 part 2): root ignores permission bits, so a
read-only or tiny tmpfs (mounted here: CI runs as root too) is what makes these branches run."""

import os

import jax
import pytest
from test_faults_runs import _mount

from rossjax.errors import InputError
from rossjax.models import get_preset, init_params
from rossjax.probes import store as S


@pytest.fixture(scope="module")
def model():
    cfg = get_preset("tiny_qwen2")
    return cfg, init_params(cfg, jax.random.PRNGKey(0))


def _need(mounted):
    """As root (CI) a mount that fails is a failure, never a skip; elsewhere a skip."""
    if mounted is None:
        if os.geteuid() == 0:
            pytest.fail("root could not mount a tmpfs")
        pytest.skip("mounting a tmpfs needs root")


def test_activation_store_on_a_read_only_mount_is_one_sentence(model):
    cfg, params = model
    with _mount("256k", "ro") as ro:
        _need(ro)
        out = os.path.join(ro, "store")
        with pytest.raises(InputError) as e:
            S.write_store(out, cfg, params, ["a"], [[1, 2, 3]], (1,), progress=False)
        assert str(e.value) == (f"{out}: the activation store directory is not writable "
                                f"(Read-only file system).")
        assert os.listdir(ro) == []


def test_activation_store_in_a_full_directory_is_one_sentence(model):
    cfg, params = model
    with _mount("16k") as small:  # smaller than one row of 2 layers x d_model float32s + manifest
        _need(small)
        out = os.path.join(small, "store")
        ids = [f"r{i}" for i in range(64)]
        with pytest.raises(InputError, match=r"needs .* bytes but the disk has .* free"):
            S.write_store(out, cfg, params, ids, [[1, 2, 3]] * 64, (1, 2), progress=False)


@pytest.mark.slow  # two trainer processes, each compiling its step
def test_a_disk_that_fills_during_a_run_keeps_the_last_checkpoint_and_resumes_with_room(tmp_path):
    """docs/failures.md 'a disk that fills during the run': the save fails with orbax's error,
    the last finished checkpoint is intact and resumes once there is room (the tmpfs regrown)."""
    import subprocess

    from test_faults_runs import _ckpt_steps, _cli_sub, _steps, _train_argv
    from test_sft_loop import write_curated

    data = write_curated(tmp_path / "data", n=80)
    # 3 MiB: passes the one-checkpoint check before step 1 (~1.1 MiB each), fills at the 3rd save
    with _mount("3m") as small:
        _need(small)
        work = os.path.join(small, "run")
        argv = _train_argv(data, work, "--config.train.num_steps=6", "--config.train.epochs=10",
                           "--config.checkpoint.save_every=1", "--config.train.eval_every=-1")
        p = _cli_sub(*argv)
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 1 and "RESOURCE_EXHAUSTED" in out, out[-3000:]
        done = _ckpt_steps(work)
        assert done and done == list(range(1, done[-1] + 1)) and done[-1] < 6, done
        subprocess.run(["mount", "-o", "remount,size=64m", small], check=True)  # room again
        p = _cli_sub(*argv)
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 0 and f"from step {done[-1]}" in out, out[-3000:]
        assert "removed 1 unfinished checkpoint" in out, out[-3000:]
        assert _steps(work) == [1, 2, 3, 4, 5, 6]


_KILL_IN_SAVE = """
import os, signal, sys
from orbax.checkpoint._src.path import atomicity as A
for cls in (A.AtomicRenameTemporaryPath, A.CommitFileTemporaryPath):
    def finalize(self, *a, _orig=cls.finalize, **k):
        # step 4's files are written, its commit (rename / commit file) not yet: lose the host
        if "/4.orbax-checkpoint-tmp" in str(self.get()):
            os.kill(os.getpid(), signal.SIGKILL)
        return _orig(self, *a, **k)
    cls.finalize = finalize
from rossjax.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # two trainer processes, each compiling its step
def test_a_kill_inside_an_in_flight_save_resumes_from_the_previous_checkpoint(tmp_path):
    """SIGKILL after orbax wrote step 4's files but before it committed them: the rerun drops the
    unfinished step 4, resumes from step 2 and records no step twice."""
    import subprocess
    import sys

    from test_faults_runs import ENV, ROOT, _ckpt_steps, _cli_sub, _steps, _train_argv
    from test_sft_loop import write_curated

    data = write_curated(tmp_path / "data", n=80)
    work = str(tmp_path / "run")
    argv = _train_argv(data, work, "--config.train.num_steps=6", "--config.train.epochs=10",
                       "--config.checkpoint.save_every=2", "--config.train.eval_every=-1")
    p = subprocess.run([sys.executable, "-c", _KILL_IN_SAVE, *argv], env=ENV, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == -9, p.stderr[-3000:]
    ck = os.listdir(os.path.join(work, "checkpoints"))
    assert "4" not in ck and any(c.startswith("4.orbax-checkpoint-tmp") for c in ck), ck
    assert _ckpt_steps(work) == [2] and _steps(work)[-1] == 4
    p = _cli_sub(*argv)
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 0 and "from step 2" in out, out[-3000:]
    assert _ckpt_steps(work)[-1] == 6 and _steps(work) == [1, 2, 3, 4, 5, 6]
