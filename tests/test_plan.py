"""`rossjax plan`: programs compiled by the TPU compiler for small named slices, on this CPU host.

The `tpu` tests need libtpu (`make .tpu/.installed`; make test runs them with .tpu/ on
PYTHONPATH, `-k tpu`) and skip with the reason where it is missing. Models are the configs'
runlocal ones (tiny): a TPU compile of them takes seconds, a 1B step minutes. The rest (names,
presets, the HLO parser, the sentence) run everywhere.
"""

import json

import pytest

from rossjax.errors import ConfigError
from rossjax.models import config as config_lib
from rossjax.plan import compile as compile_lib, report, topologies

NO_TPU = topologies.missing()
needs_tpu = pytest.mark.skipif(NO_TPU is not None, reason=str(NO_TPU))


def _plan(capsys, *argv):
    from rossjax.cli import main

    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ----------------------------------------------------------------------------- everywhere

def test_topology_names():
    assert topologies.parse("v5e:2x4")[1] == "2x4"
    assert topologies.parse("v5e-8")[1] == "2x4"
    assert topologies.parse("v5p-64")[1] == "2x4x4"      # v5p-N counts TensorCores
    assert topologies.parse("v6e-256")[1] == "16x16"
    assert topologies.parse("v4:2x2x2")[0].chip_config == "megacore"
    for bad in ("v7x:2x2", "v5e", "v5e:2x2x2", "v5p:4x4", "v5e-12"):
        with pytest.raises(ConfigError):
            topologies.parse(bad)


def test_presets_have_the_published_sizes():
    billions = {"qwen2.5_1.5b": 1.54, "qwen2.5_7b": 7.62, "qwen3_8b": 8.19, "qwen3_32b": 32.76,
                "llama3.1_8b": 8.03, "qwen2_1b": 1.03}
    for name, b in billions.items():
        assert abs(config_lib.PRESETS[name].num_params() / 1e9 - b) < 0.01, name


def test_collectives_are_counted_with_their_result_bytes():
    hlo = """
  %all-gather.1 = bf16[1024,256]{0,1} all-gather(%p), channel_id=1, dimensions={1}
  %ags = (bf16[8,16]{1,0}, bf16[64,16]{1,0}) all-gather-start(%q), channel_id=2
  %agd = bf16[64,16]{1,0} all-gather-done(%ags)
  ROOT %ar = f32[10]{0} all-reduce(%x), to_apply=%add
  %cp = (f32[4,4]{1,0}, f32[4,4]{1,0}, u32[], u32[]) collective-permute-start(%y)
"""
    c = compile_lib.collectives(hlo)
    assert c["all-gather"] == {"count": 2, "bytes": 1024 * 256 * 2 + 64 * 16 * 2}
    assert c["all-reduce"] == {"count": 1, "bytes": 40}
    assert c["collective-permute"] == {"count": 1, "bytes": 64}
    assert c["reduce-scatter"]["count"] == 0


def test_collectives_per_step_multiply_by_the_loops_around_them():
    """A scan of 16 layers whose body holds a 4-step windowed loop: a collective-permute inside
    the inner body runs 64 times per call, an all-gather in the scan body 16 times, an
    all-reduce in the entry once; a loop bound that is not a constant counts once."""
    hlo = """
%inner_cond (p: (u32[], f32[4])) -> pred[] {
  %c = u32[] constant(4)
  %i = u32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

%inner_body (p: (u32[], f32[4])) -> (u32[], f32[4]) {
  %cp = f32[1024]{0} collective-permute(%x), channel_id=3, source_target_pairs={{0,1},{1,0}}
  ROOT %t = (u32[], f32[4]) tuple(%i, %y)
}

%fused (a: bf16[8]) -> bf16[64] {
  ROOT %ag2 = bf16[64]{0} all-gather(%a), channel_id=5, dimensions={0}
}

%scan_cond (p: (s32[], f32[4])) -> pred[] {
  %n = s32[] constant(16)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%scan_body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %w = (u32[], f32[4]) while(%t0), condition=%inner_cond, body=%inner_body
  %ag = bf16[8,16]{1,0} all-gather(%q), channel_id=2, dimensions={0}
  %f = bf16[64]{0} fusion(%a), kind=kCustom, calls=%fused
  ROOT %t = (s32[], f32[4]) tuple(%i, %y)
}

%odd_cond (p: (s32[], s32[])) -> pred[] {
  ROOT %lt = pred[] compare(%i, %bound), direction=LT
}

%odd_body (p: (s32[], s32[])) -> (s32[], s32[]) {
  %cp2 = f32[2]{0} collective-permute(%z), channel_id=4, source_target_pairs={{0,1}}
  ROOT %t = (s32[], s32[]) tuple(%i, %b)
}

ENTRY %main (x: f32[4]) -> f32[10] {
  %loop = (s32[], f32[4]) while(%init), condition=%scan_cond, body=%scan_body
  %odd = (s32[], s32[]) while(%init2), condition=%odd_cond, body=%odd_body
  ROOT %ar = f32[10]{0} all-reduce(%x), to_apply=%add
}
"""
    once = compile_lib.collectives(hlo)
    assert once["collective-permute"] == {"count": 2, "bytes": 4096 + 8}
    runs = compile_lib.collectives_per_step(hlo)
    assert runs["collective-permute"] == {"count": 16 * 4 + 1, "bytes": 64 * 4096 + 8}
    assert runs["all-gather"] == {"count": 16 + 16, "bytes": 16 * 256 + 16 * 128}
    assert runs["all-reduce"] == {"count": 1, "bytes": 40}


