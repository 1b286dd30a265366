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
