"""The trainable set-up SFT and GRPO share (rossjax/train/trainable.py): full params or LoRA
adapters, their layout, the fresh state and the run files; and GRPO's compiled-step cache."""

import jax
import ml_collections
import numpy as np
import optax
import pytest

from rossjax import sharding
from rossjax.models import lora, shardings as model_shardings
from rossjax.train import checkpoint as ckpt_lib, trainable as trainable_lib
from rossjax.train.rl import grpo_setup


def _cfg(lora_on: bool):
    return ml_collections.ConfigDict(dict(
        model=dict(path="", preset="tiny_qwen2", dtype="float32", param_dtype="float32"),
        train=dict(seed=3), lora=dict(enabled=lora_on, rank=2, alpha=4.0, targets="q,down")))


@pytest.fixture(scope="module")
def part():
    return sharding.Partitioner(sharding.make_mesh(data=2, fsdp=2, tensor=2))


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_full_fine_tuning_trains_the_loaded_weights(part, tmp_path):
    t = trainable_lib.Trainable(_cfg(False), part)
    assert t.lora is None and t.lora_alpha is None and t.base_shardings is None
    assert t.shardings is t.param_shardings
    opt = optax.sgd(0.1)
    weights = t.load_weights()
    assert jax.tree.map(lambda x: (x.shape, x.dtype), weights) == jax.tree.map(
        lambda x: (x.shape, x.dtype), t.abstract)
    want = _leaves(weights)  # init_state takes the weights over (donated)
    state = t.init_state(opt, t.state_shardings(opt), weights)
    for a, b in zip(want, _leaves(state["params"])):
        np.testing.assert_array_equal(a, b)
    assert t.policy_params(state["params"], None) is state["params"]
    # the same seed's preset init when no weights are given (SFT's fresh start)
    again = t.init_state(opt, t.state_shardings(opt))
    for a, b in zip(want, _leaves(again["params"])):
        np.testing.assert_array_equal(a, b)
    t.write_run_files(str(tmp_path))
    assert (tmp_path / "model_config.json").is_file()
    assert ckpt_lib.read_lora_manifest(str(tmp_path)) is None


def test_lora_trains_seeded_adapters_on_the_frozen_base(part, tmp_path):
    t = trainable_lib.Trainable(_cfg(True), part)
    assert t.lora_alpha == 4.0 and t.base_shardings is t.param_shardings
    want = lora.init_lora(t.model_cfg, jax.random.PRNGKey(3 + 1), 2, "q,down")
    assert jax.tree.structure(t.abstract) == jax.tree.structure(want)
    assert jax.tree.map(lambda a, s: a.sharding == s, t.abstract, t.shardings) == \
        jax.tree.map(lambda _: True, want)
    opt = optax.adam(1e-3)
    state = t.init_state(opt, t.state_shardings(opt))
    for a, b in zip(_leaves(want), _leaves(state["params"])):
        np.testing.assert_array_equal(a, b)
    base = t.load_weights()
    merged = t.policy_params(state["params"], base)  # b = 0: the base, exactly
    for a, b in zip(_leaves(base), _leaves(merged)):
        np.testing.assert_array_equal(a, b)
    abstract = t.abstract_state(opt, t.state_shardings(opt))
    assert jax.tree.structure(abstract["params"]) == jax.tree.structure(want)
    t.write_run_files(str(tmp_path))
    m = ckpt_lib.read_lora_manifest(str(tmp_path))
    assert (m["rank"], m["alpha"], m["targets"], m["base_source"], m["seed"]) == \
        (2, 4.0, ["q", "down"], "scratch", 3)


def test_a_bad_lora_target_is_one_sentence(part):
    cfg = _cfg(True)
    cfg.lora.targets = "q,qq"
    with pytest.raises(ValueError, match="lora: field 'targets' entry 'qq'"):
        trainable_lib.Trainable(cfg, part)


def test_full_params_abstract_matches_the_model_layout(part):
    t = trainable_lib.Trainable(_cfg(False), part)
    want = model_shardings.sharded_abstract_params(t.model_cfg, t.param_shardings)
    assert jax.tree.map(lambda a, b: (a.shape, a.dtype, a.sharding) == (b.shape, b.dtype,
                                                                          b.sharding),
                        t.abstract, want) == jax.tree.map(lambda _: True, want)


def test_step_cache_keeps_the_last_settings_only():
    cache, built = grpo_setup.StepCache(), []

    def build(tag):
        return lambda: built.append(tag) or f"fns-{tag}"

    assert cache.get(("a",), build("a")) == "fns-a"
    assert cache.get(("a",), build("a2")) == "fns-a" and built == ["a"]  # reused
    assert cache.get(("b",), build("b")) == "fns-b" and cache.key == ("b",)
    assert cache.get(("a",), build("a3")) == "fns-a3" and built == ["a", "b", "a3"]
    cache.clear()
    assert cache.key is None and cache.fns is None
