"""Training-side loader: compiled examples packed into fixed-length rows (numpy + grain, no jax).

    loader = make_loader(["/data/curated"], seq_len=4096, batch_size=8, seed=0)
    it = iter(loader)
    batch = next(it)        # {input_ids, loss_mask, eligible_mask, segment_ids, positions}: int32 [8, 4096]
    state = it.get_state()  # save with the checkpoint; a fresh loader's iterator .set_state(state)

Pipeline (grain): ArrayRecord shards -> this host's slice (shard_index::shard_count, before any
shuffling, so hosts never overlap) -> shuffle (seed; reshuffled every epoch) -> repeat
(num_epochs, None = forever) -> decode -> too-long handling -> first-fit or best-fit packing into
`num_packing_bins` open rows -> batch -> optional grain worker processes.

In a packed row, `segment_ids` numbers the documents 1, 2, ... and is 0 on padding; `positions`
restart at 0 in every document. Attention must be restricted to equal segment ids (and the
loss to loss_mask, which is 0 on padding), so no document sees or predicts another.
Two batch units (`batch_unit`): "rows" (the token-budget mode) fills `batch_size` packed rows per
batch, however many documents they hold; "sequences" takes exactly `sequences` documents per
batch (the last may hold fewer) and packs them into as many rows as they need, first-fit in
arrival order or best-fit decreasing; the batch is still [batch_size, seq_len] (a static shape
for jit), its real rows laid out so that they fill whole micro-batches (`micro_batches`, split as
accumulate.split_micro does) and the all-padding micro-batches can be skipped by the step. A
group that needs more than `batch_size` rows is an error (batch_size >= sequences never is).

An example longer than `seq_len` is withheld as too_long (counted in `loader.stats`, in this
process) unless `truncate="left"`, which keeps its last `seq_len` tokens (the end of a rollout
is where the answer is); one whose truncation leaves no supervised token is dropped as
`truncated_unsupervised`. The final partial batch is padded with empty rows (segment 0) unless
`drop_remainder=True`, so every batch has the static shape [batch_size, seq_len].

`length_census(paths, seq_len)` counts, before any loader runs, how many rows are longer than
seq_len and what left truncation would leave of them: the trainer's `data.too_long` policy
(error | drop | truncate, rossjax/train/data.py) reads it, so no row is lost without a word.
"""

from __future__ import annotations

import numpy as np

from rossjax.curate.compiled import compiled_paths, decode_example
from rossjax.curate.grain_flags import mark_absl_parsed
from rossjax.errors import InputError

STRATEGIES = ("first_fit", "best_fit")
BATCH_UNITS = ("rows", "sequences")
TRUNCATE = ("none", "left")
FEATURES = ("input_ids", "loss_mask", "eligible_mask", "segment_ids", "positions")


class _Decode:
    def __init__(self, seq_len: int, truncate: str):
        self.seq_len, self.truncate = seq_len, truncate

    def __call__(self, blob: bytes) -> dict:
        ex = decode_example(blob)
        ids = ex["input_ids"].astype(np.int32)
        loss = ex["loss_mask"].astype(np.int32)
        # eligible_mask travels with the row so the trainer can log the target exclusion rate.
        elig = ex["eligible_mask"].astype(np.int32)
        status = "ok"
        if len(ids) > self.seq_len:
            if self.truncate == "left":
                ids, loss, elig = ids[-self.seq_len:], loss[-self.seq_len:], elig[-self.seq_len:]
                status = "ok" if loss.any() else "truncated_unsupervised"
            else:
                status = "too_long"
        return {"input_ids": ids, "loss_mask": loss, "eligible_mask": elig, "_status": status}


class _Keep:
    """Filter that counts what it drops (per process: grain workers keep their own counts)."""

    def __init__(self, stats: dict):
        self.stats = stats

    def __call__(self, ex: dict) -> bool:
        s = ex["_status"]
        self.stats[s] = self.stats.get(s, 0) + 1
        return s == "ok"

    def __getstate__(self):
        return {"stats": {}}


def _strip(ex: dict) -> dict:
    return {k: ex[k] for k in ("input_ids", "loss_mask", "eligible_mask")}


