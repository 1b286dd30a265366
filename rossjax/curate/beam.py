"""`rossjax curate --config.runner=beam`: the curate stages as an Apache Beam pipeline, for pools
larger than one host (pip install "rossjax[beam]"; DirectRunner here, Dataflow/Flink/Spark on a
fleet, chosen by `config.beam_args`, Beam's own pipeline options).

No second copy of the curation logic: the workers call pipeline.curate_chunk (verify, the verdict
and row-filter policy, compile) on batches of rows, with the ledger's Report and list lines.
Beam adds only the plumbing, and every output equals the local run's:
  read      one file per task (schema.iter_records with config.fields, so formats.normalize and
            the derived ids are the local ones; a remote file is copied to local disk first);
            each file's last row number goes to a side input, so rows count on across files
            exactly as in the local run;
  ids       a global pass: valid rows grouped by id, each row paired with the first (lowest) row
            number of its id; curate_chunk gets these as its `seen`, so the same rows are
            withheld as duplicate_id as in the local run, wherever they land;
  curate    rows are batched over the workers; a DoFn holds, from setup(), the compiler
            (Compiler.from_config: template, template_kwargs; tokenizer loaded once) and one
            verifier process (math-verify's timeouts need
            a main thread, which Beam's bundle threads are not; sandboxes start from there);
  shards    kept examples are grouped by row block, ranked in row order (block counts as a side
            input), and grouped again by shard: compiled-NNNNN.array_record holds the same
            examples in the same order as the local run's shard NNNNN;
  lists     withheld/invalid lines are sorted per row block into part files, then concatenated;
  report    the per-batch Reports are combined (Report.merge, a CombineFn), so a retried bundle's
            partial counts are never added twice; the driver writes report.json.
As in the local run everything is written into DIR/.partial/ and moved into DIR at the end
(report.json last; pipeline.publish), and pipeline.finish (the CLI calls it after either runner)
adds the Parquet export and refuses a run that kept no row.
Every file is written whole under a deterministic name, so a retried bundle (Dataflow retries a
failed one up to 4 times) overwrites its own output. Beam's DirectRunner retries no bundle
(apache/beam#18640): a failed run is rerun whole, up to `config.beam_retries` times, into the
same files. Counters under the "rossjax" namespace show progress in the runner's UI.
"""

from __future__ import annotations

import os
import pickle
import shlex
import sys
import time

from rossjax.curate import beam_io
from rossjax.curate.beam_io import BLOCK

_REPORT = ".beam-report.pkl"
_TMP = ".beam-tmp"
# Fault injection for tests: "MARKER_PATH:ROW" makes the worker that reaches input row ROW exit
# at once (mid-bundle), the first time only (it creates MARKER_PATH).
CRASH_ENV = "ROSSJAX_BEAM_CRASH_ONCE"


def import_beam():
    try:
        import apache_beam as beam
    except ImportError:
        from rossjax.errors import ConfigError

        raise ConfigError('config.runner=beam needs Apache Beam: pip install "rossjax[beam]"') from None
    return beam


def _crash_once(rows) -> None:
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    marker, row = spec.rsplit(":", 1)
    if int(row) in rows and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(17)  # like a segfault or an OOM kill: no exception, no cleanup


def pipeline_options(beam_args: str):
    """Beam's PipelineOptions from `config.beam_args`; the workers log warnings and up unless
    the args say otherwise (Beam's INFO lines would bury the run's own output)."""
    import logging

    from apache_beam.options.pipeline_options import PipelineOptions

    args = shlex.split(beam_args or "")
    if not any(a.startswith("--default_sdk_harness_log_level") for a in args):
        args.append("--default_sdk_harness_log_level=WARNING")
        logging.getLogger("apache_beam").setLevel(logging.WARNING)
    return PipelineOptions(args)


def run_with_retries(build, beam_args: str, retries: int, what: str):
    """Build and run a pipeline (build(p) adds the transforms), rerunning a failed run."""
    beam = import_beam()
    for attempt in range(int(retries) + 1):
        p = beam.Pipeline(options=pipeline_options(beam_args))
        build(p)
        try:
            result = p.run()
            result.wait_until_finish()
            return result
        except Exception as e:  # a dead worker surfaces as a RuntimeError of the runner
            if attempt == retries:
                raise
            print(f"rossjax {what}: beam run {attempt + 1} failed ({type(e).__name__}: "
                  f"{str(e).splitlines()[0] if str(e) else ''}); running it again",
                  file=sys.stderr)


