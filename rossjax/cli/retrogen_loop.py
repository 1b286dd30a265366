"""`rossjax retrogen-loop --config=configs/reconstruct.py:runlocal --workdir=DIR
[--config.loop.rounds=N] [--config.loop.endpoint=served|standin]`: RetroGen as an iterative
loop. Each round reconstructs the artifacts (`rossjax reconstruct`'s run), gates, thresholds and
serializes the kept trajectories (`rossjax retrogen`), curates them and trains on them
(`rossjax curate`, `rossjax train`, `rossjax export`); the next round reconstructs again with
the model that round trained, served by `rossjax serve` on 127.0.0.1 (loop.endpoint=served), or
with the rule-driven stand-in again (loop.endpoint=standin). Round 1 uses the configured
endpoint (`:runlocal`: the stand-in, not a model) and trains from config.sft.base; round r
trains from round r-1's model. A round that keeps no SFT row trains nothing, and the loop stops
there: a later round would serve the same model again. Every round's figures (the endpoint it
used, kept / withheld / invalid and why, signal means, thresholds, SFT rows and loss) go to
DIR/report.json and DIR/report.md, rewritten after each round; round r's outputs are in
DIR/round_r (a rerun resumes: journaled artifacts are not asked again, a finished SFT is kept).
"""

from __future__ import annotations

import json
import os
import time

from rossjax.cli.flags import parse_config, repo_config
from rossjax.cli.reconstruct import sft_chain, tiny_model
from rossjax.errors import ConfigError, InputError

ENDPOINTS = ("served", "standin")
SIGNALS = ("rubric", "quality", "grounding", "consistency")


def round_config(cfg, r: int, served: str | None):
    """Round r's copy of the config (the given one is never written): the seed moved by r - 1,
    the SFT model exported for the next round, for a served round the folder to serve and its
    answer budget, for a later round of loop.endpoint=standin the stand-in."""
    import ml_collections

    c = ml_collections.ConfigDict(cfg.to_dict())
    c.seed = cfg.seed + r - 1
    c.sft.export = True
    if r > 1 and cfg.loop.endpoint == "standin":  # whatever round 1 used
        c.serve.model = "standin"
    if served:
        c.serve.model, c.serve.model_id = served, f"round{r - 1}-sft"
        c.endpoint.model = ""
        c.endpoint.max_tokens = cfg.loop.max_tokens
    return c


def _means(scores: dict) -> dict:
    """Each signal's and Eq. 4's mean over the kept records of every domain."""
    n = sum(d["kept"] for d in scores.values())
    if not n:
        return {}
    return {k: round(sum(d[k] * d["kept"] for d in scores.values()) / n, 4)
            for k in (*SIGNALS, "eq4")}


def endpoint_of(report: dict, served: str | None) -> dict:
    m = report["model"]
    if m.get("standin"):
        kind, note = "standin", m["standin"]
    elif served:
        kind, note = "served", (f"the model the round before trained ({served}), served by "
                                f"`rossjax serve` on 127.0.0.1")
    else:
        kind, note = "configured", f"the endpoint the config names ({m['url']})"
    return {"kind": kind, "model": m["model"], "note": note}


def one_round(cfg, r: int, root: str, served: str | None, base: str | None, say) -> dict:
    from rossjax.reconstruct.run import run

    c = round_config(cfg, r, served)
    rdir = os.path.join(root, f"round_{r}")
    t0 = time.perf_counter()
    entry = {"round": r, "seed": c.seed, "workdir": rdir}
    say(f"round {r}: reconstruct with "
        + (f"the round-{r - 1} model served from {served}" if served else
           "the stand-in endpoint (rules, NOT a model)" if c.serve.model == "standin" else
           f"endpoint {c.endpoint.model or c.serve.model}"))
    serve_model = tiny_model(os.path.join(rdir, "tiny_model")) if c.serve.model == "tiny" else None
    try:
        rep = run(c, rdir, serve_model=serve_model)
    except InputError as e:  # the endpoint could not be served or answered nothing
        entry.update(endpoint={"kind": "served" if served else "configured",
                               "model": c.serve.model_id if served else c.endpoint.model,
                               "note": "failed before any artifact settled"},
                     error=str(e), elapsed_s=round(time.perf_counter() - t0, 1))
        return entry
    rg = rep.get("retrogen") or {}
    entry.update(
        endpoint=endpoint_of(rep, served), buckets=rep["buckets"],
        reasons={**rep["reasons"]["withheld"], **rep["reasons"]["invalid"]},
        requests=rep["requests"]["requests"], signals=_means(rep["scores"]),
        ended_at={k: v["ended"] for k, v in rep["stages"].items() if v.get("ended")},
        signals_by_domain=rep["scores"], thresholds=rg.get("thresholds", {}),
        sft_rows=rg.get("kept", 0), discarded=rg.get("discarded", 0))
    if entry["sft_rows"]:
        entry["sft"] = sft_chain(rg["rows"], rdir, c.sft, base=base, say=say)
    else:
        entry["sft"] = {"skipped": "no SFT row was kept: nothing to train on"}
    entry["elapsed_s"] = round(time.perf_counter() - t0, 1)
    return entry