def _rename(row: dict) -> dict:
    return {"input_ids": row["input_ids"].astype(np.int32),
            "loss_mask": row["loss_mask"].astype(np.int32),
            "eligible_mask": row["eligible_mask"].astype(np.int32),
            "segment_ids": row["input_ids_segment_ids"].astype(np.int32),
            "positions": row["input_ids_positions"].astype(np.int32)}


class _PadBatch:
    def __init__(self, batch_size: int):
        self.batch_size = batch_size

    def __call__(self, batch: dict) -> dict:
        n = batch["input_ids"].shape[0]
        if n == self.batch_size:
            return batch
        return {k: np.concatenate([v, np.zeros((self.batch_size - n,) + v.shape[1:], v.dtype)])
                for k, v in batch.items()}


def length_census(paths_or_dirs, seq_len: int, *, shard_index: int = 0,
                  shard_count: int = 1) -> dict:
    """One pass over this host's slice of the rows (the loader's slice): {"rows", "too_long",
    "longest", "truncated_unsupervised", "long_rows"}: truncated_unsupervised counts too-long rows
    whose last seq_len tokens hold no supervised token (left truncation would drop them too);
    long_rows lists each too-long row's id and length."""
    import grain

    if isinstance(paths_or_dirs, str):
        paths_or_dirs = [paths_or_dirs]
    paths = [p for d in paths_or_dirs for p in compiled_paths(d)]
    out = {"rows": 0, "too_long": 0, "longest": 0, "truncated_unsupervised": 0, "long_rows": []}
    if not paths:
        return out
    src = grain.sources.ArrayRecordDataSource(paths)
    for i in range(shard_index, len(src), shard_count):
        ex = decode_example(src[i])
        n = len(ex["input_ids"])
        out["rows"] += 1
        out["longest"] = max(out["longest"], n)
        if n > seq_len:
            empty = not np.asarray(ex["loss_mask"])[-seq_len:].any()
            out["too_long"] += 1
            out["truncated_unsupervised"] += int(empty)
            out["long_rows"].append({"id": ex["id"], "tokens": n, "truncated_unsupervised": empty})
    return out


def pack_group(docs: list, seq_len: int, strategy: str) -> list[list[int]]:
    """Indices of `docs` (each at most seq_len tokens) per row: first-fit in the given order, or
    best-fit decreasing (longest first, into the fullest row that still has room)."""
    lens = [len(d["input_ids"]) for d in docs]
    order = (range(len(docs)) if strategy == "first_fit"
             else sorted(range(len(docs)), key=lambda i: -lens[i]))
    rows, free = [], []
    for i in order:
        fits = [j for j, f in enumerate(free) if f >= lens[i]]
        if not fits:
            rows.append([i])
            free.append(seq_len - lens[i])
            continue
        j = fits[0] if strategy == "first_fit" else min(fits, key=lambda j: free[j])
        rows[j].append(i)
        free[j] -= lens[i]
    return rows