def read_rows(p, files: list[str], fields: dict | None = None, spread: bool = True):
    """PCollection of schema.Row with the local run's row numbers (counting on across files),
    each normalized with the field mapping `fields` (config.fields); `spread` reshuffles them."""
    beam = import_beam()

    class ReadFile(beam.DoFn):
        def process(self, item):
            from rossjax.curate.schema import iter_records

            i, path = item
            last = 0
            with beam_io.local_copy(path) as local:
                for r in iter_records([local], fields):
                    last = r.row
                    yield i, r._replace(source=path)
            yield beam.pvalue.TaggedOutput("last", (i, last))

    def globalize(item, lasts):
        i, r = item
        return r._replace(row=r.row + sum(n for j, n in lasts.items() if j < i))

    read = (p | "files" >> beam.Create(list(enumerate(files)))
            | "read" >> beam.ParDo(ReadFile()).with_outputs("last", main="rows"))
    rows = read.rows | "number" >> beam.Map(globalize, lasts=beam.pvalue.AsDict(read.last))
    return rows | "spread" >> beam.Reshuffle() if spread else rows


def first_rows(rows):
    """(Row, first row number of its id) for every row; None for a row that could not be read
    (it has no id to repeat). Grouping by id spreads the rows over the workers as well."""
    beam = import_beam()

    def pair(item):
        _, members = item
        members = list(members)
        first = min(r.row for r in members)
        for r in members:
            yield r, first

    valid = (rows | "valid" >> beam.Filter(lambda r: r.record is not None)
             | "by id" >> beam.Map(lambda r: (r.record["id"], r))
             | "group ids" >> beam.GroupByKey() | "first row" >> beam.FlatMap(pair))
    unread = (rows | "unread" >> beam.Filter(lambda r: r.record is None)
              | "no id" >> beam.Map(lambda r: (r, None)) | "spread unread" >> beam.Reshuffle())
    return (valid, unread) | "rows" >> beam.Flatten()


def _curate_fn(cfg_dict: dict, rows_filter: str):
    beam = import_beam()
    from rossjax.curate.ledger import LISTS, Report, list_line

    class Lines:
        """pipeline.curate_chunk's `lists`: counts into a Report, keeps (status, row, line)."""

        def __init__(self):
            self.report, self.items, self.listed = Report(), [], set()

        def add(self, status, row, rid, code, detail):
            assert status in LISTS, status
            self.report.add(status, code)
            self.items.append((status, row, list_line(row, rid, code, detail)))
            self.listed.add(row)

    class Blobs:
        """pipeline.curate_chunk's `shards`: keeps the encoded kept examples in order."""

        def __init__(self):
            self.blobs = []

        def write(self, blob):
            self.blobs.append(blob)

    class Curate(beam.DoFn):
        def setup(self):
            from ml_collections import ConfigDict

            from rossjax.curate.pipeline import Compiler
            from rossjax.verify import WorkerPool

            self.cfg = ConfigDict(cfg_dict)
            self.cfg.workers = 0  # compile in this worker: Beam is the parallelism
            c = self.cfg
            self.compiler = Compiler.from_config(c)
            self.pool = WorkerPool(1 if c.verify != "stored" else 0)  # spawned on first use
            self.counters = {k: beam.metrics.Metrics.counter("rossjax", f"rows_{k}")
                             for k in ("kept", *LISTS)}

        def process(self, pairs):
            from rossjax.curate.pipeline import curate_chunk

            batch = sorted((r for r, _ in pairs), key=lambda r: r.row)
            # Every id's first row, found by the global pass: the local run's duplicate rule.
            seen = {r.record["id"]: first for r, first in pairs if first is not None}
            _crash_once({r.row for r in batch})
            lines, blobs = Lines(), Blobs()
            curate_chunk(batch, self.cfg, rows_filter, self.pool, self.compiler, lines, blobs,
                         seen)
            # Every row is listed or kept, and kept examples come out in batch order.
            kept = [r.row for r in batch if r.row not in lines.listed]
            if len(kept) != len(blobs.blobs):
                raise AssertionError(f"{len(kept)} rows kept but {len(blobs.blobs)} examples")
            for k, n in lines.report.buckets.items():
                self.counters[k].inc(n)
            yield from zip(kept, blobs.blobs)
            for item in lines.items:
                yield beam.pvalue.TaggedOutput("lists", item)
            yield beam.pvalue.TaggedOutput("report", lines.report)

        def teardown(self):
            self.pool.close()

    return Curate()


def _merge_reports():
    beam = import_beam()
    from rossjax.curate.ledger import Report

    class MergeReports(beam.CombineFn):
        def create_accumulator(self):
            return Report()

        def add_input(self, acc, report):
            return acc.merge(report)

        def merge_accumulators(self, accs):
            accs = iter(accs)
            out = next(accs)
            for a in accs:
                out.merge(a)
            return out

        def extract_output(self, acc):
            return acc

    return MergeReports()


