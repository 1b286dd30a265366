"""`rossjax serve --model=DIR [--tokenizer=NAME|PATH] [--host=127.0.0.1] [--port=8000]`:
an OpenAI-compatible server (/v1/models, /v1/chat/completions, /v1/completions; /health,
/tokenize, /detokenize as vLLM's) on the rollout engine, for a local checkpoint (a training or
GRPO workdir: its latest checkpoint, or --step, as `rossjax generate` loads it; a Hugging Face
folder, a `rossjax export` folder, or preset:NAME with --tokenizer). Point an OpenAI client at
http://HOST:PORT/v1.

  --template=chatml|llama3|mistral|tokenizer   (default: the folder's own chat template, else chatml)
  --slots=16        KV-cache slots (concurrent sequences decoded together)
  --max_len=2048    cache columns per slot (prompt bucket + completion); /v1/models reports
                    it as max_model_len, and max_tokens may be at most it minus the prompt
  --step=N          a workdir's checkpoint step (default: the latest)
  --dtype=float32   compute dtype (bfloat16 on accelerators)
  --model_id=NAME   the id /v1/models reports and requests name (default: the folder's name)
  --noprefix_cache  prefill every prompt whole (default: reuse the KV of a prefix some slot's
                    cache holds; usage.prompt_tokens_details.cached_tokens counts it)
  --api_key=KEY     refuse requests without `Authorization: Bearer KEY` (401), as vLLM's
                    --api-key; default $ROSSJAX_API_KEY, else none. /health stays open.
Binds 127.0.0.1 unless --host says otherwise; another host without a key prints a warning.
"""

from __future__ import annotations

import os
import sys

from rossjax.cli.flags import parse_config
from rossjax.errors import UsageError


def _flags(fv):
    """serve's flags, defined on the one flag system every command parses with (cli/flags.py):
    the server takes no config file, so its settings are plain flags, as generate's are."""
    from absl import flags

    d = flags
    d.DEFINE_string("model", None, "Training/GRPO workdir, HF folder, `rossjax export` folder, "
                    "or preset:NAME.", flag_values=fv)
    d.DEFINE_integer("step", None, "Checkpoint step of a workdir (default: the latest).",
                     flag_values=fv)
    d.DEFINE_string("tokenizer", None, "Tokenizer spec (default: the folder's).", flag_values=fv)
    d.DEFINE_string("template", None, "chatml | llama3 | mistral | tokenizer (default: the "
                    "folder's own chat template, else chatml).", flag_values=fv)
    d.DEFINE_string("host", "127.0.0.1", "Address to bind.", flag_values=fv)
    d.DEFINE_integer("port", 8000, "Port to bind.", flag_values=fv)
    d.DEFINE_integer("slots", 16, "KV-cache slots (sequences decoded together).", flag_values=fv)
    d.DEFINE_integer("max_len", 2048, "Cache columns per slot.", flag_values=fv)
    d.DEFINE_string("dtype", "float32", "Compute dtype.", flag_values=fv)
    d.DEFINE_string("model_id", None, "The id /v1/models reports (default: the folder's name).",
                    flag_values=fv)
    d.DEFINE_boolean("prefix_cache", True, "Reuse the cached KV of a shared prompt prefix "
                     "(--noprefix_cache: prefill every prompt whole).", flag_values=fv)
    d.DEFINE_boolean("warmup", False, "Compile the programs a load meets before serving "
                     "(prefills of every size, decodes of every row count; 144 s on 2 CPU cores "
                     "for 32 slots x 512), so no request waits for a compile.",
                     flag_values=fv)
    d.DEFINE_string("api_key", None, "Bearer key requests must send (default $ROSSJAX_API_KEY).",
                    flag_values=fv)


def main(argv) -> int:
    _, args, extra = parse_config(list(argv), extra_flags=_flags)
    if extra or not args.model:
        raise UsageError(f"unknown flags {' '.join(extra)} (rossjax serve --help)" if extra else
                         "rossjax serve needs --model=DIR (or preset:NAME with --tokenizer).")
    if args.api_key == "":
        raise UsageError("rossjax serve: --api_key is empty; give a key or leave the flag out.")
    api_key = args.api_key or os.environ.get("ROSSJAX_API_KEY") or None
    from rossjax import serve

    server = serve.build(args.model, args.tokenizer, template=args.template, slots=args.slots,
                         max_len=args.max_len, model_id=args.model_id, dtype=args.dtype,
                         step=args.step, prefix_cache=args.prefix_cache, warmup=args.warmup)
    print(f"rossjax serve: {server.model_id} on http://{args.host}:{args.port}/v1 "
          f"({args.slots} slots x {args.max_len} tokens, template {server.template}, "
          f"prefix cache {'on' if args.prefix_cache else 'off'}, "
          f"{'API key required' if api_key else 'no API key'})", file=sys.stderr)
    warning = serve.exposure_warning(args.host, api_key)
    if warning:
        print(warning, file=sys.stderr)
    serve.serve(server, args.host, args.port, api_key=api_key)
    return 0
