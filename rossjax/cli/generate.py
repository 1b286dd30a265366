"""`rossjax generate --model=DIR (--prompts=FILE.jsonl | --prompt=TEXT | --message=TEXT) [--out=OUT.jsonl]`:
completions from a checkpoint on rossjax.sample.generate.

--model is a training or GRPO workdir (its latest checkpoint, or --step; LoRA adapters merged),
a Hugging Face folder or a `rossjax export --format orbax` folder. --prompts is JSONL: a row with
`messages` (or a TRL `prompt` message list) is a chat, rendered with --template up to the
assistant's turn; a row with a `prompt` string is raw text, completed as it is; `id` is kept.
--prompt=TEXT (raw) and --message=TEXT (one user turn) may repeat. Each completion is one JSON
line (to --out, else stdout): id, sample, prompt or messages, completion, finish_reason
(stop | length), completion_tokens. The tokenizer is the run's (the one `rossjax export` would
write), the folder's, or --tokenizer; the template is the run's, else the tokenizer's own chat
template, else chatml.
"""

from __future__ import annotations

import json
import sys

USAGE = ("usage: rossjax generate --model DIR (--prompts FILE.jsonl | --prompt TEXT | "
         "--message TEXT ...) [--out OUT.jsonl] [--max_new_tokens N] [--temperature T] "
         "[--top_p P] [--top_k K] [--num_samples N] [--seed S] [--tokenizer SPEC] "
         "[--template chatml|llama3|mistral|tokenizer] [--system TEXT] [--step N] [--dtype D]")


def _flags(fv):
    from absl import flags

    d = flags
    d.DEFINE_string("model", None, "Training/GRPO workdir, HF folder or orbax export folder.",
                    flag_values=fv)
    d.DEFINE_string("prompts", None, "JSONL of prompts: `messages` (chat) or `prompt` (raw text).",
                    flag_values=fv)
    d.DEFINE_multi_string("prompt", [], "A raw text prompt (repeatable).", flag_values=fv)
    d.DEFINE_multi_string("message", [], "One user message, a chat (repeatable).", flag_values=fv)
    d.DEFINE_string("out", None, "JSONL file for the completions (default: stdout).",
                    flag_values=fv)
    d.DEFINE_integer("max_new_tokens", 256, "Tokens per completion at most.", flag_values=fv)
    d.DEFINE_float("temperature", None, "0: greedy (default: greedy for one sample, 1.0 when "
                   "--num_samples asks for more, so they differ).", flag_values=fv)
    d.DEFINE_float("top_p", 1.0, "Nucleus sampling.", flag_values=fv)
    d.DEFINE_integer("top_k", 0, "0: off.", flag_values=fv)
    d.DEFINE_integer("num_samples", 1, "Completions per prompt.", flag_values=fv)
    d.DEFINE_integer("seed", 0, "Sampling seed.", flag_values=fv)
    d.DEFINE_integer("step", None, "Checkpoint step of a workdir (default: the latest).",
                     flag_values=fv)
    d.DEFINE_string("tokenizer", None, "Tokenizer spec (default: the run's or the folder's).",
                    flag_values=fv)
    d.DEFINE_string("template", None, "chatml | llama3 | mistral | tokenizer (default: the "
                    "run's, else the tokenizer's own, else chatml).", flag_values=fv)
    d.DEFINE_string("system", "", "A system message before each chat's turns.", flag_values=fv)
    d.DEFINE_string("dtype", "", "Compute dtype (default: the model's).", flag_values=fv)


def sampling_temperature(given: float | None, num_samples: int) -> tuple[float, str]:
    """The temperature to sample at and the banner's note: unset, one sample is greedy and
    several sample at 1.0 (greedy samples are all the same answer); greedy asked for several
    says so."""
    if given is None:
        if num_samples > 1:
            return 1.0, (f", sampling at temperature 1.0 (--num_samples={num_samples}; "
                         f"--temperature=0 is greedy)")
        return 0.0, ", greedy"
    if given == 0 and num_samples > 1:
        return 0.0, f", greedy: the {num_samples} samples of a prompt are the same answer"
    return given, f", temperature {given:g}"