def test_the_sentence_names_the_program_and_the_fields():
    prog = {"program": "train step (ross)", "fits": False, "hbm": 16 * 2 ** 30,
            "memory": {"peak": 20 * 2 ** 30, "temporaries": 18 * 2 ** 30},
            "knobs": ["model.remat_policy", "train.micro_batches"]}
    s = report.not_fit_sentence({"programs": [prog], "target": {"topology": "v5e:2x2"}})
    assert "DOES NOT FIT" in s and "20 GiB" in s and "--config.train.micro_batches" in s
    assert report.not_fit_sentence({"programs": [dict(prog, fits=True)], "target": {}}) is None


def _four_device_partitioner():
    import jax

    from rossjax import sharding

    return sharding.Partitioner(sharding.make_mesh(data=-1, fsdp=1, tensor=1,
                                                   devices=jax.devices()[:4]))


def _capture_engine(monkeypatch, module):
    """({}, exception): `module.Engine(...)` records its keyword arguments there and raises."""
    got = {}

    class Built(Exception):
        pass

    def fake_engine(model_cfg, params, **kw):
        got.update(kw)
        raise Built

    monkeypatch.setattr(module, "Engine", fake_engine)
    return got, Built


def test_plan_engine_shapes_are_what_grpo_sampling_hands_the_engine(monkeypatch):
    """The engine programs the plan compiles for GRPO (plan/engine.py) have the slots, cache
    length and chunk `sample.generate` builds its Engine with, and the prefill rows, bucket,
    decode steps and sampler mode the scheduler's first step runs for the upstream 128 x 8."""

    from rossjax import sample
    from rossjax.configs import grpo_verifier
    from rossjax.engine.scheduler import Scheduler, pow2
    from rossjax.engine.types import SamplingParams
    from rossjax.plan import engine

    cfg = grpo_verifier.get_config()
    cfg.grpo.max_new_tokens, cfg.grpo.temperature = 700, 1.0
    part = _four_device_partitioner()
    s = engine.shape_of(cfg, part, prompt_len=300)
    got, Built = _capture_engine(monkeypatch, sample)
    g = cfg.grpo
    with pytest.raises(Built):
        sample.generate(config_lib.PRESETS["tiny_qwen2"], None, [[1] * 300] * g.contexts,
                        g.max_new_tokens, temperature=g.temperature, num_samples=g.group_size,
                        stop_ids=(2,), partitioner=part)
    assert (got["slots"], got["max_len"], got["n_stop"], got["chunk"]) == \
        (s.slots, s.max_len, s.n_stop, s.chunk) == (256, 512 + 700, 1, 16)
    sched = Scheduler(slots=s.slots, max_len=s.max_len, n_stop=s.n_stop, vocab_size=64,
                      chunk=s.chunk, compact=False)
    for i in range(g.contexts):
        sched.submit([1] * 300, SamplingParams(g.max_new_tokens, g.temperature, g.top_p,
                                               g.top_k, (2,), i), n=g.group_size)
    plan = sched.schedule()
    (pre,) = plan.prefills
    assert (pow2(len(pre.prompts)), pre.length, pow2(len(pre.slots))) == \
        (s.prompts, s.plen, s.candidates) == (32, 512, 256)
    assert (plan.decode.steps, plan.decode.mode) == (s.chunk, s.mode) == (16, "plain")
    # 6 contexts: the engine prefills 4 + 2 (power-of-two groups); the plan compiles the 4
    sched = Scheduler(slots=48, max_len=s.max_len, n_stop=1, vocab_size=64, chunk=16,
                      compact=False)
    for i in range(6):
        sched.submit([1] * 300, SamplingParams(8, 1.0, seed=i), n=8)
    assert [len(p.prompts) for p in sched.schedule().prefills] == [engine._group(6), 2] == [4, 2]


