"""Cold transfer (train/propel/rewards.py): the probe reads a frozen reference model given on its
own (`reward.probe.reference`: a tiny Llama of another width with its own BPE tokenizer) while
the policy is a tiny Qwen2 with the ASCII tokenizer. The sweep's manifest names the reference;
GRPO re-tokenizes each task for it, and refuses another reference, the policy's base, or the
policy's own token ids. Also the paper's defaults: raw probe scores for AZR, a random split."""

import json
import os

import numpy as np
import pytest
from hf_tiny import make_tiny_hf

from rossjax.cli import parse_config
from rossjax.models import loading
from rossjax.probes import extract, reward, write_store
from rossjax.probes.heads import load_probe
from rossjax.tokenizers import load_tokenizer
from rossjax.train.propel import rewards as propel_rewards
from rossjax.train.propel.label_corpus import probe_input
from rossjax.train.rl.grpo_config import check_config
from rossjax.verify import induction_task, rewards

INPUTS = "\n".join(str(i) for i in range(10))


def _program(i):
    op = "+" if i % 2 else "*"   # the property the probe reads: visible in the text
    return f"def f(x):\n    return x {op} {i % 7 + 2}"


def _task_text(program, inputs=INPUTS):
    return f"```python\n{program}\n```\n```inputs\n{inputs}\n```\n```message\nguess f\n```"


def _bpe_tokenizer(folder, corpus):
    """A byte-level BPE with learned merges: another tokenization than the policy's ASCII one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)


def _llama(folder, seed):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=384, hidden_size=96, intermediate_size=192, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Policy (Qwen2, d 64) and reference (Llama, d 96, own BPE) folders, and a probe swept on
    the reference's activations of label-corpus-rendered tasks."""
    root = tmp_path_factory.mktemp("transfer")
    policy, ref, other = (str(root / n) for n in ("policy", "reference", "other_llama"))
    make_tiny_hf("qwen2", policy)
    texts = [_task_text(_program(i)) for i in range(80)]
    for d, seed in ((ref, 0), (other, 1)):
        _llama(d, seed)
        _bpe_tokenizer(d, texts)
    tok = load_tokenizer(ref)
    ref_cfg, ref_params = loading.load_model({"path": ref, "dtype": "float32",
                                              "param_dtype": "float32"})
    ids = [f"t{i}" for i in range(80)]
    tokens = [probe_input(induction_task.parse_generated_task(t), t, tok, "chatml")[0] for t in texts]
    store = str(root / "acts")
    write_store(store, ref_cfg, ref_params, ids, tokens, (2, 3), "mean", model_name=ref,
                progress=False)
    lab = root / "labels.jsonl"
    lab.write_text("\n".join(json.dumps({"id": i, "label": k % 2}) for k, i in enumerate(ids)))
    from rossjax.probes import sweep

    c = parse_config(["--config=configs/probe_sweep.py", f"--config.stores=('{store}',)",
                      f"--config.labels={lab}", "--config.heads=('linear',)", "--config.seeds=(0,)",
                      "--config.max_epochs=10", "--config.ece_max=1.0"])[0]
    res = sweep.run_sweep(c, str(root / "sweep"), progress=False)
    return {"root": root, "policy": policy, "ref": ref, "other": other, "tok": tok,
            "ref_cfg": ref_cfg, "ref_params": ref_params, "sweep": str(root / "sweep"), "res": res}


def test_sweep_records_reference_split_and_raw_scores(setup):
    man = setup["res"]["selected"]
    assert man["reference"]["model"] == setup["ref"]
    assert (man["reference"]["model_type"], man["reference"]["d_model"],
            man["reference"]["n_layers"]) == ("llama", 96, 3)
    assert len(man["reference"]["weights_sha256"]) == 64
    # PROPEL's AZR defaults: one 80/10/10 split (over groups; one row each here); raw scores
    assert man["split"] == "group_random" and man["fold"] == 0 and man["reward_scores"] == "raw"
    assert (man["n_train"], man["n_val"], man["n_test"]) == (64, 8, 8)
    report = json.load(open(os.path.join(setup["sweep"], "report.json")))
    assert report["split"] == "group_random" and report["split_detail"].startswith("grouped 80/10/10")
    assert report["rows"] == 80 and report["reference"] == man["reference"]


