"""`rossjax bench all [--quick]`: every benchmark against its peer, one markdown table.

Runs each benchmark in a fresh child process (`python -m rossjax.cli bench NAME ...`, without
XLA's simulated devices), one after the other, reads the figures it prints and writes the
README's performance table: date (UTC), machine (CPU, cores, load average before and after),
library versions, the host heap policy ($ROSSJAX_HOST_HEAP, rossjax/hostheap.py; the
children inherit it), and one row per comparison with rossjax's figure, the peer's and the ratio
(ratio > 1: rossjax is ahead). A benchmark that fails or prints no figure gets a row saying so
and the command exits 1: the table never holds a figure that was not measured in this run.

`--quick` sizes every benchmark down so the whole table takes a few minutes on a quiet 2-core
CPU (the full sizes are each benchmark's defaults, `rossjax bench NAME --help`); the sizes used
are printed under the table. `--only NAME[,NAME]` runs a subset (rows: sft, update, grpo,
tunix, sample, curate, select); the tunix row runs when $ROSSJAX_TUNIX_PYTHON names the python
of an environment with google-tunix (rossjax/bench/grpo_tunix.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time

from rossjax import hostheap

# (row, benchmark, quick flags, full flags, [(label, regex)], how the row is written)
_QUICK = {
    "sft": ["sft", "--rows", "2", "--seq", "512", "--micro", "1", "--steps", "2",
            "--skip_memory"],
    "update": ["grpo", "--part", "update", "--contexts", "4", "--repeats", "3"],
    "grpo": ["grpo", "--peer", "trl", "--contexts", "4", "--new_tokens", "32", "--steps", "2"],
    "tunix": ["grpo", "--peer", "tunix", "--contexts", "4", "--new_tokens", "32", "--steps", "2"],
    "sample": ["sample", "--batch", "64", "--stops", "8", "--new_tokens", "64", "--repeats", "1"],
    "curate": ["curate", "--n", "2000", "--peer_n", "100", "--verify_n", "40", "--code_n", "20"],
    "select": ["select", "--n", "20000", "--budget", "2000", "--families", "100"],
}
_FULL = {
    "sft": ["sft", "--skip_memory"],
    "update": ["grpo", "--part", "update"],
    "grpo": ["grpo", "--peer", "trl"],
    "tunix": ["grpo", "--peer", "tunix", "--contexts", "4"],
    "sample": ["sample", "--batch", "64", "--stops", "8"],
    "curate": ["curate"],
    "select": ["select"],
}
_F = r"([\d.,]+)"


def _num(s: str) -> float:
    return float(s.replace(",", ""))


def _row_sft(out):
    tok = re.search(r"tokens/s\s+" + _F, out)
    r = re.search(r"ratio rossjax / torch: " + _F + "x", out)
    return ("SFT step (qwen2_30m, packed rows, AdamW)", f"{_num(tok.group(1)):,.0f} tokens/s",
            "transformers + torch AdamW, same rows", _num(r.group(1)))


def _row_update(out):
    a = re.search(r"rossjax update\s+" + _F + r" s,\s+" + _F + " CPU s", out)
    b = re.search(r"torch update\s+" + _F + r" s,\s+" + _F + " CPU s", out)
    r = re.search(r"ratio " + _F + r"x wall, " + _F + "x CPU time", out)
    rows = re.search(r"(\d+) rows x (\d+) positions", out)
    return (f"GRPO update alone ({rows.group(1)} x {rows.group(2)}, fwd + bwd + AdamW)",
            f"{a.group(1)} s ({a.group(2)} CPU s)",
            f"torch step, same batch: {b.group(1)} s ({b.group(2)} CPU s)",
            _num(r.group(1)), f"CPU time {r.group(2)}x")


def _row_grpo(out):
    a = re.search(r"rossjax grpo\s+" + _F + " s/step", out)
    b = re.search(r"TRL GRPOTrainer\s+" + _F + " s/step", out)
    r = re.search(r"ratio " + _F + "x", out)
    head = re.search(r"(\d+) prompts x (\d+) candidates x (\d+) new tokens", out)
    return (f"GRPO step ({head.group(1)} x {head.group(2)} x {head.group(3)} tokens)",
            f"{a.group(1)} s/step", f"TRL GRPOTrainer {b.group(1)} s/step", _num(r.group(1)))


def _row_tunix(out):
    a = re.search(r"rossjax grpo\s+" + _F + " s/step", out)
    b = re.search(r"tunix GRPOLearner\s+" + _F + r" s/step.*; (tunix [\d.]+)", out)
    r = re.search(r"ratio " + _F + "x", out)
    head = re.search(r"(\d+) prompts x (\d+) candidates x (\d+) new tokens", out)
    return (f"GRPO step ({head.group(1)} x {head.group(2)} x {head.group(3)} tokens)",
            f"{a.group(1)} s/step", f"{b.group(2)} GRPOLearner {b.group(1)} s/step",
            _num(r.group(1)))


def _row_sample(out):
    a = re.search(r"rossjax\s+" + _F + " new tok/s", out)
    b = re.search(r"transformers\s+" + _F + " new tok/s", out)
    r = re.search(r"ratio " + _F + r"x .*agree on ([\d.]+%)", out)
    return ("sampler, batch 64, stop tokens", f"{a.group(1)} new tok/s",
            f"transformers generate {b.group(1)} new tok/s", _num(r.group(1)),
            f"greedy tokens agree {r.group(2)}")


def _row_curate(out):
    a = re.search(r"compile: " + _F + " rollouts/s", out)
    p = re.search(r"peer .*?: " + _F + r" rollouts/s vs rossjax " + _F + r" rollouts/s -> ratio "
                  + _F + r"x; identical masks: (\w+)", out)
    return ("curate: mask compilation", f"{a.group(1)} rollouts/s ({p.group(2)} on 1 process)",
            f"slime-style compiler {p.group(1)} rollouts/s (1 process)", _num(p.group(3)),
            f"identical masks: {p.group(4)}")


def _row_select(out):
    fp = re.search(r"fingerprinting alone: " + _F + " traces/s", out)
    p = re.search(r"peer takes " + _F + r"x the time \(" + _F + " vs " + _F, out)
    s = re.search(r"select diverse .*? s = " + _F + r" s \(target", out)
    fam = re.search(r"families covered: diverse (\d+) vs random (\d+) of (\d+)", out)
    return ("select: fingerprint + diverse", f"{fp.group(1)} traces/s; select {s.group(1)} s",
            f"regex labeller {p.group(2)} traces/s (1 core)", _num(p.group(1)),
            f"families covered {fam.group(1)} vs random {fam.group(2)} of {fam.group(3)}")


_ROWS = {"sft": _row_sft, "update": _row_update, "grpo": _row_grpo, "tunix": _row_tunix,
         "sample": _row_sample,
         "curate": _row_curate, "select": _row_select}


def _cpu_name() -> str:
    from rossjax.bench import compare

    name, flags = compare.cpu_info()
    return f"{name} ({' '.join(flags) or 'no AVX'})"


def _versions() -> str:
    from importlib import metadata

    out = []
    for name in ("rossjax", "jax", "torch", "transformers", "trl"):
        try:
            out.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rossjax bench all")
    ap.add_argument("--quick", action="store_true", help="small sizes: a few minutes in all")
    ap.add_argument("--only", default="", help="comma-separated rows: " + ",".join(_ROWS))
    ap.add_argument("--log", default="", help="also write every benchmark's output to this file")
    args = ap.parse_args(argv)
    # tunix lives in an environment of its own (rossjax/bench/grpo_tunix.py): its row runs
    # when ROSSJAX_TUNIX_PYTHON names it, or when asked for by --only.
    names = [n for n in args.only.split(",") if n] or [
        n for n in _ROWS if n != "tunix" or os.environ.get("ROSSJAX_TUNIX_PYTHON")]
    bad = [n for n in names if n not in _ROWS]
    if bad:
        from rossjax.errors import UsageError

        raise UsageError(f"rossjax bench all: --only {','.join(bad)} is not one of "
                         f"{','.join(_ROWS)}.")
    plan = _QUICK if args.quick else _FULL
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
    load0, t_all = os.getloadavg()[0], time.perf_counter()
    rows, failed, log = [], [], open(args.log, "w") if args.log else None
    for n in names:
        cmd = [sys.executable, "-m", "rossjax.cli", "bench", *plan[n]]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        dt = time.perf_counter() - t0
        if log:
            log.write(f"$ {' '.join(cmd[2:])}   # {dt:.0f} s, exit {p.returncode}\n{p.stdout}\n"
                      f"{p.stderr[-4000:]}\n")
            log.flush()
        try:
            if p.returncode:
                raise ValueError(f"exit {p.returncode}")
            row = _ROWS[n](p.stdout)
        except (AttributeError, ValueError) as e:  # AttributeError: a figure's regex missed
            tail = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or [""])[-1]
            failed.append(n)
            print(f"bench all: {n} ({' '.join(plan[n])}) gave no figures ({e}): {tail[:300]}",
                  file=sys.stderr)
            continue
        rows.append((*row, dt) if len(row) == 5 else (*row, "", dt))
        print(f"bench all: {n} done in {dt:.0f} s", file=sys.stderr, flush=True)
    total = time.perf_counter() - t_all
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"Measured {now} on {_cpu_name()}, {os.cpu_count()} cores (load average "
          f"{load0:.1f} before, {os.getloadavg()[0]:.1f} after); {_versions()}; "
          f"`rossjax bench all{' --quick' if args.quick else ''}` in {total / 60:.1f} min; host "
          f"heap {hostheap.policy()} ($ROSSJAX_HOST_HEAP, each row's settings line says whether "
          f"its peer shares it).\n")
    print("| what | rossjax | peer (same run, same work) | ratio | note |")
    print("| --- | --- | --- | --- | --- |")
    for what, ours, peer, ratio, note, _ in rows:
        print(f"| {what} | {ours} | {peer} | {ratio:.2f}x | {note} |")
    for n in failed:
        print(f"| {n} | failed in this run | | | see stderr |")
    print("\nratio: the peer's time / rossjax's for the same work (> 1: rossjax ahead). Sizes: "
          + "; ".join(f"`bench {' '.join(plan[n])}`" for n in names))
    return 1 if failed else 0