def run_loop(cfg, root: str, say=print) -> dict:
    from rossjax import runlock
    from rossjax.curate.ledger import write_json

    if cfg.loop.rounds < 1:
        raise ConfigError(f"config.loop.rounds must be >= 1, got {cfg.loop.rounds}")
    if cfg.loop.endpoint not in ENDPOINTS:
        raise ConfigError(f"config.loop.endpoint {cfg.loop.endpoint!r} must be one of "
                          f"{', '.join(ENDPOINTS)}")
    if cfg.loop.max_tokens < 1:
        raise ConfigError(f"config.loop.max_tokens must be >= 1, got {cfg.loop.max_tokens}")
    if not cfg.then_retrogen:
        raise ConfigError("retrogen-loop trains on the rows config.then_retrogen writes: set "
                          "--config.then_retrogen=True (on in :runlocal)")
    lock = runlock.acquire(root, "rossjax retrogen-loop")
    try:
        out = {"rounds_asked": cfg.loop.rounds, "loop_endpoint": cfg.loop.endpoint,
               "rounds": [], "stopped": None}
        served = base = None
        for r in range(1, cfg.loop.rounds + 1):
            entry = one_round(cfg, r, root, served, base, say)
            out["rounds"].append(entry)
            model = (entry.get("sft") or {}).get("model")
            if entry.get("error"):
                out["stopped"] = f"round {r} failed: {entry['error']}"
            elif not model and r < cfg.loop.rounds:
                out["stopped"] = (f"round {r} kept no SFT row, so it trained no new model; a "
                                  f"later round would reconstruct with the same model again")
            write_json(os.path.join(root, "report.json"), out)
            write_markdown(os.path.join(root, "report.md"), out)
            say(f"round {r}: {line(entry)}")
            if out["stopped"]:
                break
            base = model
            served = model if cfg.loop.endpoint == "served" else None
        return out
    finally:
        if lock is not None:
            lock.release()


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def line(e: dict) -> str:
    if e.get("error"):
        return f"{e['endpoint']['kind']} endpoint; failed: {e['error']}"
    b, s = e["buckets"], e.get("sft") or {}
    loss = (f"SFT {s['steps']} steps, loss {_f(s['loss_first'])} -> {_f(s['loss_last'])}"
            if "steps" in s else f"no SFT ({s.get('skipped')})")
    why = ", ".join(f"{k} {n}" for k, n in sorted(e["reasons"].items())) or "none"
    where = "; ".join(f"{n} at stage {st}" for st, c in sorted((e.get("ended_at") or {}).items())
                      for n in [sum(c.values())])
    return (f"{e['endpoint']['kind']} endpoint ({e['endpoint']['model']}); kept {b['kept']}, "
            f"withheld {b['withheld']}, invalid {b['invalid']} ({why}"
            + (f"; {where}" if where else "") + "); SFT rows "
            f"{e['sft_rows']}; {loss}")


def write_markdown(path: str, out: dict) -> None:
    rows = ["| round | endpoint | model | kept / withheld / invalid | s_rub | s_qual | s_grd | "
            "s_con | Eq. 4 | thresholds | SFT rows | SFT steps | SFT loss first -> last |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    for e in out["rounds"]:
        ep = e["endpoint"]
        notes.append(f"- Round {e['round']} ({e['workdir']}, seed {e['seed']}): {ep['note']}. "
                     + (f"Failed: {e['error']}" if e.get("error") else line(e)) + ".")
        if e.get("error"):
            rows.append(f"| {e['round']} | {ep['kind']} | {ep['model']} | failed |"
                        + " - |" * 9)
            continue
        b, sig, s = e["buckets"], e["signals"], e.get("sft") or {}
        th = ", ".join(f"{d} {t:g}" for d, t in sorted(e["thresholds"].items())) or "-"
        rows.append(
            f"| {e['round']} | {ep['kind']} | {ep['model']} | {b['kept']} / {b['withheld']} / "
            f"{b['invalid']} | " + " | ".join(_f(sig.get(k)) for k in (*SIGNALS, "eq4"))
            + f" | {th} | {e['sft_rows']} | {_f(s.get('steps'))} | "
              f"{_f(s.get('loss_first'))} -> {_f(s.get('loss_last'))} |")
    text = ["# RetroGen loop", "",
            f"{len(out['rounds'])} of {out['rounds_asked']} rounds run; rounds after the first "
            f"use the {out['loop_endpoint']} endpoint "
            + ("(the model the round before trained, served by `rossjax serve`)."
               if out["loop_endpoint"] == "served" else "(the rule-driven stand-in, NOT a model)."),
            "", *rows, "", "Signal means are over the kept trajectories of every domain; a "
            "round that kept none has none. A stand-in round's figures measure its rules, not "
            "a model.", "", *notes]
    if out["stopped"]:
        text += ["", f"Stopped: {out['stopped']}."]
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write("\n".join(text) + "\n")
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    cfg, fv, _ = parse_config(list(argv or []), default_config=repo_config("reconstruct.py"))
    root = fv.workdir or cfg.output
    if not root:
        raise ConfigError("retrogen-loop needs --workdir=DIR (or --config.output=DIR).")
    if not cfg.serve.model and not cfg.endpoint.model:
        raise ConfigError("config.endpoint.model is empty: name round 1's model (or use "
                          "configs/reconstruct.py:runlocal, whose round 1 is the stand-in).")
    out = run_loop(cfg, root)
    print(json.dumps({"rounds": len(out["rounds"]), "stopped": out["stopped"],
                      "report": os.path.join(root, "report.md")}))
    print(f"report: {os.path.join(root, 'report.md')} and report.json; rounds in "
          f"{os.path.join(root, 'round_N')}")
    return 0
