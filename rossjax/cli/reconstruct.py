"""`rossjax reconstruct --config=configs/reconstruct.py [--workdir=DIR]`: reconstruct verified
tool-use trajectories from expert artifacts over a corpus (rossjax.reconstruct), for
`rossjax retrogen` to gate, threshold and serialize.

The stages, per artifact (RetroGen; docs/retrogen.md): (1) anchor: cues are read from the
artifact y* (rules, then the model), the model writes a rubric in the paper's categories
(coverage, structure, synthesis, citation) and then the task x-hat an expert was given, which
the leak rules keep free of y*'s content, and BM25 retrieval conditioned on y* gathers the
evidence set E-hat from the corpus; (2) trace: the agent plans, then takes one step a request
(search, open, extract, compare, outline, draft) on the corpus, seeing x-hat, E-hat's ids and
titles and the tool observations, never y*, within 30 tool steps and an 8,000-character
window; (3) verify: four judge requests score the rubric, the quality against y*, the
grounding of each claim in E-hat and the workflow's consistency, and Eq. 4 averages them. Each
artifact ends kept (WORKDIR/trajectories.jsonl), withheld or invalid with a reason. With
config.then_retrogen the kept records are gated, thresholded and serialized into SFT rows
(WORKDIR/retrogen); with config.then_sft those rows are curated and a model is trained on them
(WORKDIR/curated, WORKDIR/sft). `:runlocal` does all of it offline, against a rule-driven
stand-in endpoint that is not a model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

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


def _command(args: list[str], say) -> None:
    from rossjax.cli import main as dispatch

    say("$ rossjax " + " ".join(args))
    rc = dispatch(list(args))
    if rc:
        raise ConfigError(f"config.then_sft: `rossjax {args[0]}` exited {rc} (its message is "
                          f"above); the SFT rows are in place, rerun the command by hand")


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def sft_chain(rows: str, out_dir: str, sft, *, base: str | None = None, say=print) -> dict:
    """Curate `rows` (rossjax retrogen's SFT rows) as recipe positive_sft with the base model's
    tokenizer into OUT/curated, then `rossjax train --config=configs/<sft.config>` from the base
    model into OUT/sft (and `rossjax export` it to OUT/sft/hf with sft.export), each command run
    through the dispatcher in this process, as typed. `base`: the model folder to start from
    (default sft.base, "tiny" = a random tiny model built in OUT/tiny_model). The same rows and
    settings as a finished earlier chain reuse its result (OUT/sft/chain.json)."""
    from rossjax.monitor import read_metrics

    base = base or (tiny_model(os.path.join(out_dir, "tiny_model")) if sft.base == "tiny"
                    else sft.base)
    if not os.path.isdir(base):
        raise ConfigError(f"config.sft.base: {base} is not a model folder (or 'tiny')")
    name, _, variant = sft.config.partition(":")
    cur, work = os.path.join(out_dir, "curated"), os.path.join(out_dir, "sft")
    hf = os.path.join(work, "hf") if sft.export else None
    key = {"rows_sha256": _sha(rows), "base": os.path.abspath(base), "config": sft.config,
           "epochs": sft.epochs, "num_steps": sft.num_steps, "export": bool(sft.export)}
    marker = os.path.join(work, "chain.json")
    if os.path.isfile(marker):
        with open(marker) as f:
            old = json.load(f)
        if old.get("key") == key:
            say(f"sft: the rows and settings of the finished run in {work} are unchanged; "
                f"kept it (delete {work} to train again)")
            return {**old["result"], "resumed": True}
    for d in (cur, work):  # this chain's own outputs of an earlier run: rows or settings changed
        shutil.rmtree(d, ignore_errors=True)
    _command(["curate", f"--config={repo_config('curate.py')}", f"--config.input={rows}",
              "--config.recipe=positive_sft", f"--config.tokenizer={base}",
              f"--config.output={cur}", "--config.progress=False"], say)
    with open(os.path.join(cur, "report.json")) as f:
        curated = json.load(f)
    train = ["train", f"--config={repo_config(name)}" + (f":{variant}" if variant else ""),
             f"--config.model.path={base}", f"--config.data.train={cur}",
             f"--config.train.epochs={sft.epochs}", f"--workdir={work}"]
    if sft.num_steps > 0:
        train.append(f"--config.train.num_steps={sft.num_steps}")
    _command(train, say)
    if hf:
        _command(["export", f"--checkpoint={work}", "--format=hf", hf], say)
    losses = [r["loss"] for r in read_metrics(work)]
    result = {"base": base, "curated": cur, "rows": curated["buckets"]["kept"],
              "supervised_tokens": curated["tokens"]["kept_supervised"], "workdir": work,
              "steps": len(losses), "loss_first": round(losses[0], 4) if losses else None,
              "loss_last": round(losses[-1], 4) if losses else None, "model": hf,
              "resumed": False}
    with open(marker, "w") as f:
        json.dump({"key": key, "result": result}, f, indent=2)
    return result


def summary(out_dir: str, report: dict) -> list[str]:
    """Where each output of the run is, one line each."""
    rg, sft = report.get("retrogen"), report.get("sft")
    lines = [f"  trajectories  {report['outputs']['trajectories']} ({report['buckets']['kept']} "
             f"kept; withheld.jsonl, invalid.jsonl, transcripts.jsonl beside it)"]
    if rg:
        lines.append(f"  SFT rows      {rg['rows']} ({rg['kept']} kept, {rg['discarded']} "
                     f"discarded by the gate and thresholds "
                     f"{', '.join(f'{d} {t:g}' for d, t in sorted(rg['thresholds'].items()))})")
    if sft:
        lines += [f"  curated       {sft['curated']} ({sft['rows']} rows, "
                  f"{sft['supervised_tokens']} supervised tokens)",
                  f"  trained       {sft['workdir']} ({sft['steps']} steps from {sft['base']}, "
                  f"loss {sft['loss_first']} -> {sft['loss_last']}; checkpoints/, metrics.jsonl)"]
        if sft.get("model"):
            lines.append(f"  model         {sft['model']} (Hugging Face folder)")
    lines.append(f"  report        {os.path.join(out_dir, 'report.json')}")
    return lines


def main(argv=None) -> int:
    from rossjax.curate.ledger import write_json
    from rossjax.reconstruct.run import run

    cfg, fv, _ = parse_config(list(argv or []), default_config=repo_config("reconstruct.py"))
    out_dir = fv.workdir or cfg.output
    if not out_dir:
        raise ConfigError("reconstruct needs --workdir=DIR (or --config.output=DIR).")
    if cfg.then_sft and not cfg.then_retrogen:
        raise ConfigError("config.then_sft trains on the rows config.then_retrogen writes: set "
                          "both, or neither")
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
    rg = report.get("retrogen")
    if rg:
        print(f"retrogen: kept {rg['kept']}, discarded {rg['discarded']} -> {rg['rows']}")
    if cfg.then_sft and rg and rg["kept"]:
        report["sft"] = sft_chain(rg["rows"], out_dir, cfg.sft)
        write_json(os.path.join(out_dir, "report.json"), report)
    elif cfg.then_sft:
        print("sft: not run: no SFT row was kept, so there is nothing to train on")
    if b["kept"]:
        print(f"next: {report['next']}" if not report.get("sft") else "done; outputs:")
    else:  # the printed command would run on an empty file: say why there is nothing to pass on
        print(f"next: nothing yet: {report['outputs']['trajectories']} holds no trajectory, so "
              f"`rossjax retrogen` would read an empty file; each artifact's reason is in "
              f"{os.path.join(out_dir, report['outputs']['withheld'])} and invalid.jsonl")
    if report.get("sft"):
        print("\n".join(summary(out_dir, report)))
    return 0
