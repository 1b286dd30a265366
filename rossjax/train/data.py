"""Training-side data glue: per-host packed loaders, global batch assembly, a dataset scan.

Each host reads its own shard (`shard_index = jax.process_index()`) of the packed rows and
contributes `global_batch / process_count` rows to every step (batch_mode "sequences": that many
rollouts, packed into at most that many rows, the rest padding); the rows become one global
array whose leading dim is split over the mesh's batch axes.
"""

from __future__ import annotations

import os

import jax
import numpy as np

from rossjax.errors import ConfigError, InputError

# The arrays of one packed SFT batch (curate/packing.py writes them; sft/step.py reads them).
BATCH_KEYS = ("input_ids", "loss_mask", "segment_ids", "positions")

def split_paths(spec: str, field: str) -> list[str]:
    paths = [p.strip() for p in str(spec or "").split(",") if p.strip()]
    if not paths:
        raise ConfigError(f"config.{field} is empty; give a curated dir written by `rossjax curate`.")
    for p in paths:
        if not os.path.exists(p):
            raise FileNotFoundError(f"config.{field}: {p} does not exist.")
        if os.path.isdir(p) and not os.path.exists(os.path.join(p, "report.json")):
            # curate, select and mix write report.json last: without it the folder is not whole
            raise InputError(f"config.{field}: {p} holds no report.json, so it is not a complete "
                             f"curated folder (a curate run stopped before publishing it, or "
                             f"not written by rossjax curate/select/mix); curate it again")
        from rossjax.curate.compiled import compiled_paths

        compiled_paths(p)  # exactly the shards report.json lists, before any model loads
    return paths


BATCH_MODES = ("sequences", "token_budget")


def open_loader(paths, data_cfg, *, rows_per_host: int, num_epochs: int, shuffle: bool, seed: int,
                batch_mode: str = "token_budget", micro_batches: int = 1):
    """This host's packed loader. batch_mode "token_budget": `rows_per_host` full rows per step;
    "sequences": `rows_per_host` rollouts per step, packed into as many of the step's
    `rows_per_host` rows as they need (packing.make_loader's batch_unit="sequences")."""
    from rossjax.curate.packing import make_loader

    if batch_mode not in BATCH_MODES:
        raise ConfigError(f"config.train.batch_mode {batch_mode!r} is not one of "
                          f"{', '.join(BATCH_MODES)}.")
    seqs = batch_mode == "sequences"
    return make_loader(paths, int(data_cfg.seq_len), int(rows_per_host), seed=int(seed),
                       shuffle=bool(shuffle), num_epochs=int(num_epochs),
                       shard_index=jax.process_index(), shard_count=jax.process_count(),
                       strategy=data_cfg.strategy,
                       truncate="left" if too_long_policy(data_cfg) == "truncate" else "none",
                       worker_count=int(data_cfg.worker_count),
                       batch_unit="sequences" if seqs else "rows",
                       sequences=int(rows_per_host) if seqs else 0,
                       micro_batches=int(micro_batches))