def _cfg(setup, *flags):
    return parse_config(["--config=configs/propel_azr.py:runlocal", f"--config.model.path={setup['policy']}",
                         "--config.model.preset=", "--config.tokenizer=ascii",
                         f"--config.reward.probe.path={setup['sweep']}/selected_probe",
                         f"--config.reward.probe.reference.path={setup['ref']}", *flags])[0]


def _record(rid, content):
    return {"id": rid, "task": {"id": rid, "prompt": "write a task"},
            "messages": [{"role": "user", "content": "write a task"},
                         {"role": "assistant", "content": content}]}


def test_probe_reads_the_reference_through_its_own_tokenizer(setup, tmp_path):
    from rossjax.train.rl.grpo_setup import Run

    run = Run(_cfg(setup), str(tmp_path))
    try:
        assert (run.model_cfg.model_type, run.model_cfg.d_model) == ("qwen2", 64)
        assert any(f"read from the reference {setup['ref']} (llama, d_model 96)" in n
                   for n in run.probe_names), run.probe_names
        texts = [_task_text(_program(3)), _task_text(_program(4)),
                 _task_text(_program(5), inputs="1\n2")]          # the last one is invalid
        recs = [_record(f"r{i}", t) for i, t in enumerate(texts)]
        total, per = run.rewards(recs, rewards.score_batch(run.cpu_kinds, recs))
        # independently: label-corpus's rendering, the reference's tokenizer, extract, raw score
        probe, man = load_probe(os.path.join(setup["sweep"], "selected_probe"))
        tok = setup["tok"]
        ids = [probe_input(induction_task.parse_generated_task(t), t, tok, "chatml")[0] for t in texts]
        x = extract(setup["ref_cfg"], setup["ref_params"], ids, (man["layer"],), man["pooling"])[:, 0]
        want = probe.score(x, calibrated=False)
        np.testing.assert_allclose(per["probe_score"], want, rtol=1e-5, atol=1e-6)
        assert not np.allclose(want, probe.score(x, calibrated=True))  # raw is a real choice
        np.testing.assert_allclose(total, [want[0], want[1], -0.2], rtol=1e-5, atol=1e-6)
        # the policy's tokenization is another one: re-tokenizing is not a no-op
        ascii_ids = run.tok.encode("```python\ndef f(x):")
        assert len(tok.encode("```python\ndef f(x):")) < len(ascii_ids)
    finally:
        run.workers.close()


def test_full_finetuning_keeps_no_policy_copy_for_a_reference_of_its_own(setup, tmp_path):
    from rossjax.train.rl.grpo_setup import Run

    run = Run(_cfg(setup, "--config.lora.enabled=False", "--config.grpo.beta=0.0"), str(tmp_path))
    try:  # beta 0 and the probe on its own reference: no frozen copy of the policy is held
        assert run.ref is None and run.probe_reward.model_cfg.model_type == "llama"
    finally:
        run.workers.close()