def read_prompts(path: str) -> list[dict]:
    """[{id, messages} | {id, prompt}] from a JSONL file; a bad row is one sentence naming it."""
    from rossjax.curate.files import read_objects
    from rossjax.errors import InputError

    out = []
    for k, row in read_objects(path, id_field=None):
        rid = str(row.get("id", f"row{k}"))
        msgs = row.get("messages", row.get("prompt") if isinstance(row.get("prompt"), list)
                       else None)
        if isinstance(msgs, list) and msgs and all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content", ""), str) for m in msgs):
            out.append({"id": rid, "messages": msgs})
        elif isinstance(row.get("prompt"), str) and row["prompt"]:
            out.append({"id": rid, "prompt": row["prompt"]})
        else:
            raise InputError(f"{path} row {k}: field 'messages' (a non-empty list of "
                             f"{{role, content}} messages) or 'prompt' (a non-empty string) "
                             f"is needed")
    if not out:
        raise InputError(f"{path} holds no prompts")
    return out


def main(argv=None) -> int:
    from rossjax.cli.flags import parse_config
    from rossjax.errors import InputError, UsageError

    _, fv, rest = parse_config(list(argv or []), extra_flags=_flags)
    if rest or not fv.model or not (fv.prompts or fv.prompt or fv.message):
        raise UsageError(USAGE)
    if fv.num_samples < 1 or fv.max_new_tokens < 1:
        raise UsageError("--num_samples and --max_new_tokens must be at least 1")
    temperature, note = sampling_temperature(fv.temperature, fv.num_samples)
    rows = read_prompts(fv.prompts) if fv.prompts else []
    rows += [{"id": f"prompt{i}", "prompt": p} for i, p in enumerate(fv.prompt)]
    rows += [{"id": f"message{i}", "messages": [{"role": "user", "content": m}]}
             for i, m in enumerate(fv.message)]

    from rossjax.sample import generate
    from rossjax.templates import TEMPLATES, render_prompt
    from rossjax.tokenizers import load_tokenizer
    from rossjax.train.export.model import load_model_dir

    cfg, params, spec, run_template, what = load_model_dir(fv.model, fv.step, fv.dtype)
    spec = fv.tokenizer or spec
    if not spec:
        raise InputError(f"--model {fv.model}: no tokenizer is known for it; pass --tokenizer="
                         f"HF_DIR or a name such as qwen")
    tok = load_tokenizer(spec)
    template = fv.template or run_template or ("tokenizer" if tok.chat_template else "chatml")
    if template not in TEMPLATES:
        raise UsageError(f"--template {template!r} is not one of {', '.join(TEMPLATES)}")
    if tok.vocab_size > cfg.vocab_size:
        raise InputError(f"tokenizer {spec} has {tok.vocab_size} tokens but the model's "
                         f"vocabulary has {cfg.vocab_size}; pass the model's --tokenizer")
    texts = []
    for r in rows:
        if "messages" in r:
            msgs = ([{"role": "system", "content": fv.system}] if fv.system else []) + r["messages"]
            r["messages"] = msgs
            texts.append(render_prompt(msgs, template, tok))
        else:
            texts.append(r["prompt"])
    ids = [[int(t) for t in tok.encode(t)] for t in texts]
    stops = tuple(i for i in {tok.eos_id, tok.special_tokens.get("<|im_end|>")} if i is not None)
    print(f"rossjax generate: {what}, {len(rows)} prompts x {fv.num_samples}, up to "
          f"{fv.max_new_tokens} tokens, template {template}{note}.", file=sys.stderr)
    res = generate(cfg, params, ids, fv.max_new_tokens, temperature=temperature,
                   top_p=fv.top_p, top_k=fv.top_k, stop_ids=stops, num_samples=fv.num_samples,
                   seed=fv.seed)
    out = open(fv.out, "w", encoding="utf-8") if fv.out else sys.stdout
    try:
        for i, r in enumerate(rows):
            for j in range(fv.num_samples):
                k = i * fv.num_samples + j
                seq = res.tokens[k, :res.lengths[k]].tolist()
                body = seq[:-1] if res.finish_reason[k] == "stop" and seq else seq
                line = {"id": r["id"], "sample": j,
                        **({"messages": r["messages"]} if "messages" in r else {"prompt": r["prompt"]}),
                        "completion": tok.decode(body), "finish_reason": res.finish_reason[k],
                        "completion_tokens": len(seq)}
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
    finally:
        if fv.out:
            out.close()
    if fv.out:
        print(f"rossjax generate: {len(rows) * fv.num_samples} completions written to {fv.out}.",
              file=sys.stderr)
    return 0