def test_plan_engine_shapes_are_what_agent_episodes_hand_the_engine(monkeypatch):
    """Multi-turn GRPO (configs/grpo_agentic.py): a slot per episode, the spec's cache length,
    and an extension program beside the prefill and decode."""
    import types

    from rossjax.configs import grpo_agentic
    from rossjax.plan import engine
    from rossjax.train.rl import agentic, agentic_grpo

    cfg = grpo_agentic.get_config()
    part = _four_device_partitioner()
    s = engine.shape_of(cfg, part, prompt_len=100)
    got, Built = _capture_engine(monkeypatch, agentic)
    monkeypatch.setattr(agentic, "TokenTurns", lambda *a: None)
    monkeypatch.setattr(agentic, "_handles", lambda envs, spec, n: [None] * n)
    g = cfg.grpo
    with pytest.raises(Built):
        agentic.rollouts(config_lib.PRESETS["tiny_qwen2"], None, types.SimpleNamespace(eos_id=2),
                         [{}] * g.contexts, agentic_grpo.spec_of(cfg), group=g.group_size,
                         temperature=1.0, partitioner=part)
    assert (got["slots"], got["max_len"], got["n_stop"], got["chunk"]) == \
        (s.slots, s.max_len, s.n_stop, s.chunk) == (128, 2 * 4096 + 16 * 7, 1, 16)
    assert s.extend_len == 512 and (s.prompts, s.candidates) == (16, 128)


@pytest.mark.skipif(NO_TPU is None, reason="libtpu is installed here")
def test_without_libtpu_plan_says_why_in_one_sentence(capsys):
    rc, _, err = _plan(capsys, "--config=configs/ross_sft.py:runlocal", "--topology=v5e:2x2")
    assert rc == 2 and "libtpu is not installed" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- TPU compiler