def micro_major(n_real: int, batch_size: int, micro_batches: int) -> list[int]:
    """Batch row of each real row: with micro-batch m taking rows m, m+n, ... (split_micro),
    real rows 0..per-1 land in micro-batch 0, the next per in micro-batch 1, and so on."""
    n = max(1, int(micro_batches))
    if batch_size % n:
        return list(range(n_real))
    per = batch_size // n
    return [(q % per) * n + q // per for q in range(n_real)]


class _PackGroup:
    """A list of `sequences` decoded examples -> one packed batch [batch_size, seq_len]."""

    def __init__(self, seq_len: int, batch_size: int, micro_batches: int, strategy: str):
        self.seq_len, self.batch_size = seq_len, batch_size
        self.micro_batches, self.strategy = micro_batches, strategy

    def __call__(self, docs: list) -> dict:
        rows = pack_group(docs, self.seq_len, self.strategy)
        if len(rows) > self.batch_size:
            raise InputError(f"{len(docs)} sequences need {len(rows)} packed rows of "
                             f"{self.seq_len} tokens, more than the batch's {self.batch_size} rows")
        out = {k: np.zeros((self.batch_size, self.seq_len), np.int32) for k in FEATURES}
        for r, slot in zip(rows, micro_major(len(rows), self.batch_size, self.micro_batches)):
            at = 0
            for seg, i in enumerate(r, start=1):
                n = len(docs[i]["input_ids"])
                for k in ("input_ids", "loss_mask", "eligible_mask"):
                    out[k][slot, at:at + n] = docs[i][k]
                out["segment_ids"][slot, at:at + n] = seg
                out["positions"][slot, at:at + n] = np.arange(n)
                at += n
        return out


class PackedLoader:
    """Iterable of packed batches; `iter(loader)` is a grain iterator with get_state/set_state."""

    def __init__(self, dataset, stats: dict, paths: list[str]):
        self.dataset, self.stats, self.paths = dataset, stats, paths

    def __iter__(self):
        return iter(self.dataset)


def make_loader(paths_or_dirs, seq_len: int, batch_size: int, *, seed: int = 0,
                shuffle: bool = True, num_epochs: int | None = 1, shard_index: int = 0,
                shard_count: int = 1, strategy: str = "first_fit", truncate: str = "none",
                worker_count: int = 0, num_packing_bins: int | None = None,
                drop_remainder: bool = False, batch_unit: str = "rows", sequences: int = 0,
                micro_batches: int = 1) -> PackedLoader:
    """Packed-batch loader over curated dirs or shard files (see module doc); with
    batch_unit="sequences", `sequences` documents per batch."""
    import grain
    import grain.experimental as gex

    if strategy not in STRATEGIES:
        raise InputError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if truncate not in TRUNCATE:
        raise InputError(f"truncate {truncate!r} is not one of {', '.join(TRUNCATE)}")
    if batch_unit not in BATCH_UNITS:
        raise InputError(f"batch_unit {batch_unit!r} is not one of {', '.join(BATCH_UNITS)}")
    if batch_unit == "sequences" and sequences <= 0:
        raise InputError(f"batch_unit 'sequences' needs sequences > 0, not {sequences}")
    if not 0 <= shard_index < shard_count:
        raise InputError(f"shard_index {shard_index} is not in [0, shard_count={shard_count})")
    if seq_len <= 0 or batch_size <= 0:
        raise InputError(f"seq_len ({seq_len}) and batch_size ({batch_size}) must be positive")
    if isinstance(paths_or_dirs, str):
        paths_or_dirs = [paths_or_dirs]
    paths = [p for d in paths_or_dirs for p in compiled_paths(d)]
    if not paths:
        raise InputError(f"no compiled shards under {', '.join(map(str, paths_or_dirs))}")

    stats: dict = {}
    ds = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(paths))
    ds = ds[shard_index::shard_count]
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs)
    ds = ds.map(_Decode(seq_len, truncate)).filter(_Keep(stats)).map(_strip)
    if batch_unit == "sequences":
        out = ds.to_iter_dataset(_read_options()).batch(int(sequences), drop_remainder=drop_remainder,
                                         batch_fn=list)
        out = out.map(_PackGroup(seq_len, batch_size, micro_batches, strategy))
        return _finish(out, stats, paths, worker_count)
    packer = gex.FirstFitPackIterDataset if strategy == "first_fit" else gex.BestFitPackIterDataset
    packed = packer(ds.to_iter_dataset(_read_options()), length_struct={k: seq_len for k in ("input_ids", "loss_mask", "eligible_mask")},
                    num_packing_bins=num_packing_bins or max(batch_size, 8), seed=seed,
                    shuffle_bins=shuffle)
    out = packed.map(_rename).batch(batch_size, drop_remainder=drop_remainder)
    if not drop_remainder:
        out = out.map(_PadBatch(batch_size))
    return _finish(out, stats, paths, worker_count)


def _read_options():
    """One read thread: records are small and decode in microseconds, and grain's default 16
    threads spent more CPU polling their futures than reading (3.5x slower batches, 2 cores)."""
    import grain

    return grain.ReadOptions(num_threads=1, prefetch_buffer_size=64)


def _finish(out, stats, paths, worker_count: int) -> PackedLoader:
    import grain

    if worker_count > 0:
        mark_absl_parsed()
        out = out.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    return PackedLoader(out, stats, paths)
