"""`rossjax export` gives folders other tools load as is: transformers' AutoTokenizer (tokenizer
files, chat template, generation config copied from the base), the chosen dtype, and a LoRA run's
adapters in PEFT format that `peft` loads onto the base with the merged export's logits."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
from hf_tiny import make_tiny_hf
from xla_flags import xla_flags

from rossjax.models import lora
from rossjax.models.hf import read_hf_config
from rossjax.train import checkpoint as ckpt_lib
from rossjax.train.export.model import export

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _base(path):
    """A tiny random Qwen2 folder with a real tokenizer, chat template and generation config."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    make_tiny_hf("qwen2", path)
    words = ["<unk>", "<eos>", "<|user|>", "<|assistant|>"] + [f"w{i}" for i in range(100)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>",
                            chat_template=TEMPLATE).save_pretrained(str(path))
    GenerationConfig(eos_token_id=1, max_new_tokens=7, do_sample=False).save_pretrained(str(path))
    return path


def _lora_run(workdir, base, step=5, targets=("q", "k", "v", "o", "gate", "up", "down")):
    """A LoRA run's workdir as the trainers leave it: model_config.json, lora.json and one
    checkpoint of adapters (b drawn non-zero so the adapters change the logits)."""
    cfg = read_hf_config(str(base))
    ad = lora.init_lora(cfg, jax.random.key(1), rank=4, targets=targets)
    ad = jax.tree.map(lambda x: np.asarray(x) + 0.05 * np.random.default_rng(0).standard_normal(
        x.shape).astype(np.float32), ad)
    os.makedirs(workdir, exist_ok=True)
    ckpt_lib.write_model_config(str(workdir), cfg)
    ckpt_lib.write_lora_manifest(str(workdir), rank=4, alpha=8.0, targets=targets,
                                 base_source="hf", base_path=str(base), seed=0)
    ck = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
    ck.save(step, {"params": ad}, force=True)
    ck.close()
    return workdir


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    base = _base(tmp / "base")
    return base, _lora_run(tmp / "run", base)


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