def write_shards(kept, out_dir: str, per_shard: int):
    """Kept (row, blob) -> compiled-NNNNN.array_record in row order, `per_shard` each; returns a
    PCollection of (shard index, examples)."""
    beam = import_beam()

    def rank(item, counts):
        block, members = item
        base = sum(n for b, n in counts.items() if b < block)
        for i, (_, blob) in enumerate(sorted(members, key=lambda m: m[0])):
            yield (base + i) // per_shard, (base + i, blob)

    def write(item):
        from array_record.python.array_record_module import ArrayRecordWriter

        from rossjax.curate.compiled import SHARD_OPTIONS, sha256_file, shard_name

        index, members = item
        dest = beam_io.join(out_dir, shard_name(index))
        tmp = beam_io.local_temp(dest)
        writer = ArrayRecordWriter(tmp, SHARD_OPTIONS)
        members = sorted(members, key=lambda m: m[0])
        for _, blob in members:
            writer.write(blob)
        writer.close()
        # the size and whole-file hash the report lists, as the local ShardWriter records them
        size, digest = os.path.getsize(tmp), sha256_file(tmp)
        beam_io.publish(tmp, dest)
        return index, len(members), size, digest

    counts = (kept | "kept per block" >> beam.Map(lambda kv: (kv[0] // BLOCK, 1))
              | "count kept" >> beam.CombinePerKey(sum))
    return (kept | "by block" >> beam.Map(lambda kv: (kv[0] // BLOCK, kv))
            | "group blocks" >> beam.GroupByKey()
            | "rank" >> beam.FlatMap(rank, counts=beam.pvalue.AsDict(counts))
            | "group shards" >> beam.GroupByKey()
            | "write shards" >> beam.Map(write))


def write_list_parts(items, tmp_dir: str):
    """(status, row, line) -> sorted part files, one per status and row block; returns their
    (status, block, path)."""
    beam = import_beam()

    def write(item):
        (status, block), members = item
        path = beam_io.join(tmp_dir, f"{status}-{block:09d}.jsonl")
        text = "".join(line for _, line in sorted(members, key=lambda m: m[0]))
        beam_io.write_bytes(path, text.encode("utf-8"))
        return status, block, path

    return (items | "lines by block" >> beam.Map(lambda x: ((x[0], x[1] // BLOCK), (x[1], x[2])))
            | "group lines" >> beam.GroupByKey()
            | "write parts" >> beam.Map(write))


def _finish(_, report, shards, parts, out_dir: str):
    """After everything: the two lists in row order, and the combined report for the driver."""
    from rossjax.curate.compiled import shard_name
    from rossjax.curate.ledger import LISTS

    for status in LISTS:
        mine = [p for s, _, p in sorted(parts) if s == status]
        beam_io.concat(mine, beam_io.join(out_dir, f"{status}.jsonl"))
    report.shards = [{"path": shard_name(i), "examples": n, "bytes": b, "sha256": h}
                     for i, n, b, h in sorted(shards)]
    beam_io.write_bytes(beam_io.join(out_dir, _REPORT), pickle.dumps(report))


def curate(cfg, output: str | None = None) -> dict:
    """Run curation on Beam (same checks, outputs and report as pipeline.curate)."""
    import json

    from rossjax.curate.pipeline import STAGE, announce, check_config, field_mapping
    from rossjax.tokenizers import load_tokenizer

    beam = import_beam()
    out_dir = output or cfg.output
    rows_filter, files = check_config(cfg, out_dir, list_inputs=beam_io.input_files)
    stage = beam_io.join(out_dir, STAGE)
    beam_io.clear_dir(stage)  # a stopped run's leftovers
    tmp_dir = beam_io.join(stage, _TMP)
    beam_io.makedirs(tmp_dir)
    config = {**(cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)), "output": out_dir}
    fields = field_mapping(cfg)

    def build(p):
        rows = first_rows(read_rows(p, files, fields, spread=False))
        batches = rows | "batch" >> beam.BatchElements(min_batch_size=8,
                                                        max_batch_size=max(8, cfg.chunk_rows))
        out = batches | "curate" >> beam.ParDo(_curate_fn(config, rows_filter)).with_outputs(
            "lists", "report", main="kept")
        shards = write_shards(out.kept, stage, cfg.examples_per_shard)
        parts = write_list_parts(out.lists, tmp_dir)
        report = out.report | "combine reports" >> beam.CombineGlobally(_merge_reports())
        (p | "once" >> beam.Create([None])
         | "finish" >> beam.Map(_finish, report=beam.pvalue.AsSingleton(report),
                                shards=beam.pvalue.AsList(shards),
                                parts=beam.pvalue.AsList(parts), out_dir=stage))

    t0 = time.perf_counter()
    run_with_retries(build, cfg.beam_args, cfg.get("beam_retries", 1), "curate")
    report = pickle.loads(beam_io.read_bytes(beam_io.join(stage, _REPORT)))
    report.config = config
    report.tokenizer_vocab_size = int(load_tokenizer(cfg.tokenizer).vocab_size)
    if cfg.verify != "stored":  # each worker's own machine decides it; this one cannot know
        report.sandbox = "unknown (verdicts ran on the Beam workers)"
    out = report.to_dict(time.perf_counter() - t0)
    beam_io.delete([beam_io.join(stage, _REPORT)])
    beam_io.write_bytes(beam_io.join(stage, "report.json"),
                        (json.dumps(out, indent=2, default=str) + "\n").encode("utf-8"))
    beam_io.publish_dir(stage, out_dir)
    announce(report, cfg, out_dir, " (beam)")
    return out
