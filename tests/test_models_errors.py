"""Bad checkpoints and arguments raise one-sentence ValueErrors naming the file and the field."""

import json
import os

import numpy as np
import pytest
from hf_tiny import make_tiny_hf
from safetensors.numpy import load_file, save_file

from rossjax.models import ModelConfig, forward, from_hf_config, init_params, load_hf


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    make_tiny_hf("qwen2", path)
    return path


def _copy(src, dst, edit_config=None, edit_tensors=None):
    os.makedirs(dst)
    cfg = json.load(open(src / "config.json"))
    if edit_config:
        edit_config(cfg)
    json.dump(cfg, open(dst / "config.json", "w"))
    tensors = load_file(str(src / "model.safetensors"))
    if edit_tensors:
        edit_tensors(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_folder_without_config(tmp_path):
    with pytest.raises(ValueError, match=r"config\.json.*missing"):
        load_hf(tmp_path)


def test_not_a_folder(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        load_hf(tmp_path / "nope")


def test_unsupported_model_type(ckpt, tmp_path):
    bad = _copy(ckpt, tmp_path / "m", edit_config=lambda c: c.update(model_type="gpt2"))
    with pytest.raises(ValueError, match=r"config\.json: field 'model_type' is 'gpt2'"):
        load_hf(bad)


def test_missing_required_field():
    with pytest.raises(ValueError, match="'hidden_size' is missing"):
        from_hf_config({"model_type": "llama", "vocab_size": 8})


def test_missing_tensor(ckpt, tmp_path):
    name = "model.layers.1.self_attn.k_proj.bias"
    bad = _copy(ckpt, tmp_path / "m", edit_tensors=lambda t: t.pop(name))
    with pytest.raises(ValueError, match=rf"model\.safetensors: tensor '{name}' is missing"):
        load_hf(bad)


def test_wrong_shape(ckpt, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    bad = _copy(ckpt, tmp_path / "m",
                edit_tensors=lambda t: t.update({name: np.zeros((127, 64), np.float32)}))
    with pytest.raises(ValueError, match=rf"model\.safetensors: tensor '{name}' has shape "
                                         r"\[127, 64\], expected \[128, 64\]"):
        load_hf(bad)


def test_no_safetensors(ckpt, tmp_path):
    os.makedirs(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text((ckpt / "config.json").read_text())
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        load_hf(tmp_path / "m")


def test_bad_dtype_argument(ckpt):
    with pytest.raises(ValueError, match=r"load_hf\(.*\): field 'dtype' is 'float33'"):
        load_hf(ckpt, dtype="float33")


def test_bad_dtype_in_config(ckpt, tmp_path):
    bad = _copy(ckpt, tmp_path / "m", edit_config=lambda c: c.update(dtype="floaty"))
    with pytest.raises(ValueError, match=r"config\.json: field 'dtype' is 'floaty'"):
        load_hf(bad)


def test_bad_model_config_fields():
    with pytest.raises(ValueError, match="'remat_policy'"):
        ModelConfig(remat_policy="sometimes")
    with pytest.raises(ValueError, match="'dtype'"):
        ModelConfig(dtype="int7")
    with pytest.raises(ValueError, match="'n_heads'"):
        ModelConfig(n_heads=3, n_kv_heads=2)


def test_bad_hidden_layer_index():
    cfg = ModelConfig()
    params = init_params(cfg, __import__("jax").random.key(0))
    with pytest.raises(ValueError, match="'hidden_layers' entry 3"):
        forward(cfg, params, np.zeros((1, 4), np.int32), hidden_layers=(3,))