def test_hf_export_carries_tokenizer_template_and_generation_config(run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    base, workdir = run
    out = tmp_path / "hf"
    assert export(str(workdir), str(out), "hf") == 5
    tok = AutoTokenizer.from_pretrained(str(out))
    ref = AutoTokenizer.from_pretrained(str(base))
    msgs = [{"role": "user", "content": "w3 w4"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert tok(text)["input_ids"] == ref(text)["input_ids"] and tok.eos_token == "<eos>"
    assert GenerationConfig.from_pretrained(str(out)).max_new_tokens == 7
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.dtype == torch.float32  # the base's dtype by default


def test_dtype_flag_sets_weights_and_config(run, tmp_path):
    _, workdir = run
    out = tmp_path / "bf16"
    export(str(workdir), str(out), "hf", dtype="bfloat16")
    header = _header(out / "model.safetensors")  # every tensor is stored as BF16
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    assert json.load(open(out / "config.json"))["torch_dtype"] == "bfloat16"
    with pytest.raises(Exception, match="--dtype 'int8'"):
        export(str(workdir), str(tmp_path / "x"), "hf", dtype="int8")


def _header(path) -> dict:
    """The safetensors header: tensor name -> dtype, shape, offsets."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def test_peft_adapters_load_onto_the_base_with_the_merged_logits(run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, workdir = run
    export(str(workdir), str(tmp_path / "peft"), "peft")
    export(str(workdir), str(tmp_path / "merged"), "hf")
    cfg = json.load(open(tmp_path / "peft" / "adapter_config.json"))
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8.0
    ids = [[3, 10, 11, 12, 40, 7, 2, 9]]
    plain = AutoModelForCausalLM.from_pretrained(str(base))
    before = _logits(plain, ids)
    peft_model = PeftModel.from_pretrained(plain, str(tmp_path / "peft")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    got, want = _logits(peft_model, ids), _logits(merged, ids)
    assert np.abs(got - before).max() > 1e-2  # the adapters do change the model
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_peft_needs_a_lora_run(tmp_path):
    from rossjax.errors import InputError

    cfg = read_hf_config(str(_base(tmp_path / "base")))
    os.makedirs(tmp_path / "run")
    ckpt_lib.write_model_config(str(tmp_path / "run"), cfg)
    ck = ckpt_lib.Checkpointer(str(tmp_path / "run" / "checkpoints"), async_save=False)
    ck.save(1, {"params": {"embed": {"embedding": np.zeros((2, 2), np.float32)}}}, force=True)
    ck.close()
    with pytest.raises(InputError, match="not a LoRA run"):
        export(str(tmp_path / "run"), str(tmp_path / "out"), "peft")


def test_cli_export_journey(run, tmp_path):
    """The real CLI in a subprocess: export float16 to --workdir, then AutoTokenizer loads it."""
    _, workdir = run
    out = tmp_path / "cli"
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    env["XLA_FLAGS"] = xla_flags()
    r = subprocess.run([sys.executable, "-m", "rossjax.cli", "export", f"--checkpoint={workdir}",
                        "--dtype=float16", f"--workdir={out}"], env=env, capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "step 5" in r.stdout
    code = ("from transformers import AutoTokenizer, AutoModelForCausalLM; import sys; "
            f"t = AutoTokenizer.from_pretrained({str(out)!r}); "
            f"m = AutoModelForCausalLM.from_pretrained({str(out)!r}); "
            "print(t.chat_template is not None, m.dtype)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.split() == ["True", "torch.float16"], r.stderr[-2000:]


def test_sft_lora_run_exports_adapters_peft_loads(tmp_path):
    """`rossjax train --config.lora.enabled=True`: the SFT step trains adapters only on the
    frozen HF base; lora.json is written, and the peft export matches the merged one."""
    from peft import PeftModel
    from test_sft_loop import write_curated
    from transformers import AutoModelForCausalLM

    from rossjax import cli
    from rossjax.train.export.model import restore_params

    base = _base(tmp_path / "base")
    data = write_curated(tmp_path / "data", n=40, vocab=104)
    work = tmp_path / "run"
    assert cli.main(["train", f"--config={ROOT}/configs/ross_sft.py:runlocal",
                     f"--config.model.path={base}", f"--config.data.train={data}",
                     "--config.lora.enabled=True", "--config.lora.rank=4",
                     "--config.lora.targets=q,v,up", "--config.train.epochs=10",
                     "--config.train.num_steps=3",
                     # runlocal's 1,280 would put a step's 8 rows of 20-60 tokens in one
                     # mostly-padding packed row; 128 packs them into 3-4 rows
                     "--config.data.seq_len=128",
                     "--config.optim.peak_lr=0.05", f"--workdir={work}"]) == 0
    manifest = json.load(open(work / "lora.json"))
    assert manifest["base_source"] == "hf" and manifest["rank"] == 4
    step, adapters = restore_params(str(work / "checkpoints"))
    assert step == 3 and "embed" not in adapters  # the checkpoint holds adapters only
    assert sorted(adapters["layers"]["attn"]) == ["q", "v"]
    assert np.abs(adapters["layers"]["mlp"]["up"]["b"]).max() > 0  # b starts at 0: it trained
    export(str(work), str(tmp_path / "peft"), "peft")
    export(str(work), str(tmp_path / "merged"), "hf")
    ids = [[3, 10, 11, 12, 40, 7, 2, 9]]
    plain = AutoModelForCausalLM.from_pretrained(str(base))
    peft_model = PeftModel.from_pretrained(plain, str(tmp_path / "peft")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    np.testing.assert_allclose(_logits(peft_model, ids), _logits(merged, ids), atol=1e-4,
                               rtol=1e-4)


def test_every_export_carries_a_working_tokenizer_or_says_why(tmp_path):
    """A run on the ascii tokenizer (GRPO's WORKDIR/tokenizer) exports an HF tokenizer with a
    chat template that renders what rossjax trained on; an SFT run on data curated with `qwen`
    gets Qwen's tokenizer.json (the same ids as rossjax's); a run with no known tokenizer is an
    error naming --tokenizer, and --tokenizer=none writes the weights alone."""
    from transformers import AutoTokenizer, GenerationConfig

    from rossjax.templates import render_chat
    from rossjax.tokenizers import load_tokenizer
    from rossjax.tokenizers.ascii import write_ascii_tokenizer

    base = _base(tmp_path / "base")
    run = _lora_run(tmp_path / "run", base)
    os.remove(os.path.join(run, "lora.json"))  # a full-weights run of the same model
    cfg = read_hf_config(str(base))
    ck = ckpt_lib.Checkpointer(os.path.join(run, "checkpoints"), async_save=False)
    from rossjax import models

    ck.save(6, {"params": models.init_params(cfg, jax.random.key(0))}, force=True)
    ck.close()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}]

    write_ascii_tokenizer(os.path.join(run, "tokenizer"))  # what a GRPO run on ascii leaves
    json.dump({"tokenizer": "ascii", "template": "chatml", "model": {"path": ""}},
              open(os.path.join(run, "config.json"), "w"))
    export(str(run), str(tmp_path / "a"), "hf")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "a"))
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == render_chat(msgs, "chatml").text + "<|im_start|>assistant\n"
    ours = load_tokenizer(os.path.join(run, "tokenizer"))
    assert tok(text)["input_ids"] == list(ours.encode(text)) and tok.eos_token == "<|im_end|>"
    assert GenerationConfig.from_pretrained(str(tmp_path / "a")).eos_token_id == 130

    curated = tmp_path / "curated"
    os.makedirs(curated)
    json.dump({"config": {"tokenizer": "qwen", "template": "chatml"}},
              open(curated / "report.json", "w"))
    json.dump({"model": {"path": ""}, "data": {"train": str(curated)}},
              open(os.path.join(run, "config.json"), "w"))
    export(str(run), str(tmp_path / "q"), "hf")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "q"))
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert tok(text)["input_ids"] == list(load_tokenizer("qwen").encode(text))

    json.dump({"model": {"path": ""}}, open(os.path.join(run, "config.json"), "w"))
    r = subprocess.run([sys.executable, "-m", "rossjax.cli", "export", f"--checkpoint={run}",
                        str(tmp_path / "none")], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
    assert r.returncode == 2 and "no tokenizer found" in r.stderr and "--tokenizer=none" in r.stderr
    assert not os.path.exists(tmp_path / "none")  # refused before writing anything
    export(str(run), str(tmp_path / "bare"), "hf", tokenizer="none")
    assert sorted(os.listdir(tmp_path / "bare")) == ["config.json", "model.safetensors"]
