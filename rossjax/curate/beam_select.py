"""`rossjax select --config.runner=beam`: route fingerprints computed on Apache Beam and written
as a shard set; the selection itself stays on one host (curate/subset.py), reading the shards
back in row order, one block at a time.

The workers call the local code on each row (subset.pool_trace, then routes.fingerprint on
batches: a row's vector depends on that row only), so the fingerprints, route signatures, row
numbers, ids, groups and skip counts equal the local pass. The shard set is
DIR/fingerprints/fingerprints-BBBBBBBBB.npz, one per block of BLOCK input rows:
  rows int64[n], fingerprints float32[n, dim], routes int64[n], ids and groups (JSON strings),
  skipped (JSON list of reasons, one per skipped row of the block).
"""

from __future__ import annotations

import io
import json
import os

import numpy as np

from rossjax.curate import beam_io
from rossjax.curate.beam_io import BLOCK

FP_DIR = "fingerprints"
FP_GLOB = "fingerprints-*.npz"


def _field(record, dotted: str):
    from rossjax.curate.subset import _field as field

    return field(record, dotted) if dotted else None


def fingerprint_shards(cfg, out_dir: str) -> str:
    """Run the Beam pipeline; returns the shard set's directory."""
    from rossjax.curate.beam import import_beam, read_rows, run_with_retries
    from rossjax.errors import ConfigError
    from rossjax.routes.fingerprint import get_vocab

    beam = import_beam()
    if not beam_io.is_remote(cfg.input) and os.path.isdir(cfg.input):
        raise ConfigError(f"config.input {cfg.input} is a curated dir: config.runner=beam "
                          f"fingerprints rollout files (use config.runner=local)")
    get_vocab(cfg.domain)  # an unknown domain fails here, not in a worker
    files = beam_io.input_files(cfg.input)
    fp_dir = beam_io.join(out_dir, FP_DIR)
    beam_io.makedirs(fp_dir)
    beam_io.delete(beam_io.matching(beam_io.join(fp_dir, FP_GLOB)))
    domain, dim, seed, only_passed, group_by = (cfg.domain, int(cfg.dim), int(cfg.seed),
                                                bool(cfg.only_passed), cfg.group_by)

    def classify(r):
        from rossjax.curate.subset import pool_trace

        t, skip = pool_trace(r.record, only_passed)
        if skip:
            return r.row, None, skip
        return r.row, (r.record.get("id"), _field(r.record, group_by), t), None

    def fingerprint_batch(batch):
        from rossjax.routes.fingerprint import fingerprint

        usable = [b for b in batch if b[1] is not None]
        fps, sigs = fingerprint([u[1][2] for u in usable], domain, dim, seed, return_routes=True)
        for (row, (rid, group, _), _), f, s in zip(usable, fps, sigs):
            yield row, (rid, group, f, int(s), None)
        for row, _, skip in batch:
            if skip:
                yield row, (None, None, None, None, skip)

    def write(item):
        block, members = item
        members = sorted(members, key=lambda m: m[0])
        used = [(row, m) for row, m in members if m[4] is None]
        buf = io.BytesIO()
        np.savez(buf, rows=np.array([r for r, _ in used], np.int64),
                 fingerprints=np.array([m[2] for _, m in used], np.float32).reshape(-1, dim),
                 routes=np.array([m[3] for _, m in used], np.int64),
                 ids=np.array(json.dumps([m[0] for _, m in used])),
                 groups=np.array(json.dumps([m[1] for _, m in used], default=str)),
                 skipped=np.array(json.dumps([m[4] for _, m in members if m[4] is not None])))
        beam_io.write_bytes(beam_io.join(fp_dir, f"fingerprints-{block:09d}.npz"), buf.getvalue())

    def build(p):
        (read_rows(p, files) | "classify" >> beam.Map(classify)
         | "batch" >> beam.BatchElements(min_batch_size=8, max_batch_size=2048)
         | "fingerprint" >> beam.FlatMap(fingerprint_batch)
         | "by block" >> beam.Map(lambda kv: (kv[0] // BLOCK, kv))
         | "group blocks" >> beam.GroupByKey()
         | "write" >> beam.Map(write))

    run_with_retries(build, cfg.beam_args, cfg.get("beam_retries", 1), "select")
    return fp_dir


def read_fingerprint_shards(fp_dir: str, group_by: str = ""):
    """(fingerprints float32 [n, dim], routes int64 [n], PoolMeta) from a shard set, in row
    order, one shard in memory at a time besides the growing result."""
    from rossjax.curate.subset import PoolMeta

    meta, fps, sigs = PoolMeta(group_by), [], []
    for path in beam_io.matching(beam_io.join(fp_dir, FP_GLOB)):
        with np.load(io.BytesIO(beam_io.read_bytes(path))) as z:
            for reason in json.loads(str(z["skipped"])):
                meta.skip(reason)
            meta.rows.extend(int(r) for r in z["rows"])
            meta.ids.extend(json.loads(str(z["ids"])))
            if group_by:
                meta.groups.extend(json.loads(str(z["groups"])))
            fps.append(z["fingerprints"])
            sigs.append(z["routes"])
    dim = fps[0].shape[1] if fps else 0
    return (np.concatenate(fps) if fps else np.zeros((0, dim), np.float32),
            np.concatenate(sigs) if sigs else np.zeros(0, np.int64), meta)


def fingerprinter(cfg, out_dir: str):
    """subset.run's `fingerprinter`: Beam computes the shard set, this host reads it."""
    return read_fingerprint_shards(fingerprint_shards(cfg, out_dir), cfg.group_by)
