"""Forward-only programs of a frozen model for `rossjax plan`: `rossjax extract`'s batch and the
probe reward's reference pass in GRPO (PROPEL).

    progs = forward.extract_programs(cfg, part, seq_len=4096)
    progs = forward.probe_programs(cfg, model_cfg, part, seq_len=1024)

Both run `probes.activations._make_batch_fn` (the jitted forward + pooling `iter_extract` calls)
on one length bucket: rows of `seq_len` tokens (bucketed as `iter_extract` buckets them), as
many as `plan_batches` puts in one batch of `batch_tokens`. Extract runs over the config's mesh
(rows over the batch axes); the probe reward over one device when it reads its own reference
(`reward.probe.reference`), else over the run's mesh, where the policy's base lives.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

from rossjax.errors import ConfigError
from rossjax.models import loading, shardings as model_shardings
from rossjax.probes import activations
from rossjax.train import metrics as metrics_lib


def _batch_args(model_cfg, rows: int, blen: int, shardings):
    """(tokens, seg, mask, last_idx, turn_valid) of one batch; one turn slot (no turn spans)."""
    r2, r3 = shardings
    sds = lambda shape, dtype, sh: jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=sh)
    return (sds((rows, blen), "int32", r2), sds((rows, blen), "int32", r2),
            sds((rows, 1, blen), "bool", r3), sds((rows, 1), "int32", r2),
            sds((rows, 1), "bool", r2))


def _one_bucket(seq_len: int, batch_tokens: int, multiple: int) -> tuple[int, int]:
    """(bucket length, rows per batch) iter_extract uses for rows of seq_len tokens."""
    blen, rows, _ = next(activations.plan_batches([int(seq_len)], int(batch_tokens), multiple))
    return blen, rows


def _forward_flops(model_cfg, rows, blen) -> float:
    return metrics_lib.train_flops_per_token(model_cfg, blen) / 3 * rows * blen


_KNOBS = ("batch_tokens", "mesh.data", "mesh.tensor")


def extract_programs(cfg, part, *, seq_len: int, program_cls) -> list:
    """`rossjax extract` (configs/extract.py, kind activations) on rows of seq_len tokens."""
    if cfg.get("kind", "activations") != "activations":
        raise ConfigError("rossjax plan: extract's grad_sketch kind runs on one device, row by "
                          "row; plan takes kind=activations.")
    section = loading.section_from_spec(str(cfg.model), str(cfg.dtype),
                                        where="configs/extract.py: field 'model'")
    model_cfg, _ = loading.abstract_model(section, field="config.model")
    layers = activations.check_inputs(model_cfg, [[0]], tuple(cfg.layers), cfg.pooling,
                                      cfg.turn_pooling, None)
    spec = activations._PoolSpec(model_cfg, layers, cfg.pooling, cfg.turn_pooling, part)
    p_sh, r2, r3, _, _ = activations._shardings(spec)
    blen, rows = _one_bucket(seq_len, cfg.batch_tokens, part.batch_size_multiple())
    params = model_shardings.sharded_abstract_params(model_cfg, p_sh)
    return [program_cls(
        "extract (forward + pooling)", activations._make_batch_fn(spec),
        (params, *_batch_args(model_cfg, rows, blen, (r2, r3))),
        _forward_flops(model_cfg, rows, blen),
        f"{rows} rows x {blen} tokens, layers {list(layers)}, "
        f"{model_cfg.num_params() / 1e9:.2f}B params", _KNOBS, training=False)]


def probe_programs(cfg, model_cfg, part, *, seq_len: int, program_cls) -> list:
    """The probe reward's reference forward (`ProbeReward._score`: `extract` at its default
    8,192 batch tokens) at the deepest layer a probe can read: over the run's mesh for the
    policy's base (`rewards.probe_reward` hands it the partitioner), on one device for a
    reference of its own."""
    from rossjax.train.propel import rewards

    if rewards.own_reference(cfg):
        ref = cfg.reward.probe.reference
        section = {"path": ref.get("path", ""), "preset": ref.get("preset", ""),
                   "dtype": ref.get("dtype", "float32"),
                   "param_dtype": ref.get("dtype", "float32")}
        model_cfg, _ = loading.abstract_model(section, field=rewards.REFERENCE_FIELD)
        one = SingleDeviceSharding(part.mesh.devices.flat[0])
        p_sh = jax.tree.map(lambda _: one, model_shardings.abstract_params(model_cfg))
        on, rows_sh, multiple, devices = None, (one, one), 1, 1
        where = "one device, its own reference"
    else:
        on, devices, where = part, 0, "the policy's base, rows over the mesh"
    layer = model_cfg.n_layers
    spec = activations._PoolSpec(model_cfg, (layer,), "mean", "mean", on)
    if on is not None:
        p_sh, r2, r3, _, _ = activations._shardings(spec)
        rows_sh, multiple = (r2, r3), part.batch_size_multiple()
    blen, rows = _one_bucket(seq_len, 8192, multiple)
    params = model_shardings.sharded_abstract_params(model_cfg, p_sh)
    return [program_cls(
        "probe reward (reference forward)", activations._make_batch_fn(spec),
        (params, *_batch_args(model_cfg, rows, blen, rows_sh)),
        _forward_flops(model_cfg, rows, blen),
        f"{rows} rows x {blen} tokens, layer {layer}, {where}",
        ("mesh.fsdp", "mesh.tensor"), training=False, devices=devices)]
