"""Token-budgeted mixtures: `rossjax mix --config=configs/mixture.py`.

Given sources (curated output dirs) with target token shares and a total token budget, draw rows
from each source in a seeded random order until it holds its share of the budget:
rows longer than `max_length` (or empty) are dropped first; rows are taken in order while they
fit the source's remaining target, rows that would overshoot are skipped, and at the end one
row that overshoots by less than the remaining gap may close it. Achieved shares therefore land
within a row's length of the targets; the report states them and whether each is within
`tolerance_pp` (0.5 percentage points). A source whose rows cannot cover its share raises
ValueError naming it. The core (`plan_mixture`) works on (id, n_tokens) lists; `rossjax mix`
reads the lengths from `rossjax.curate.compiled.read_compiled(dir)` and writes the drawn examples
as DIR/compiled-NNNNN.array_record shards in the curated format (provenance gains
`mixture_source`), so `packing.make_loader(DIR, ...)` trains on the mixture directly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os

import numpy as np

from rossjax.errors import ConfigError, InputError


@dataclasses.dataclass
class Mixture:
    selected: dict   # source -> int64 row indices into that source, in draw order
    report: dict     # budget, per-source target/achieved tokens and shares, drops, tolerance


def _source_seed(seed: int, name: str) -> list[int]:
    # Each source's order depends only on (seed, name): adding a source never reshuffles another.
    return [int(seed), int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")]


def _fill(n_tok: np.ndarray, order: np.ndarray, target: int) -> tuple[np.ndarray, int]:
    """Rows of `order` (greedy, skipping rows that overshoot) summing to at most `target`,
    then possibly one overshooting row if it lands closer to the target. -> (rows, tokens)."""
    lens = n_tok[order]
    cum = np.cumsum(lens)
    head = int(np.searchsorted(cum, target, side="right"))
    taken = [order[:head]]
    got = int(cum[head - 1]) if head else 0
    rest_idx, rest_len = order[head:], lens[head:]
    extra = []
    if got < target and len(rest_len):
        smallest = int(rest_len.min())
        for i, n in zip(rest_idx.tolist(), rest_len.tolist()):
            gap = target - got
            if gap < smallest or gap == 0:
                break
            if n <= gap:
                extra.append(i)
                got += n
        gap = target - got
        if gap > 0:
            cand = ~np.isin(rest_idx, extra) & (rest_len > gap)
            if cand.any():
                k = int(np.flatnonzero(cand)[np.argmin(rest_len[cand])])
                if rest_len[k] - gap < gap:
                    extra.append(int(rest_idx[k]))
                    got += int(rest_len[k])
    rows = np.concatenate(taken + [np.asarray(extra, np.int64)]).astype(np.int64)
    return rows, got


def plan_mixture(sources: dict, shares: dict, budget_tokens: int, *, max_length: int | None = None,
                 seed: int = 0, tolerance_pp: float = 0.5) -> Mixture:
    """sources: name -> sequence of token counts (one per row); shares: name -> weight (any
    positive numbers, normalized: 40/20/20/20 works). Returns the rows drawn per source."""
    if not sources:
        raise InputError("a mixture needs at least one source.")
    if set(shares) != set(sources):
        raise InputError(f"shares name {sorted(shares)} but the sources are {sorted(sources)}.")
    for name, w in shares.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise InputError(f"share of source {name!r} must be a finite non-negative number, got {w!r}.")
    total_w = float(sum(shares.values()))
    if total_w <= 0:
        raise InputError("the shares must not all be zero.")
    if isinstance(budget_tokens, bool) or int(budget_tokens) != budget_tokens or budget_tokens <= 0:
        raise InputError(f"budget_tokens must be a positive integer, got {budget_tokens!r}.")
    if max_length is not None and max_length <= 0:
        raise InputError(f"max_length must be positive, got {max_length!r}.")
    budget_tokens = int(budget_tokens)
    plans, short = {}, []
    for name in sources:
        n_tok = np.asarray(sources[name], dtype=np.int64).reshape(-1)
        if (n_tok < 0).any():
            raise InputError(f"source {name!r} row {int(np.flatnonzero(n_tok < 0)[0])} has a negative token count.")
        ok = n_tok > 0
        too_long = np.zeros_like(ok) if max_length is None else n_tok > max_length
        ok &= ~too_long
        share = shares[name] / total_w
        target = int(round(budget_tokens * share))
        avail = int(n_tok[ok].sum())
        plans[name] = (n_tok, ok, share, target, int(too_long.sum()), int((n_tok == 0).sum()))
        if avail < target:
            short.append(f"source {name!r} holds {avail:,} tokens in rows of at most "
                         f"{max_length if max_length else 'any'} tokens, short of its "
                         f"{100 * share:.1f}% share ({target:,} tokens) of the {budget_tokens:,}-token budget")
    if short:
        raise InputError("; ".join(short) + ".")
    selected, per = {}, {}
    for name, (n_tok, ok, share, target, n_long, n_empty) in plans.items():
        rng = np.random.Generator(np.random.PCG64(_source_seed(seed, name)))
        order = rng.permutation(np.flatnonzero(ok))
        rows, got = _fill(n_tok, order, target) if target > 0 else (np.zeros(0, np.int64), 0)
        selected[name] = rows
        # Every pool row is drawn, dropped (too long / empty) or left undrawn: these add up.
        per[name] = {"rows": int(len(rows)), "tokens": got, "target_tokens": target,
                     "target_share": share, "dropped_too_long": n_long, "dropped_empty": n_empty,
                     "not_drawn": int(ok.sum()) - int(len(rows)), "pool_rows": int(len(n_tok))}
    total = sum(p["tokens"] for p in per.values())
    for p in per.values():
        p["achieved_share"] = p["tokens"] / total if total else 0.0
        p["deviation_pp"] = 100 * (p["achieved_share"] - p["target_share"])
    within = all(abs(p["deviation_pp"]) <= tolerance_pp for p in per.values())
    report = {"budget_tokens": budget_tokens, "achieved_tokens": total, "max_length": max_length,
              "seed": seed, "tolerance_pp": tolerance_pp, "within_tolerance": within, "sources": per}
    return Mixture(selected, report)


def format_report(report: dict) -> str:
    lines = [f"{'source':14s} {'rows':>8s} {'tokens':>12s} {'target':>7s} {'achieved':>8s} "
             f"{'dev pp':>7s} {'too long':>8s}"]
    for name, p in report["sources"].items():
        lines.append(f"{name:14s} {p['rows']:8d} {p['tokens']:12,d} {100 * p['target_share']:6.2f}% "
                     f"{100 * p['achieved_share']:7.2f}% {p['deviation_pp']:+7.3f} {p['dropped_too_long']:8d}")
    lines.append(f"total {report['achieved_tokens']:,} of {report['budget_tokens']:,} tokens; "
                 f"all within {report['tolerance_pp']} pp: {report['within_tolerance']}")
    return "\n".join(lines)


def _bar(desc: str, total: int | None, progress: bool):
    import sys

    from tqdm import tqdm

    return tqdm(total=total, unit="row", desc=desc, disable=not progress, file=sys.stderr)


def _n_examples(path: str) -> int | None:
    """Example count from a curated dir's report.json (for the progress bar's ETA), if present."""
    try:
        with open(os.path.join(path, "report.json")) as f:
            return int(json.load(f)["buckets"]["kept"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_lengths(path: str, progress: bool = False) -> tuple[list[str], np.ndarray]:
    """(ids, token counts) of a curated output dir, streamed through compiled.read_compiled."""
    from rossjax.curate.compiled import read_compiled

    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: mixture source is not a curated output directory")
    ids, lens = [], []
    with _bar(f"read {os.path.basename(os.path.normpath(path))}", _n_examples(path), progress) as bar:
        for ex in read_compiled(path):
            ids.append(str(ex["id"]))
            lens.append(len(ex["input_ids"]))
            bar.update()
    return ids, np.asarray(lens, np.int64)


def run(cfg, workdir: str | None = None) -> Mixture:
    out_dir = workdir or cfg.output
    if not out_dir:
        raise ConfigError("mix needs --config.output (a directory).")
    names = sorted(cfg.sources.keys())
    if not names:
        raise ConfigError("config.sources is empty; give each source a path and a share.")
    ids, lens, shares = {}, {}, {}
    for name in names:
        src = cfg.sources[name]
        if not src.path:
            raise ConfigError(f"config.sources.{name}.path is empty.")
        ids[name], lens[name] = read_lengths(src.path, progress=cfg.progress)
        shares[name] = float(src.share)
    mix = plan_mixture(lens, shares, cfg.budget_tokens, max_length=cfg.max_length or None,
                       seed=cfg.seed, tolerance_pp=cfg.tolerance_pp)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "mixture.jsonl"), "w") as f:
        for name in names:
            for r in mix.selected[name].tolist():
                f.write(json.dumps({"source": name, "path": cfg.sources[name].path, "row": r,
                                    "id": ids[name][r], "n_tokens": int(lens[name][r])}) + "\n")
    mix.report["shards"] = write_shards(out_dir, {n: cfg.sources[n].path for n in names},
                                        mix.selected, cfg.examples_per_shard,
                                        progress=cfg.progress)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(mix.report, f, indent=2)
    return mix


def write_shards(out_dir: str, paths: dict, selected: dict, per_shard: int,
                 tag: str | None = "mixture_source", progress: bool = False) -> list[str]:
    """Copy the drawn examples (row numbers in read order) of each source into
    compiled-NNNNN.array_record shards; `tag` names the provenance key that records the source."""
    import glob

    from array_record.python.array_record_module import ArrayRecordWriter

    from rossjax.curate.compiled import encode_example, read_compiled

    for old in glob.glob(os.path.join(out_dir, "compiled-*.array_record")):
        os.remove(old)  # a rerun must not leave shards of an earlier mixture behind
    shards, writer, count = [], None, 0
    bar = _bar("write", sum(len(selected[n]) for n in paths), progress)
    for name, path in paths.items():
        want = set(selected[name].tolist())
        for row, ex in enumerate(read_compiled(path)):
            if row not in want:
                continue
            bar.update()
            if writer is None:
                shards.append(os.path.join(out_dir, f"compiled-{len(shards):05d}.array_record"))
                writer = ArrayRecordWriter(shards[-1], "group_size:1")
            if tag:
                ex["provenance"] = {**(ex.get("provenance") or {}), tag: name}
            writer.write(encode_example(ex))
            count += 1
            if count == per_shard:
                writer.close()
                writer, count = None, 0
    if writer is not None:
        writer.close()
    bar.close()
    return [os.path.basename(p) for p in shards]