def test_another_reference_is_refused_in_one_sentence(setup, tmp_path):
    from rossjax.train.rl.grpo_setup import Run

    # the policy's base (a Qwen2 of width 64) is not the model the probe was swept on
    cfg = _cfg(setup, "--config.reward.probe.reference.path=")
    with pytest.raises(ValueError, match=r"was trained on the activations of .*reference \(llama, "
                                         r"d_model 96, 3 layers.*but the reference model given is "
                                         r".*policy \(qwen2, d_model 64"):
        Run(cfg, str(tmp_path / "a"))
    # the same architecture with other weights
    cfg = _cfg(setup, f"--config.reward.probe.reference.path={setup['other']}")
    with pytest.raises(ValueError, match="same architecture and other weights"):
        Run(cfg, str(tmp_path / "b"))
    # a reference with its own tokenizer cannot read the policy's token ids
    with pytest.raises(ValueError, match="render is 'record'.*cannot read"):
        Run(_cfg(setup, "--config.reward.probe.render=record"), str(tmp_path / "c"))
    # the policy's folder holds no tokenizer: the reference's own must be named
    with pytest.raises(ValueError, match="reference.tokenizer .*policy.* cannot be loaded .*no "
                                         "tokenizer.json"):
        Run(_cfg(setup, f"--config.reward.probe.reference.path={setup['policy']}"),
            str(tmp_path / "d"))
    with pytest.raises(ValueError, match="reference.path '/nope' is not a model folder"):
        check_config(_cfg(setup, "--config.reward.probe.reference.path=/nope"))
    with pytest.raises(ValueError, match="calibration 'lukewarm' is not one of"):
        check_config(_cfg(setup, "--config.reward.probe.calibration=lukewarm"))


def test_preset_reference_needs_a_tokenizer(tmp_path):
    cfg = parse_config(["--config=configs/propel_azr.py:runlocal",
                        "--config.reward.probe.reference.preset=tiny_llama"])[0]
    cfg.workdir = str(tmp_path)

    class _Run:  # reference_model reads only cfg and workdir before it loads the tokenizer
        workdir = str(tmp_path)
    _Run.cfg = cfg
    with pytest.raises(ValueError, match="reference.tokenizer is empty and the reference is a preset"):
        propel_rewards.reference_model(_Run())


def test_candidates_render_as_label_corpus_stores_them(setup):
    """The probe reads a candidate exactly as label-corpus wrote its training rows: induction
    and math tasks in canonical form (a user turn up to the answer), raw text otherwise."""
    import ml_collections

    from rossjax.verify import math_task

    cfg = ml_collections.ConfigDict({"reward": {"probe": {"render": "task"}}})
    tok = setup["tok"]
    render = propel_rewards.render_fn(cfg, tok, "chatml")
    ind = _task_text(_program(1)).replace("```python", "Here it is.\n```python")
    math = "Sure.\n```problem\nWhat is 2 + 3?\n```\nAnswer: \\boxed{5}"
    want_ind = probe_input(induction_task.parse_generated_task(ind), ind, tok, "chatml")[0]
    want_math = probe_input(math_task.parse_generated_problem(math), math, tok, "chatml", "math")[0]
    assert render(_record("i", ind))[0] == want_ind
    assert render({**_record("m", math), "task": {"domain": "math_gen"}})[0] == want_math
    assert render(_record("x", "no task"))[0] == probe_input(None, "no task", tok, "chatml")[0]


def test_calibration_follows_the_domain():
    assert not reward.calibrated_for("azr") and not reward.calibrated_for("math")
    assert reward.calibrated_for("swe") and reward.calibrated_for(None, "temperature")
    assert not reward.calibrated_for("swe", "raw")
    for name in ("propel_azr", "propel_math"):
        assert parse_config([f"--config=configs/{name}.py"])[0].reward.probe.calibration == "auto"


def test_cold_transfer_grpo_step_cli(setup, tmp_path, capsys):
    from rossjax import cli

    work = str(tmp_path / "w")
    argv = ["grpo", "--config=configs/propel_azr.py:runlocal", f"--workdir={work}",
            f"--config.model.path={setup['policy']}", "--config.model.preset=",
            f"--config.reward.probe.path={setup['sweep']}/selected_probe",
            f"--config.reward.probe.reference.path={setup['ref']}",
            "--config.grpo.steps=1", "--config.grpo.max_new_tokens=8"]
    assert cli.main(argv) == 0
    assert f"read from the reference {setup['ref']}" in capsys.readouterr().err
    rows = [json.loads(x) for x in open(os.path.join(work, "history.jsonl"))]
    assert len(rows) == 16 and all(0 <= r["rewards"]["probe_score"] <= 1 for r in rows)
