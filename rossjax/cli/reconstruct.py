"""`rossjax reconstruct --config=configs/reconstruct.py [--workdir=DIR]`: reconstruct verified
tool-use trajectories from expert artifacts over a corpus (rossjax.reconstruct), for
`rossjax retrogen` to gate, threshold and serialize."""

from __future__ import annotations

import json
import os

from rossjax.cli.flags import parse_config, repo_config
from rossjax.errors import ConfigError


def tiny_model(folder: str) -> str:
    """A random tiny Qwen2-shaped model with the ASCII tokenizer (`:runlocal`'s model, built as
    `rossjax demo` builds its base model); built once per folder."""
    if not os.path.isfile(os.path.join(folder, "config.json")):
        from rossjax.demo import base_model
        from rossjax.tokenizers import load_tokenizer
        from rossjax.tokenizers.ascii import write_ascii_tokenizer

        os.makedirs(folder, exist_ok=True)
        write_ascii_tokenizer(folder)
        base_model(folder, load_tokenizer(folder).vocab_size)  # every id has text
    return folder


def main(argv=None) -> int:
    from rossjax.reconstruct.run import run

    cfg, fv, _ = parse_config(list(argv or []), default_config=repo_config("reconstruct.py"))
    out_dir = fv.workdir or cfg.output
    if not out_dir:
        raise ConfigError("reconstruct needs --workdir=DIR (or --config.output=DIR).")
    serve_model = None  # the config stays as parsed: the built folder is passed along
    if cfg.serve.model == "tiny":
        serve_model = tiny_model(os.path.join(out_dir, "tiny_model"))
    elif not cfg.serve.model and not cfg.endpoint.model:
        raise ConfigError("config.endpoint.model is empty: name the model the endpoint serves "
                          "(or set config.serve.model to a checkpoint to serve it locally).")
    report = run(cfg, out_dir, serve_model=serve_model)
    b = report["buckets"]
    why = {**report["reasons"]["withheld"], **report["reasons"]["invalid"]}
    print(json.dumps({"artifacts": report["input_rows"], **b, "resumed": report["resumed"],
                      "requests": report["requests"]["requests"],
                      "cache_hits": report["requests"]["cache_hits"]}))
    print(f"kept {b['kept']}, withheld {b['withheld']}, invalid {b['invalid']} "
          f"({', '.join(f'{k} {n}' for k, n in sorted(why.items())) or 'none'}) -> "
          f"{report['outputs']['trajectories']}")
    if b["kept"]:
        print(f"next: {report['next']}")
    else:  # the printed command would run on an empty file: say why there is nothing to pass on
        print(f"next: nothing yet: {report['outputs']['trajectories']} holds no trajectory, so "
              f"`rossjax retrogen` would read an empty file; each artifact's reason is in "
              f"{os.path.join(out_dir, report['outputs']['withheld'])} and invalid.jsonl")
    return 0