@needs_tpu
def test_tpu_sft_plan_matches_memory_analysis_and_runs_splash(tmp_path, capsys, monkeypatch):
    """The plan's figures are the compiled TPU program's own; auto attention is the splash
    Pallas kernel (Mosaic custom calls in the executable) although this host is a CPU."""
    compiled = []
    real = compile_lib.lower_and_compile
    monkeypatch.setattr(compile_lib, "lower_and_compile",
                        lambda p, m: compiled.append(real(p, m)) or compiled[-1])
    out = tmp_path / "plan.json"
    rc, text, err = _plan(capsys, "--config=configs/ross_sft.py:runlocal", "--topology=v5e:2x2",
                          f"--out={out}")
    assert rc == 0, err
    assert err == ""   # libtpu is quiet: no TPU-VM metadata warnings on a CPU host
    assert "FITS" in text and "TPU v5 lite" in text
    plan = json.loads(out.read_text())
    (prog,) = plan["programs"]
    (c, _, _), = compiled
    assert c.as_text().count(compile_lib.MOSAIC) == prog["mosaic_kernels"] > 0
    m = c.memory_analysis()
    mem = prog["memory"]
    assert (mem["arguments"], mem["outputs"], mem["aliased"], mem["temporaries"],
            mem["generated_code"]) == (m.argument_size_in_bytes, m.output_size_in_bytes,
                                       m.alias_size_in_bytes, m.temp_size_in_bytes,
                                       m.generated_code_size_in_bytes)
    assert mem["peak"] == (m.argument_size_in_bytes + m.output_size_in_bytes
                           - m.alias_size_in_bytes + m.temp_size_in_bytes
                           + m.generated_code_size_in_bytes)
    assert prog["margin"] == 16 * 2 ** 30 - mem["peak"] and prog["fits"]
    assert plan["target"]["devices"] == 4 and plan["mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
    assert prog["cost"]["flops"] > 0 and 0 < prog["estimate"]["mfu"] <= 1
    # collectives: the compiled program's own, and each runs at least once per call
    hlo = c.as_text()
    assert prog["collectives"] == compile_lib.collectives(hlo)
    assert prog["collectives_per_step"] == compile_lib.collectives_per_step(hlo)
    for op, v in prog["collectives"].items():
        assert prog["collectives_per_step"][op]["count"] >= v["count"], op
        assert prog["collectives_per_step"][op]["bytes"] >= v["bytes"], op
    assert "run per call" in text


@needs_tpu
@pytest.mark.slow
def test_tpu_splash_changes_the_plans_memory(tmp_path, capsys):
    """The same step with the pure-JAX attention instead: no Mosaic kernel, other temporaries."""
    figures = {}
    for impl in ("splash", "dense"):
        out = tmp_path / f"{impl}.json"
        rc, _, err = _plan(capsys, "--config=configs/ross_sft.py:runlocal", "--topology=v5e:2x2",
                           f"--config.model.attention_impl={impl}", f"--out={out}")
        assert rc == 0, err
        figures[impl] = json.loads(out.read_text())["programs"][0]
    assert figures["splash"]["mosaic_kernels"] > 0 and figures["dense"]["mosaic_kernels"] == 0
    assert figures["splash"]["memory"]["temporaries"] != figures["dense"]["memory"]["temporaries"]


@needs_tpu
@pytest.mark.slow
def test_tpu_grpo_programs_compile_for_v5p(tmp_path, capsys):
    """A PROPEL (probe-reward) GRPO config: the update, the old-policy log-prob pass, the rollout
    engine's prefill and decode (its slot state donated) and the probe reward's reference
    forward, whose splash kernel runs per shard on the 4-device mesh (before the reward handed
    extract the run's partitioner, the TPU compiler refused it: a Pallas call to partition)."""
    out = tmp_path / "plan.json"
    rc, text, err = _plan(capsys, "--config=configs/propel_azr.py:runlocal",
                          "--topology=v5p:2x2x1", "--config.mesh.num_devices=0",
                          "--config.mesh.data=-1", "--config.mesh.fsdp=1", "--prompt_len=64",
                          f"--out={out}")
    assert rc == 0, err
    plan = json.loads(out.read_text())
    progs = {p["program"]: p for p in plan["programs"]}
    # runlocal updates in minibatches: the old policy is scored by a separate log-prob pass;
    # on 4 devices rows stay row-wise (the shared-prompt variant is a one-device program)
    assert list(progs) == ["grpo update", "log-probs (old policy / reference)",
                           "engine insert (prefill)", "engine decode",
                           "probe reward (reference forward)"], list(progs)
    assert plan["target"]["device_kind"] == "TPU v5" and plan["mesh"]["data"] == 4
    assert all(p["fits"] and p["hbm"] == 95 * 2 ** 30 for p in progs.values())
    for name in ("engine insert (prefill)", "engine decode"):   # the slot state, in place
        assert progs[name]["memory"]["aliased"] > 0, name
    assert progs["probe reward (reference forward)"]["mosaic_kernels"] > 0
    assert "16 steps (plain)" in progs["engine decode"]["what"]


@needs_tpu
def test_tpu_extract_plan_runs_splash_per_shard(tmp_path, capsys):
    """`rossjax extract`'s forward batch over a 4-chip mesh: the batch iter_extract would run
    for 1,000-token rows (bucket 1,024, 8 rows of the 8,192 batch tokens), splash per shard."""
    out = tmp_path / "plan.json"
    rc, text, err = _plan(capsys, "--config=configs/extract.py", "--topology=v5e:2x2",
                          "--seq_len=1000", f"--out={out}")
    assert rc == 0, err
    plan = json.loads(out.read_text())
    (prog,) = plan["programs"]
    assert plan["command"] == "extract" and prog["program"] == "extract (forward + pooling)"
    assert prog["what"].startswith("8 rows x 1024 tokens") and prog["fits"]
    assert prog["mosaic_kernels"] > 0


@needs_tpu
@pytest.mark.slow
def test_tpu_multi_host_multi_slice_compiles(tmp_path, capsys):
    """Two v5e 2x4 slices over DCN: 16 devices on 4 hosts; the data axis spans the slices. A
    micro-batch of 8 rows on 16 data shards: splash runs in shard_map all the same (a Pallas
    call XLA would have to partition does not compile for TPU)."""
    out = tmp_path / "plan.json"
    rc, _, err = _plan(capsys, "--config=configs/ross_sft.py:runlocal", "--topology=v5e:2x4",
                       "--num_slices=2", "--config.train.global_batch=16", f"--out={out}")
    assert rc == 0, err
    t = json.loads(out.read_text())["target"]
    assert (t["devices"], t["hosts"], t["slices"]) == (16, 4, 2)


@needs_tpu
@pytest.mark.slow
def test_tpu_too_large_does_not_fit_exit_2(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc, text, err = _plan(capsys, "--config=configs/ross_sft.py:runlocal", "--topology=v5e:2x2",
                          "--config.data.seq_len=8192", "--config.train.global_batch=1024",
                          "--config.train.micro_batches=1", "--config.model.remat_policy=none",
                          f"--out={out}")
    # the TPU compiler refuses it (temporaries over the HBM); the plan reports its figure
    assert rc == 2, err
    assert "DOES NOT FIT" in text
    (line,) = err.strip().splitlines()
    assert line.startswith("rossjax plan: DOES NOT FIT on v5e:2x2") and "micro_batches" in line
    assert not json.loads(out.read_text())["programs"][0]["fits"]
