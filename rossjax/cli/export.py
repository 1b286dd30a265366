"""`rossjax export --checkpoint DIR [--step N] [--format hf|orbax|peft] [--dtype D]
[--tokenizer HF_DIR|NAME|none] OUT` (or `--workdir=OUT`): write a training run's weights as a
Hugging Face folder with a working tokenizer, chat template and generation config (hf), an orbax
params folder (orbax), or a LoRA run's adapters in PEFT format (peft)."""

from __future__ import annotations

USAGE = ("usage: rossjax export --checkpoint DIR [--step N] [--format hf|orbax|peft] "
         "[--dtype float32|bfloat16|float16] [--tokenizer HF_DIR|NAME|none] OUT")


def main(argv=None) -> int:
    from absl import flags

    from rossjax.cli.flags import parse_config
    from rossjax.errors import UsageError

    def extra(fv):
        flags.DEFINE_string("checkpoint", None, "Training workdir or checkpoint folder.", flag_values=fv)
        flags.DEFINE_enum("format", "hf", ["hf", "orbax", "peft"],
                          "hf: transformers/vLLM folder; orbax: params for --config.model.path; "
                          "peft: a LoRA run's adapters (adapter_config.json + "
                          "adapter_model.safetensors).", flag_values=fv)
        flags.DEFINE_integer("step", None, "Step to export (default: the latest).", flag_values=fv)
        flags.DEFINE_enum("dtype", None, ["float32", "bfloat16", "float16"],
                          "Weight dtype (default: the base model folder's dtype, else the run's "
                          "parameter dtype).", flag_values=fv)
        flags.DEFINE_string("tokenizer", None, "HF model folder, tokenizer.json or tokenizer "
                            "name (qwen, ...) the export carries with a chat template and "
                            "generation config (default: the LoRA run's base, else the run's "
                            "model.path, else the tokenizer the run trained with; none found is "
                            "an error); 'none': the weights alone.", flag_values=fv)

    _, fv, rest = parse_config(list(argv or []), extra_flags=extra)
    out = rest[0] if len(rest) == 1 else (fv.workdir if not rest else None)
    if not fv.checkpoint or not out:
        raise UsageError(USAGE)
    from rossjax.train.export.model import export

    step = export(fv.checkpoint, out, fv.format, fv.step, dtype=fv.dtype, tokenizer=fv.tokenizer)
    print(f"rossjax export: step {step} of {fv.checkpoint} written to {out} ({fv.format}).")
    return 0
