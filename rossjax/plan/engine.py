"""The rollout engine's programs as a GRPO run drives them, for `rossjax plan`.

    progs = engine.grpo_engine_programs(cfg, model_cfg, part, prompt_len=512)

GRPO samples on `rossjax.engine` (kv_slots.Programs: jitted insert / extend / decode over a
donated slot state), sized by `sample.generate` (single-turn: `_generate_shape`) or by
`agentic.rollouts` (multi-turn episodes: `_agentic_shape`); the plan compiles the Programs
object the run's Engine builds, at the first admission's largest prefill group (the prompts
the slots hold, down to a power of two), one decode chunk and, for episodes, an extension of
the largest fixed bucket. `tests/test_plan.py` checks the shapes against what the engine is
handed.

cost_analysis() counts a loop body once (the decode chunk's steps, the layer scan), so a
decode's HBM traffic comes from the model instead (`min_bytes`): every step reads the weights
(their tensor shard; fsdp gathers the rest) and its share of the KV cache.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rossjax.engine import kv_slots, sampler
from rossjax.engine.scheduler import BUCKETS, bucket_length, pow2, prefill_groups
from rossjax.models import shardings as model_shardings
from rossjax.train import metrics as metrics_lib


@dataclasses.dataclass(frozen=True)
class Shape:
    """What fixes the engine's compiled programs in a run (from the config)."""
    slots: int
    max_len: int
    n_stop: int
    chunk: int          # decode steps per call
    prompts: int        # rows of the first prefill (prompts admitted at once)
    plen: int           # their bucketed length
    candidates: int     # slots that prefill fills (prompts x group)
    extend_len: int     # tokens of one extension (0: single-turn runs extend nothing)
    mode: str           # the sampler's mode (greedy | plain | filtered)


def _generate_shape(cfg, mult: int, prompt_len: int) -> Shape:
    """What `sample.generate` hands the Engine for a step's contexts x group_size rows."""
    from rossjax import sample

    g = cfg.grpo
    n, k, t = int(g.contexts), int(g.group_size), int(g.max_new_tokens)
    slots = sample._round_up(min(n * k, max(sample._MAX_SLOTS, k)), mult)
    first = _group(min(n, slots // k))    # FIFO admission while a request's k slots are free
    return Shape(slots, bucket_length(prompt_len) + t, 1, min(t, 16), first,
                 bucket_length(prompt_len), pow2(first * k), 0, _mode(g))


def _group(prompts: int) -> int:
    """The largest prefill group of that many prompts admitted at once (scheduler.
    prefill_groups: power-of-two groups, one program each; no token cap on a mesh)."""
    return len(prefill_groups(list(range(prompts)), 1)[0])


def _agentic_shape(cfg, mult: int, prompt_len: int) -> Shape:
    """What `agentic.rollouts` hands the Engine: a slot per episode, all admitted at once."""
    from rossjax.train.rl import agentic_grpo

    g, spec = cfg.grpo, agentic_grpo.spec_of(cfg)
    n = int(g.contexts) * int(g.group_size)
    slots = -(-n // mult) * mult
    first = _group(int(g.contexts))
    return Shape(slots, spec.cache_len(), 1, min(spec.max_new_tokens, 16), first,
                 bucket_length(prompt_len), pow2(first * int(g.group_size)), BUCKETS[-1],
                 _mode(g))


def _mode(g) -> str:
    return sampler.mode_for([float(g.temperature)], [int(g.top_k)], [float(g.top_p)])


def shape_of(cfg, part, prompt_len: int) -> Shape:
    from rossjax.train.rl import agentic_grpo

    mult = part.batch_size_multiple()
    make = _agentic_shape if agentic_grpo.enabled(cfg) else _generate_shape
    return make(cfg, mult, int(prompt_len))


def _sds(x, sh):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)


def _bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def grpo_engine_programs(cfg, model_cfg, part, *, prompt_len: int, program_cls) -> list:
    """Program objects (programs.Program) for the engine's insert / decode (/ extend)."""
    s = shape_of(cfg, part, prompt_len)
    layout = kv_slots.Layout(model_cfg, s.slots, s.max_len, s.n_stop, part)
    progs = kv_slots.Programs(layout)      # what Engine -> Executor builds (lru-cached there)
    params = model_shardings.sharded_abstract_params(model_cfg, progs._param_sh)
    state = jax.tree.map(_sds, jax.eval_shape(lambda: kv_slots.init_state(layout)), progs.state_shardings)
    rep = part.replicated()
    host = lambda shape, dtype: jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=rep)
    m = s.candidates
    settings = {"temp": host((m,), "float32"), "top_k": host((m,), "int32"),
                "top_p": host((m,), "float32"), "stop": host((m, s.n_stop), "int32"),
                "key": host((m, 2), "uint32"), "budget": host((m,), "int32")}
    fwd = lambda seq: metrics_lib.train_flops_per_token(model_cfg, seq) / 3
    knobs = ("grpo.contexts", "grpo.max_new_tokens", "mesh.fsdp", "mesh.tensor")
    what = f"{s.slots} slots x {s.max_len} cache columns"
    out = [program_cls(
        "engine insert (prefill)", progs._insert,
        (params, state, host((s.prompts, s.plen), "int32"), host((s.prompts, s.plen), "int32"),
         host((s.prompts, s.plen), "bool"), host((m,), "int32"), host((m,), "int32"), settings),
        fwd(s.plen) * s.prompts * s.plen,
        f"{s.prompts} prompts x {s.plen} tokens into {m} of {what}", knobs)]
    if s.extend_len:
        e = pow2(s.slots)
        out.append(program_cls(
            "engine extend (observations)", progs._extend,
            (params, state, host((e, s.extend_len), "int32"), host((e, s.extend_len), "bool"),
             host((e,), "int32"), host((e,), "int32")),
            fwd(s.max_len) * e * s.extend_len,
            f"{e} rows x {s.extend_len} tokens appended, {what}", knobs))
    tensor = int(part.mesh.shape.get("tensor", 1))
    n = part.mesh.devices.size
    step_bytes = _bytes(params) / tensor + _bytes(state["cache"]) / n
    out.append(program_cls(
        "engine decode", progs.decode_program(s.chunk, s.mode), (params, state, host((), "bool")),
        fwd(s.max_len) * s.slots * s.chunk,
        f"{s.chunk} steps ({s.mode}) over {what}", knobs, min_bytes=step_bytes * s.chunk))
    return out
