"""`rossjax curate`: read rollouts, verify, compile token masks, write ArrayRecord shards + report.

    rossjax curate --config=configs/curate.py --config.input=ROLLOUTS --config.output=DIR

Stages, per chunk of `chunk_rows` input rows (so memory stays bounded on millions of rows):
  read     schema.iter_records; a malformed row goes to `invalid` with its reason;
  verify   a row's verdict comes from, per `verify`:
             "auto"   (default) the stored record.verifier.passed when the row has one, else a
                      fresh run of the named verifier (verifier.name, else task.domain);
             "stored" the stored verdict only;
             "rerun"  a fresh run for every row that names a verifier;
           runs go to `verify_workers` CPU processes and the verdict is written into the record.
           passed=False is withheld as `verifier_failed`; passed=None (the verifier could not
           decide) as `verifier_undecided` unless `undecided="keep"`; a row left with no verdict
           at all (nothing stored, or no verifier named) as `unverified` unless
           `unverified="keep"`: ROSS trains on verifier-positive rollouts, so an unchecked row is
           never trained on silently. report.json `verify` counts each case;
  rows     the row filter of the training recipe (`rows`, after the verdict):
             "accepted"          (default; recipes ross and ross_no_mask) rows a reviewer accepted
                                 or revised; a row with no annotation is withheld as
                                 `not_annotated`, a reviewer drop as `annotation_drop`;
             "verifier_positive" (recipe positive_sft) every row the verifier passed, reviewed or
                                 not: the annotation is removed before compiling, so a drop or an
                                 unresolvable selector withholds nothing; needs mask_mode=eligible;
  compile  masks.compile_rollout as a grain MapDataset map (grain worker processes when
           `workers > 0`, each loading the tokenizer once);
  write    kept examples into DIR/compiled-NNNNN.array_record (`examples_per_shard` each);
           withheld and invalid rows, with row number, id, reason code and detail, into
           DIR/withheld.jsonl and DIR/invalid.jsonl; counts into DIR/report.json (report.py).

Record encoding inside the ArrayRecord shards (one record per example, stdlib + numpy only):
    b"RJX1" | uint32 little-endian header length | JSON header | array bytes
with header {"id", "provenance", "turn_spans", "n", "arrays": [[name, dtype], ...]} and the arrays
(input_ids int32, loss_mask uint8, eligible_mask uint8, each n long) concatenated in that order.
`read_compiled(DIR)` and `decode_example(bytes)` read it back.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import sys
import time
from typing import Iterator

import numpy as np

_MAGIC = b"RJX1"
_ARRAYS = (("input_ids", "int32"), ("loss_mask", "uint8"), ("eligible_mask", "uint8"))
SHARD_GLOB = "compiled-*.array_record"
VERIFY_MODES = ("auto", "stored", "rerun")
ROW_FILTERS = ("accepted", "verifier_positive")
_NOT_ANNOTATED = ("the row carries no reviewer annotation and config.rows=accepted trains only on "
                  "rows a reviewer accepted or revised (config.rows=verifier_positive with "
                  "config.mask_mode=eligible keeps it: the positive-rollout SFT baseline)")


def encode_example(ex) -> bytes:
    """Bytes of a kept CompiledExample (or a dict with the same fields)."""
    get = ex.get if isinstance(ex, dict) else (lambda k, d=None: getattr(ex, k, d))
    arrays = [np.ascontiguousarray(get(name), dtype=dt) for name, dt in _ARRAYS]
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError(f"example {get('id')!r}: input_ids and masks differ in length")
    header = json.dumps({"id": get("id"), "provenance": get("provenance") or {},
                         "turn_spans": [[int(s), int(e)] for s, e in (get("turn_spans") or [])],
                         "n": n, "arrays": [list(a) for a in _ARRAYS]},
                        separators=(",", ":"), default=str).encode("utf-8")
    return b"".join([_MAGIC, struct.pack("<I", len(header)), header, *(a.tobytes() for a in arrays)])


def decode_example(blob: bytes) -> dict:
    if blob[:4] != _MAGIC:
        raise ValueError("not a rossjax compiled example (bad magic bytes)")
    (hlen,) = struct.unpack_from("<I", blob, 4)
    header = json.loads(blob[8:8 + hlen])
    out = {"id": header["id"], "provenance": header["provenance"],
           "turn_spans": [tuple(s) for s in header["turn_spans"]]}
    off, n = 8 + hlen, header["n"]
    for name, dt in header["arrays"]:
        a = np.frombuffer(blob, dtype=dt, count=n, offset=off)
        out[name] = a
        off += a.nbytes
    return out


def compiled_paths(path_or_dir) -> list[str]:
    """Shard files of a curated dir (or a single shard path), sorted."""
    if os.path.isdir(path_or_dir):
        paths = sorted(glob.glob(os.path.join(path_or_dir, SHARD_GLOB)))
        if not paths and not os.path.exists(os.path.join(path_or_dir, "report.json")):
            raise FileNotFoundError(f"{path_or_dir}: no {SHARD_GLOB} shards and no report.json")
        return paths
    if not os.path.exists(path_or_dir):
        raise FileNotFoundError(f"{path_or_dir}: no such curated dir or shard")
    return [path_or_dir]


def read_compiled(path_or_dir) -> Iterator[dict]:
    """Yield compiled examples (id, input_ids, loss_mask, eligible_mask, provenance, turn_spans)."""
    from array_record.python.array_record_module import ArrayRecordReader

    for path in compiled_paths(path_or_dir):
        reader = ArrayRecordReader(path)
        try:
            n = reader.num_records()
            for start in range(0, n, 1024):
                for blob in reader.read(start, min(n, start + 1024)):
                    yield decode_example(blob)
        finally:
            reader.close()


class Compiler:
    """Picklable per-row compile step; loads the tokenizer once per process."""

    def __init__(self, tokenizer: str, template: str, max_length: int | None, mask_mode: str):
        self.spec, self.template, self.max_length, self.mask_mode = (
            tokenizer, template, max_length, mask_mode)
        self._tok = None

    def __getstate__(self):
        return {**self.__dict__, "_tok": None}

    def __call__(self, item):
        from rossjax.curate.masks import compile_rollout
        from rossjax.tokenizers import load_tokenizer

        if self._tok is None:
            self._tok = load_tokenizer(self.spec)
        row, record = item
        ex = compile_rollout(record, self._tok, template=self.template,
                             max_length=self.max_length, mask_mode=self.mask_mode)
        ex.text = None  # not needed downstream; keeps worker -> host pickles small
        return row, ex


class _ShardWriter:
    def __init__(self, out_dir: str, per_shard: int, report):
        self.out_dir, self.per_shard, self.report = out_dir, per_shard, report
        self.writer, self.count, self.index = None, 0, 0

    def write(self, blob: bytes):
        from array_record.python.array_record_module import ArrayRecordWriter

        if self.writer is None:
            path = os.path.join(self.out_dir, f"compiled-{self.index:05d}.array_record")
            self.writer = ArrayRecordWriter(path, "group_size:1")  # random access for grain
            self.report.shards.append({"path": os.path.basename(path), "examples": 0})
        self.writer.write(blob)
        self.count += 1
        self.report.shards[-1]["examples"] += 1
        if self.count == self.per_shard:
            self.close()

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.writer, self.count, self.index = None, 0, self.index + 1


def _clear_outputs(out_dir: str):
    for p in glob.glob(os.path.join(out_dir, SHARD_GLOB)) + [
            os.path.join(out_dir, n) for n in ("report.json", "invalid.jsonl", "withheld.jsonl")]:
        if os.path.exists(p):
            os.remove(p)


def _absl_defaults():
    # grain's worker code reads its absl flags from the global FLAGS; our CLI parses into its own
    # FlagValues, so let grain see its defaults.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _count_lines(files: list[str]) -> int | None:
    """Rows to expect (the progress bar's total) when every input is plain JSONL, else None."""
    if not all(p.endswith(".jsonl") for p in files):
        return None
    total = 0
    for p in files:
        with open(p, "rb") as f:
            total += sum(buf.count(b"\n") for buf in iter(lambda: f.read(1 << 20), b""))
    return total


_UNVERIFIED = {
    "stored": "the row stores no verifier verdict and verify=stored runs none "
              "(set config.verify=auto, or config.unverified=keep to train on it anyway)",
    "auto": "the row stores no verifier verdict and names no verifier to run (verifier.name, "
            "or a task.domain that is a verifier); set config.unverified=keep to train on it anyway",
}
_UNVERIFIED["rerun"] = _UNVERIFIED["auto"]


def review_status(record: dict) -> str:
    """The reviewer's decision: accept | revise | drop, or "none" when the row has no annotation
    (an annotation without a status is an accept, as in the record schema)."""
    ann = record.get("annotation")
    return "none" if ann is None else ann.get("status", "accept")


def check_rows(cfg) -> str:
    """config.rows, checked against config.mask_mode (one sentence when they do not fit)."""
    from rossjax.curate.masks import MASK_MODES

    rows = cfg.get("rows", "accepted")
    if rows not in ROW_FILTERS:
        raise ValueError(f"config.rows {rows!r} must be one of {', '.join(ROW_FILTERS)}")
    if cfg.mask_mode not in MASK_MODES:
        raise ValueError(f"config.mask_mode {cfg.mask_mode!r} must be one of {', '.join(MASK_MODES)}")
    if rows == "verifier_positive" and cfg.mask_mode != "eligible":
        raise ValueError(f"config.rows='verifier_positive' ignores the reviewers' annotations, so it "
                         f"needs config.mask_mode='eligible', not {cfg.mask_mode!r} (annotated masks "
                         f"go with config.rows='accepted')")
    return rows


def has_verdict(record: dict) -> bool:
    """True when the record stores a verdict: verifier.passed present (true, false or null)."""
    ver = record.get("verifier")
    return isinstance(ver, dict) and "passed" in ver


def curate(cfg) -> dict:
    """Run the pipeline for an ml-collections config (see configs/curate.py); returns the report."""
    import grain
    from tqdm import tqdm

    from rossjax.curate.report import Report
    from rossjax.curate.schema import chunked, expand_inputs, iter_records, verifier_positive
    from rossjax.tokenizers import load_tokenizer
    from rossjax.verify import WorkerPool, verifier_name, verify_records

    if cfg.verify not in VERIFY_MODES:
        raise ValueError(f"config.verify {cfg.verify!r} must be one of {', '.join(VERIFY_MODES)}")
    for key in ("undecided", "unverified"):
        if cfg[key] not in ("withhold", "keep"):
            raise ValueError(f"config.{key} {cfg[key]!r} must be 'withhold' or 'keep'")
    rows_filter = check_rows(cfg)
    if not cfg.output:
        raise ValueError("config.output is empty; set --config.output=DIR")
    files = expand_inputs(cfg.input)  # a missing file or an empty pattern fails here
    try:  # fail before touching the output dir, not inside a worker after reading rows
        load_tokenizer(cfg.tokenizer)
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"config.tokenizer {cfg.tokenizer!r} cannot be loaded: {e}") from None
    os.makedirs(cfg.output, exist_ok=True)
    _clear_outputs(cfg.output)
    report = Report(cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg))
    compiler = Compiler(cfg.tokenizer, cfg.template, cfg.max_length or None, cfg.mask_mode)
    shards = _ShardWriter(cfg.output, cfg.examples_per_shard, report)
    t0 = time.perf_counter()
    lists = {k: open(os.path.join(cfg.output, f"{k}.jsonl"), "w", encoding="utf-8")
             for k in ("invalid", "withheld")}

    def bucket(status, row, rid, code, detail):
        report.add(status, code)
        lists[status].write(json.dumps({"row": row, "id": rid, "reason": code, "detail": detail},
                                       ensure_ascii=False) + "\n")

    bar = tqdm(total=_count_lines(files), unit="row", desc="curate", disable=not cfg.progress,
               file=sys.stderr)
    pool = WorkerPool(cfg.verify_workers if cfg.verify != "stored" else 0)  # spawns on first use
    try:
        with pool:
            for chunk in chunked(iter_records(files), cfg.chunk_rows):
                todo = []
                for row in chunk:
                    if row.record is None:
                        bucket("invalid", row.row, row.id, "invalid_record", row.reason)
                    else:
                        todo.append((row.row, row.record))
                if cfg.verify != "stored":
                    named = [(i, verifier_name(r)) for i, (_, r) in enumerate(todo)
                             if cfg.verify == "rerun" or not has_verdict(r)]
                    named = [(i, n) for i, n in named if n]
                    verdicts = verify_records(pool, [todo[i][1] for i, _ in named]) if named else []
                    for (i, name), v in zip(named, verdicts):
                        rec = todo[i][1]
                        rec["verifier"] = {**(rec.get("verifier") or {}), "name": name,
                                           "passed": v.passed, "evidence": v.evidence}
                    report.verify["rerun"] += len(named)
                ready, review = [], {}
                for row, rec in todo:
                    ver = rec.get("verifier")
                    if not has_verdict(rec):
                        report.verify["unverified"] += 1
                        if cfg.unverified == "withhold":
                            bucket("withheld", row, rec["id"], "unverified", _UNVERIFIED[cfg.verify])
                            continue
                    else:
                        report.add_verdict(ver.get("passed"))
                        if ver.get("passed") is None and cfg.undecided == "withhold":
                            bucket("withheld", row, rec["id"], "verifier_undecided",
                                   f"verifier {ver.get('name', '?')} could not decide: "
                                   f"{ver.get('evidence', '')}"[:300])
                            continue
                    review[row] = review_status(rec)
                    if rows_filter == "verifier_positive":
                        # not resolved at all: a drop or a broken selector must not withhold it
                        rec = {k: v for k, v in rec.items() if k != "annotation"}
                    elif review[row] == "none" and verifier_positive(
                            rec, undecided=cfg.undecided, unverified=cfg.unverified):
                        bucket("withheld", row, rec["id"], "not_annotated", _NOT_ANNOTATED)
                        continue
                    ready.append((row, rec))
                ds = grain.MapDataset.source(ready).map(compiler).to_iter_dataset()
                if cfg.workers > 0 and len(ready) > 1:
                    _absl_defaults()
                    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.workers))
                for row, ex in ds:
                    if ex.status == "kept":
                        shards.write(encode_example(ex))
                        report.add("kept", example=ex, review=review[row])
                    else:
                        bucket(ex.status, row, ex.id or None, ex.reason, ex.detail)
                bar.update(len(chunk))
                bar.set_postfix_str(f"kept {report.buckets['kept']}")
    finally:
        bar.close()
        shards.close()
        for f in lists.values():
            f.close()
    if report.input_rows == 0:
        print(f"rossjax curate: warning: {cfg.input} holds no rows; the output is empty",
              file=sys.stderr)
    out = report.write(cfg.output, time.perf_counter() - t0)
    print(f"rossjax curate: {report.summary()} -> {cfg.output}", file=sys.stderr)
    return out


def repo_config(name: str) -> str:
    """Absolute path of configs/<name> in this checkout, so a command's default config is found
    from any working directory."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(here, "configs", name)


def main(argv=None) -> int:
    from rossjax.cli import parse_config

    cfg, _, rest = parse_config(list(argv or []), default_config=repo_config("curate.py"))
    if rest:
        raise ValueError(f"rossjax curate takes no positional arguments, got {' '.join(rest)}")
    curate(cfg)
    return 0
