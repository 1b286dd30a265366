"""The TRL side of `rossjax bench distill --peer trl`, run by the python of an environment with
TRL (rossjax/bench/distill.py starts it in a child process): `python -P distill_trl_child.py
SPEC.json` prints one JSON line {"times", "lengths" (mean completion tokens a step), "loss0",
"grad_norm0", "versions", "threads"}.

SPEC: student / teacher Hugging Face folders, the prompt token ids of every step (each prompt
repeated `group` times, consecutive rows), the new-token limit, steps, learning rate, and the
fixed sameness rows (tokens, their length, the prompt length). GKDTrainer runs with lmbda = 1
(every step samples from the student), beta = 1 (the generalized JSD's reverse-KL end), seq_kd
off, stops at the tokenizer's eos (as rossjax's sampler does), temperature 1 (GKD's loss divides the logits by 1 whatever the sampling temperature, so 1
is the one setting where the sampled and the scored distributions agree), no gradient
checkpointing, one micro-batch, fp32, AdamW at a constant rate. The prompts come already
tokenized (the rossjax side's ids), left-padded by a small collator in place of GKD's chat one.
Imports nothing from rossjax.
"""

from __future__ import annotations

import json
import sys
import time


def main(spec_path: str) -> int:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    with open(spec_path) as f:
        spec = json.load(f)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(spec["student"])
    pad = tok.pad_token_id

    def collate(rows):
        width = max(len(r["prompt_ids"]) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["prompt_ids"])
            ids[i, width - n:] = torch.tensor(r["prompt_ids"])
            att[i, width - n:] = 1
        # no "labels": the trainer would count the prompt batch's tokens as the loss's divisor;
        # GKD's training_step sets the generated rows' labels itself
        return {"prompts": ids, "prompt_attention_mask": att, "input_ids": ids,
                "attention_mask": att}

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

    rows = len(spec["prompts"]) // spec["steps"]
    conf = GKDConfig(
        output_dir=spec["workdir"], per_device_train_batch_size=rows,
        gradient_accumulation_steps=1, lmbda=1.0, beta=1.0, seq_kd=False, temperature=1.0,
        max_new_tokens=spec["new_tokens"], learning_rate=spec["lr"], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_steps=spec["steps"], use_cpu=True, bf16=False,
        fp16=False, gradient_checkpointing=False, save_strategy="no", report_to="none",
        logging_steps=10_000, disable_dropout=True, seed=0, dataloader_num_workers=0,
        dataloader_drop_last=True)
    student = AutoModelForCausalLM.from_pretrained(spec["student"], dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(spec["teacher"], dtype=torch.float32)
    # stop at the tokenizer's eos as rossjax's sampler does (the folder's config names none,
    # and GKD takes its stop token from the model's generation config)
    student.generation_config.eos_token_id = tok.eos_token_id
    lengths: list[float] = []
    generate = GKDTrainer.generate_on_policy_outputs

    def counted(model, inputs, generation_config):
        ids, att, labels = generate(model, inputs, generation_config)
        lengths.append(float((labels != -100).sum(1).float().mean()))
        return ids, att, labels

    GKDTrainer.generate_on_policy_outputs = staticmethod(counted)
    data = Dataset.from_list([{"prompt_ids": p} for p in spec["prompts"]])
    trainer = GKDTrainer(model=student, teacher_model=teacher, args=conf, processing_class=tok,
                         train_dataset=data, data_collator=collate, callbacks=[Clock()])
    # in order: the rows are the rossjax side's prompts, step by step
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(data)

    # Sameness: GKD's own loss (compute_loss) on the fixed rows, before any update.
    same = spec["same"]
    ids = torch.tensor(same["tokens"], dtype=torch.long)
    att = torch.zeros_like(ids)
    labels = ids.clone()
    for i, n in enumerate(same["lengths"]):
        att[i, :n] = 1
        labels[i, n:] = -100
    labels[:, :same["prompt_len"]] = -100
    student.train()
    loss = trainer.compute_loss(student, {"input_ids": ids, "attention_mask": att,
                                          "labels": labels})
    loss.backward()
    gnorm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in student.parameters()
                           if p.grad is not None))
    student.zero_grad(set_to_none=True)

    trainer.train()
    print(json.dumps({"times": times, "lengths": lengths, "loss0": float(loss), "grad_norm0": float(gnorm),
                      "threads": torch.get_num_threads(),
                      "versions": f"trl {trl.__version__}, torch {torch.__version__}, "
                                  f"transformers {transformers.__version__}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
