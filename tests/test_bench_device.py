"""`rossjax bench model --device` on a machine without an accelerator says so and exits 0."""

import jax
import pytest

from rossjax.bench import model, model_device


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the no-accelerator path")
def test_device_mode_on_cpu_says_no_accelerator(capsys):
    assert model.main(["--device"]) == 0
    out = capsys.readouterr().out
    assert "no accelerator" in out and "nothing measured" in out


def test_peak_table_and_model_shape():
    assert model_device.peak_flops("TPU v5 lite") == 197e12
    assert model_device.peak_flops("TPU v5p") == 459e12
    assert model_device.peak_flops("NVIDIA H200") == 989e12
    assert model_device.peak_flops("Some CPU") is None
    cfg = model_device.qwen2_half_b("full", "auto")
    assert 480e6 < cfg.num_params() < 510e6 and cfg.dtype == "bfloat16"