def supervised_count(batch) -> int:
    """Supervised prediction targets in a numpy batch (same rule as losses.shift_targets)."""
    lm, seg = np.asarray(batch["loss_mask"]), np.asarray(batch["segment_ids"])
    ok = (lm[:, 1:] != 0) & (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
    return int(ok.sum())


def scan(loader) -> tuple[int, int, int]:
    """(batches, supervised targets, real tokens) of one full pass (this host's shard)."""
    n = sup = tok = 0
    for batch in loader:
        n += 1
        sup += supervised_count(batch)
        tok += int((np.asarray(batch["segment_ids"]) > 0).sum())
    return n, sup, tok


def agree(values, op: str):
    """Combine per-host integers across processes (`min` or `sum`); identity on one process."""
    values = np.asarray(values, np.int64)
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    allv = np.asarray(multihost_utils.process_allgather(values))
    return allv.min(0) if op == "min" else allv.sum(0)


def local_batch(batch, rows: int, seq_len: int) -> dict:
    """Keep the training keys, cast to int32, and pad a short final batch with empty rows
    (segment id 0, nothing supervised), which leave the loss and the gradient unchanged."""
    out = {}
    keys = BATCH_KEYS + (("eligible_mask",) if "eligible_mask" in batch else ())
    for k in keys:
        x = np.asarray(batch[k], np.int32)
        if x.shape[1] != seq_len:
            raise ConfigError(f"the loader gave rows of {x.shape[1]} tokens for {k!r}, expected "
                             f"data.seq_len = {seq_len}.")
        if x.shape[0] < rows:
            x = np.concatenate([x, np.zeros((rows - x.shape[0], seq_len), np.int32)])
        out[k] = x
    return out


def to_global(batch: dict, sharding, global_rows: int) -> dict:
    """Per-host numpy rows -> global jax arrays laid out over the batch axes of the mesh."""
    return {k: jax.make_array_from_process_local_data(sharding, v, (global_rows, *v.shape[1:]))
            for k, v in batch.items()}


def _extent(path: str) -> tuple[int | None, int | None, str | None, int | None]:
    """(largest token id, shortest row, tokenizer spec, tokenizer vocab) of a curated dir: from
    report.json when it records them, else read from the shards."""
    import json

    from rossjax.curate.compiled import read_compiled

    rep = {}
    report = os.path.join(path, "report.json") if os.path.isdir(path) else ""
    if report and os.path.exists(report):
        with open(report, encoding="utf-8") as f:
            rep = json.load(f)
    tid, lengths = rep.get("token_ids") or {}, rep.get("kept_lengths") or {}
    spec = tid.get("tokenizer") or (rep.get("config") or {}).get("tokenizer")
    if "max" in tid and "min" in lengths:
        return tid["max"], lengths["min"], spec, tid.get("tokenizer_vocab_size")
    top, short = None, None
    for ex in read_compiled(path):
        n = len(ex["input_ids"])
        if n:
            top = max(top or 0, int(ex["input_ids"].max()))
            short = n if short is None else min(short, n)
    return top, short, spec, None


def check_fits_model(cfg, vocab_size: int) -> None:
    """Before step 1: every curated dir's tokens fit the model's vocabulary (the tokenizer it was
    curated with too), and not every row is longer than data.seq_len. One sentence each."""
    from rossjax.errors import InputError

    paths = split_paths(cfg.data.train, "data.train") + (
        split_paths(cfg.data.eval, "data.eval") if cfg.data.get("eval") else [])
    seq_len, policy = int(cfg.data.seq_len), too_long_policy(cfg.data)
    for p in paths:
        top, short, spec, tok_vocab = _extent(p)
        if top is not None and top >= vocab_size:
            raise InputError(f"{p} holds token id {top} but the model's vocabulary has {vocab_size} "
                             f"ids (0..{vocab_size - 1}): it was curated with another tokenizer "
                             f"({spec or 'unknown'}); curate with the model's tokenizer "
                             f"(--config.tokenizer=MODEL_DIR) or train a model whose vocabulary fits")
        if tok_vocab and tok_vocab > vocab_size:
            raise InputError(f"{p} was curated with tokenizer {spec} of {tok_vocab} tokens, more "
                             f"than the model's vocabulary of {vocab_size}; curate with the model's "
                             f"tokenizer (--config.tokenizer=MODEL_DIR)")
        if short is not None and short > seq_len and policy != "truncate":
            raise InputError(f"every row of {p} is longer than config.data.seq_len={seq_len} (the "
                             f"shortest has {short} tokens), so none would be trained on; raise "
                             f"config.data.seq_len or set config.data.too_long=truncate (keeps "
                             f"each row's last {seq_len} tokens)")


# config.data.too_long: what a row longer than data.seq_len gets. "error" (the default) stops
# the run before step 1 with the count, so rows are never dropped without a word.
TOO_LONG = ("error", "drop", "truncate")


def too_long_policy(data_cfg) -> str:
    """config.data.too_long; a config saved before the field existed reads its data.truncate
    ("left" was truncate, "none" silently dropped: now error)."""
    policy = data_cfg.get("too_long", None)
    if policy is None:
        policy = "truncate" if data_cfg.get("truncate", "none") == "left" else "error"
    if policy not in TOO_LONG:
        raise ConfigError(f"config.data.too_long {policy!r} is not one of {', '.join(TOO_LONG)}.")
    return policy


def check_too_long(cfg, train_paths, eval_paths, workdir: str | None = None) -> dict:
    """Count the rows longer than data.seq_len (all hosts) and apply config.data.too_long: error
    stops the run naming the count and the fixes; drop and truncate go on, and the counts go to
    the banner, the metrics and WORKDIR/too_long.jsonl (one line per such row: id, tokens, what
    happened to it). Returns {"policy", "seq_len", "rows", "too_long", "longest", "dropped",
    "truncated"} over train and eval data together."""
    import json

    from rossjax.curate.packing import length_census
    from rossjax.errors import InputError

    policy, seq_len = too_long_policy(cfg.data), int(cfg.data.seq_len)
    per = [length_census(p, seq_len, shard_index=jax.process_index(),
                         shard_count=jax.process_count()) for p in (train_paths, eval_paths)]
    long_rows = [{**r, "split": split} for c, split in zip(per, ("train", "eval"))
                 for r in c["long_rows"]]
    rows, n, unsup = (int(x) for x in agree(
        [sum(c[k] for c in per) for k in ("rows", "too_long", "truncated_unsupervised")], "sum"))
    longest = -int(agree([-max(c["longest"] for c in per)], "min")[0])
    out = {"policy": policy, "seq_len": seq_len, "rows": rows, "too_long": n, "longest": longest,
           "dropped": n if policy != "truncate" else unsup,
           "truncated": n - unsup if policy == "truncate" else 0}
    listing = None
    if workdir and long_rows:
        suffix = "" if jax.process_count() == 1 else f"-{jax.process_index()}"
        listing = os.path.join(workdir, f"too_long{suffix}.jsonl")
        lines = []
        for r in long_rows:
            what = ("dropped" if policy != "truncate" or r["truncated_unsupervised"]
                    else "truncated")
            lines.append(json.dumps({"id": r["id"], "split": r["split"], "tokens": r["tokens"],
                                     "seq_len": seq_len, "policy": policy, "result": what}) + "\n")
        from rossjax.train.workdir import write_text  # never through a link planted there

        write_text(listing, "".join(lines))
    if n and policy == "error":
        where = ",".join(list(train_paths) + list(eval_paths))
        raise InputError(
            f"{n} of the {rows} rows of {where} are longer than config.data.seq_len={seq_len} "
            f"tokens (the longest has {longest}{'; ids in ' + listing if listing else ''}); set "
            f"config.data.too_long=drop to train without them, config.data.too_long=truncate to "
            f"keep each one's last {seq_len} tokens"
            f"{f' ({unsup} of them would keep no supervised token and be dropped)' if unsup else ''}"
            f", or raise config.data.seq_len to {longest}.")
    return out


def too_long_note(counts: dict) -> str:
    """The banner's words for the too-long rows ("" when every row fits)."""
    if not counts or not counts.get("too_long"):
        return ""
    what = (f"{counts['dropped']} dropped" if counts["policy"] == "drop" else
            f"{counts['truncated']} truncated to their last {counts['seq_len']} tokens"
            + (f", {counts['dropped']} dropped (nothing supervised left)" if counts["dropped"] else ""))
    return (f"{counts['too_long']} of {counts['rows']} rows longer than data.seq_len="
            f"{counts['seq_len']} ({what}; config.data.too_long={counts['policy']})")


def too_long_metrics(counts: dict) -> dict:
    """The too-long counts as metrics (constant over a run; TensorBoard shows them beside the loss)."""
    if not counts:
        return {}
    return {"data_rows": counts["rows"], "data_too_long": counts["too_long"],
            "data_dropped": counts["dropped"], "data_truncated": counts["truncated"]}
