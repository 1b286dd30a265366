"""`rossjax curate`: read rollouts, verify, compile token masks, write ArrayRecord shards + report.

    rossjax curate --config=configs/curate.py --config.input=ROLLOUTS --config.output=DIR

Stages, per chunk of `chunk_rows` input rows (so memory stays bounded on millions of rows):
  read     schema.iter_records (formats.normalize first: TRL, verl, OpenAI rows and the
           config.fields mapping, docs/data.md); a malformed row goes to `invalid` with its reason;
  dedupe   a row whose id an earlier row had is withheld as `duplicate_id` (config.duplicates=
           "keep" keeps it; both count in report.json `ids`);
  verify   a row's verdict comes from, per `verify`:
             "auto"   (default) the stored record.verifier.passed when the row has one, else a
                      fresh run of the named verifier (verifier.name, else task.domain);
             "stored" the stored verdict only;
             "rerun"  a fresh run for every row that names a verifier;
           runs go to `verify_workers` CPU processes and the verdict is written into the record;
           `verify_fn=module:function` (GRPO's reward.fn signature, verify/base.py) replaces the
           named verifier for every row that gets a fresh verdict;
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
           (a row the compiler cannot handle at all is `invalid` as `compile_error`);
  write    kept examples into DIR/compiled-NNNNN.array_record (`examples_per_shard` each);
           withheld and invalid rows, with row number, id, reason code and detail, into
           DIR/withheld.jsonl and DIR/invalid.jsonl; counts into DIR/report.json (ledger.py).
           Everything is written into DIR.partial/ (created only once every input is known
           readable, and DIR/run.lock is held: a second run into DIR is refused naming the
           first's host and pid) and put in place as DIR by one atomic folder swap: a run
           stopped or killed at any moment leaves the previous DIR whole or the new one
           complete; files in DIR that curate did not write are carried over. An input that
           the swap would replace (DIR/invalid.jsonl, ...) is refused before anything is read;
  export   with config.export_format=parquet, DIR/data.parquet for TRL and verl (export_data.py),
           written in the stage, so it is published with the rest.
The shard format is compiled.py's. `curate(cfg)` runs these steps one chunk at a time
(`curate_chunk`); `run` adds the export and refuses a run that kept no row (one sentence with
the top reasons); the command line is rossjax/cli/curate.py.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from rossjax import runlock
from rossjax.curate.compiled import ShardWriter, encode_example
from rossjax.curate.files import check_readable, is_regular
from rossjax.curate.grain_flags import mark_absl_parsed
from rossjax.curate.ledger import OUTPUT_NAMES, Report, RowLists, check_inputs_outside, staged
from rossjax.curate.masks import MASK_MODES, CompiledExample, compile_rollout
from rossjax.curate.schema import chunked, expand_inputs, iter_records, verifier_positive
from rossjax.errors import ConfigError, InputError
from rossjax.tokenizers import load_tokenizer
from rossjax.verify import WorkerPool, verifier_name, verify_records
from rossjax.verify.base import load_fn, verify_fn_job

VERIFY_MODES = ("auto", "stored", "rerun")
ROW_FILTERS = ("accepted", "verifier_positive")
EXPORT_FORMATS = ("", "parquet")
STAGE = ".partial"  # DIR/.partial/: the Beam runner's stage (ledger.publish moves it beside DIR)
OUTPUTS = OUTPUT_NAMES
_NOT_ANNOTATED = ("the row carries no reviewer annotation and config.rows=accepted trains only on "
                  "rows a reviewer accepted or revised (config.rows=verifier_positive with "
                  "config.mask_mode=eligible keeps it: the positive-rollout SFT baseline)")


class Compiler:
    """Picklable per-row compile step; loads the tokenizer once per process."""

    def __init__(self, tokenizer: str, template: str, max_length: int | None, mask_mode: str,
                 template_kwargs: dict | None = None):
        self.spec, self.template, self.max_length, self.mask_mode = (
            tokenizer, template, max_length, mask_mode)
        self.template_kwargs = template_kwargs or {}
        self._tok = None

    @classmethod
    def from_config(cls, cfg) -> "Compiler":
        """The compile step config (tokenizer, template, max_length, mask_mode, template_kwargs)
        asks for; both runners build it here."""
        return cls(cfg.tokenizer, cfg.template, cfg.max_length or None, cfg.mask_mode,
                   template_kwargs(cfg))

    def __getstate__(self):
        return {**self.__dict__, "_tok": None}

    def __call__(self, item):
        if self._tok is None:
            self._tok = load_tokenizer(self.spec)
        row, record = item
        try:
            ex = compile_rollout(record, self._tok, template=self.template,
                                 max_length=self.max_length, mask_mode=self.mask_mode,
                                 template_kwargs=self.template_kwargs)
        except Exception as e:  # noqa: BLE001 - one row the tokenizer cannot take ends no run
            z = np.zeros(0, np.int32)
            ex = CompiledExample(record.get("id", ""), z, z.astype(np.uint8), z.astype(np.uint8),
                                 "invalid", "compile_error",
                                 f"the row cannot be compiled: {type(e).__name__}: {e}"[:300])
        ex.text = None  # not needed downstream; keeps worker -> host pickles small
        return row, ex


def template_kwargs(cfg) -> dict:
    """config.template_kwargs: a JSON object of extra template variables (e.g. enable_thinking)."""
    raw = cfg.get("template_kwargs", "") or ""
    if not raw:
        return {}
    if isinstance(raw, dict) or hasattr(raw, "to_dict"):
        return dict(raw)
    try:
        out = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"config.template_kwargs {raw!r} is not a JSON object ({e.msg})") from None
    if not isinstance(out, dict):
        raise ConfigError(f"config.template_kwargs {raw!r} must be a JSON object, like "
                          f"'{{\"enable_thinking\": false}}'")
    return out


def field_mapping(cfg) -> dict:
    """config.fields (input_key, label_key, reward_key, reward_threshold, id_key) as a dict."""
    f = cfg.get("fields", None)
    f = dict(f.to_dict() if hasattr(f, "to_dict") else (f or {}))
    if f.get("reward_threshold") is not None and not f.get("reward_key"):
        raise ConfigError("config.fields.reward_threshold needs config.fields.reward_key (the "
                          "column holding the reward)")
    return f


def _count_lines(files: list[str]) -> int | None:
    """Rows to expect (the progress bar's total) when every input is a plain JSONL file, else
    None: a pipe is never read ahead (its rows would be gone before the run reads them)."""
    if not all(p.endswith(".jsonl") and is_regular(p) for p in files):
        return None
    total = 0
    for p in files:
        with open(p, "rb") as f:
            total += sum(buf.count(b"\n") for buf in iter(lambda: f.read(1 << 20), b""))
    return total


_UNVERIFIED = {
    "stored": "the row stores no verifier verdict and verify=stored runs none (plain SFT "
              "data: --config.recipe=sft on curate and train; else config.verify=auto, or "
              "config.unverified=keep to keep it unverified)",
    "auto": "the row stores no verifier verdict and names no verifier to run (plain SFT data: "
            "--config.recipe=sft on curate and train; else name a verifier with verifier.name, "
            "a task.domain that is a verifier or config.verify_fn=module:function, or set "
            "config.unverified=keep to keep it unverified)",
}
_UNVERIFIED["rerun"] = _UNVERIFIED["auto"]


def review_status(record: dict) -> str:
    """The reviewer's decision: accept | revise | drop, or "none" when the row has no annotation
    (an annotation without a status is an accept, as in the record schema)."""
    ann = record.get("annotation")
    return "none" if ann is None else ann.get("status", "accept")


def check_rows(cfg) -> str:
    """config.rows, checked against config.mask_mode (one sentence when they do not fit)."""
    rows = cfg.get("rows", "accepted")
    if rows not in ROW_FILTERS:
        raise ConfigError(f"config.rows {rows!r} must be one of {', '.join(ROW_FILTERS)}")
    if cfg.mask_mode not in MASK_MODES:
        raise ConfigError(f"config.mask_mode {cfg.mask_mode!r} must be one of {', '.join(MASK_MODES)}")
    if rows == "verifier_positive" and cfg.mask_mode != "eligible":
        raise ConfigError(f"config.rows='verifier_positive' ignores the reviewers' annotations, so it "
                         f"needs config.mask_mode='eligible', not {cfg.mask_mode!r} (annotated masks "
                         f"go with config.rows='accepted')")
    return rows


def has_verdict(record: dict) -> bool:
    """True when the record stores a verdict: verifier.passed present (true, false or null)."""
    ver = record.get("verifier")
    return isinstance(ver, dict) and "passed" in ver


def check_config(cfg, out_dir: str, list_inputs=expand_inputs) -> tuple[str, list[str]]:
    """Everything that can be checked before the output dir is touched (one sentence each),
    then the output locked for this run (runlock.LockHeld when another run holds it; `staged`
    or `finish` releases it): returns the row filter and the input files."""
    if cfg.verify not in VERIFY_MODES:
        raise ConfigError(f"config.verify {cfg.verify!r} must be one of {', '.join(VERIFY_MODES)}")
    for key in ("undecided", "unverified"):
        if cfg[key] not in ("withhold", "keep"):
            raise ConfigError(f"config.{key} {cfg[key]!r} must be 'withhold' or 'keep'")
    rows_filter = check_rows(cfg)
    if not out_dir:
        raise ConfigError("config.output is empty; set --config.output=DIR")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConfigError(f"config.output {out_dir} is a file; curate writes a folder there")
    if cfg.get("duplicates", "withhold") not in ("withhold", "keep"):
        raise ConfigError(f"config.duplicates {cfg.duplicates!r} must be 'withhold' or 'keep'")
    if cfg.get("export_format", "") not in EXPORT_FORMATS:
        raise ConfigError(f"config.export_format {cfg.export_format!r} must be '' or 'parquet'")
    template_kwargs(cfg)
    field_mapping(cfg)
    if cfg.get("verify_fn", ""):
        if cfg.verify == "stored":
            raise ConfigError("config.verify_fn runs a function and config.verify=stored runs none; "
                              "set config.verify=auto (rows without a stored verdict) or rerun")
        load_fn(cfg.verify_fn)  # importable here, not first inside a worker
    files = list_inputs(cfg.input)  # a missing file or an empty pattern fails here
    check_inputs_outside(files, out_dir)  # an input the publish would replace
    check_readable(files)  # so the stage appears only once every input can be read
    try:  # fail here, not inside a worker after reading rows
        load_tokenizer(cfg.tokenizer)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"config.tokenizer {cfg.tokenizer!r} cannot be loaded: {e}") from None
    runlock.hold(out_dir, "rossjax curate")  # both runners: before any stage is cleared
    return rows_filter, files


def fresh_verdicts(todo: list, mode: str, pool: WorkerPool, report: Report, fn: str = "",
                   threshold: float = 0.5) -> None:
    """Run the named verifier (or the verify function `fn`, for every row) on the rows that need
    a fresh verdict (all for "rerun", those without a stored verdict for "auto") and write it
    into each record."""
    named = [(i, fn or verifier_name(r)) for i, (_, r) in enumerate(todo)
             if mode == "rerun" or not has_verdict(r)]
    named = [(i, n) for i, n in named if n]
    if fn:
        verdicts = pool.map([(todo[i][1], fn, threshold) for i, _ in named], verify_fn_job)
    else:
        verdicts = verify_records(pool, [todo[i][1] for i, _ in named]) if named else []
    for (i, name), v in zip(named, verdicts):
        rec = todo[i][1]
        rec["verifier"] = {**(rec.get("verifier") or {}), "name": name,
                           "passed": v.passed, "evidence": v.evidence}
    report.verify["rerun"] += len(named)


def filter_rows(todo: list, cfg, rows_filter: str, lists: RowLists) -> tuple[list, dict]:
    """The verdict and row-filter policy: rows to compile [(row, record)] and each one's reviewer
    decision {row: status}; every other row is listed as withheld with its reason."""
    report = lists.report
    ready, review = [], {}
    for row, rec in todo:
        ver = rec.get("verifier")
        if not has_verdict(rec):
            report.verify["unverified"] += 1
            if cfg.unverified == "withhold":
                lists.add("withheld", row, rec["id"], "unverified", _UNVERIFIED[cfg.verify])
                continue
        else:
            report.add_verdict(ver.get("passed"))
            if ver.get("passed") is None and cfg.undecided == "withhold":
                lists.add("withheld", row, rec["id"], "verifier_undecided",
                          f"verifier {ver.get('name', '?')} could not decide: "
                          f"{ver.get('evidence', '')}"[:300])
                continue
        review[row] = review_status(rec)
        if rows_filter == "verifier_positive":
            # not resolved at all: a drop or a broken selector must not withhold it
            rec = {k: v for k, v in rec.items() if k != "annotation"}
        elif review[row] == "none" and verifier_positive(
                rec, undecided=cfg.undecided, unverified=cfg.unverified):
            lists.add("withheld", row, rec["id"], "not_annotated", _NOT_ANNOTATED)
            continue
        ready.append((row, rec))
    return ready, review


def compile_rows(ready: list, compiler: Compiler, workers: int):
    """(row, CompiledExample) for each ready row, in order; on grain worker processes when
    `workers > 0`."""
    import grain

    ds = grain.MapDataset.source(ready).map(compiler).to_iter_dataset()
    if workers > 0 and len(ready) > 1:
        mark_absl_parsed()
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return ds


def curate_chunk(chunk, cfg, rows_filter: str, pool: WorkerPool, compiler: Compiler,
                 lists: RowLists, shards: ShardWriter, seen: dict | None = None) -> None:
    """Read -> dedupe -> verify -> filter -> compile -> write for one chunk of input rows.
    `seen` ({id: first row}: kept across chunks, or given whole by the Beam runner's global
    pass) finds duplicate ids; None skips the check."""
    todo = []
    keep_dupes = cfg.get("duplicates", "withhold") == "keep"
    for row in chunk:
        if row.record is None:
            lists.add("invalid", row.row, row.id, "invalid_record", row.reason)
            continue
        rid = row.record["id"]
        lists.report.ids["derived"] += bool(row.derived_id)
        if seen is not None and seen.setdefault(rid, row.row) != row.row:
            lists.report.ids["duplicate"] += 1
            if not keep_dupes:
                lists.add("withheld", row.row, rid, "duplicate_id",
                          f"row {seen[rid]} already has id {rid!r} (the first row with an id "
                          f"is kept; config.duplicates=keep keeps every one)")
                continue
        todo.append((row.row, row.record))
    if cfg.verify != "stored":
        fresh_verdicts(todo, cfg.verify, pool, lists.report, cfg.get("verify_fn", ""),
                       float(cfg.get("verify_threshold", 0.5)))
    ready, review = filter_rows(todo, cfg, rows_filter, lists)
    for row, ex in compile_rows(ready, compiler, cfg.workers):
        if ex.status == "kept":
            shards.write(encode_example(ex))
            lists.report.add("kept", example=ex, review=review[row])
        else:
            lists.add(ex.status, row, ex.id or None, ex.reason, ex.detail)


def curate(cfg, output: str | None = None) -> dict:
    """Run the pipeline for an ml-collections config (see configs/curate.py) into `output`
    (default config.output); returns the report."""
    out_dir = output or cfg.output
    rows_filter, files = check_config(cfg, out_dir)
    with staged(out_dir) as stage:  # published at the end; the lock released
        report, out = _curate_into(cfg, out_dir, stage, rows_filter, files)
    announce(report, cfg, out_dir)
    return out


def _curate_into(cfg, out_dir: str, stage: str, rows_filter: str, files: list[str]):
    """The run's outputs, all written into `stage`: (Report, its dict)."""
    from tqdm import tqdm

    config = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    report = Report({**config, "output": out_dir})
    report.tokenizer_vocab_size = int(load_tokenizer(cfg.tokenizer).vocab_size)
    if cfg.verify != "stored":  # the mode code verdicts come from (hook-only is the weakest)
        from rossjax.verify import sandbox
        report.sandbox = sandbox.isolation()
    compiler = Compiler.from_config(cfg)
    shards = ShardWriter(stage, cfg.examples_per_shard, report.shards)
    fields, seen = field_mapping(cfg), {}
    t0 = time.perf_counter()
    bar = tqdm(total=_count_lines(files), unit="row", desc="curate", disable=not cfg.progress,
               file=sys.stderr)
    pool = WorkerPool(cfg.verify_workers if cfg.verify != "stored" else 0)
    try:
        with pool, RowLists(stage, report) as lists:
            for chunk in chunked(iter_records(files, fields), cfg.chunk_rows):
                curate_chunk(chunk, cfg, rows_filter, pool, compiler, lists, shards, seen)
                bar.update(len(chunk))
                bar.set_postfix_str(f"kept {report.buckets['kept']}")
    finally:
        bar.close()
        shards.close()
    out = report.write(stage, time.perf_counter() - t0)
    if cfg.get("export_format", "") == "parquet" and out["buckets"]["kept"]:
        _export(stage, out_dir)
    return report, out


def _export(curated: str, out_dir: str) -> None:
    from rossjax.curate.export_data import export_parquet

    export_parquet(curated)
    print(f"rossjax curate: wrote {os.path.join(out_dir, 'data.parquet')} (input_ids, "
          f"attention_mask, labels, assistant_masks)", file=sys.stderr)


def announce(report: Report, cfg, out_dir: str, runner: str = "") -> None:
    """The run's closing lines on stderr (both runners): the summary, and notes on empty input,
    derived ids and duplicate ids."""
    if report.input_rows == 0:
        print(f"rossjax curate: warning: {cfg.input} holds no rows; the output is empty",
              file=sys.stderr)
    print(f"rossjax curate: {report.summary()} -> {out_dir}{runner}", file=sys.stderr)
    if report.ids["derived"]:
        print(f"rossjax curate: note: {report.ids['derived']} rows had no id; each was given one "
              f"derived from its content (sha- and 16 hex of the SHA-256 of its messages, tools, "
              f"task and source)", file=sys.stderr)
    if report.ids["duplicate"]:
        print(f"rossjax curate: note: {report.ids['duplicate']} rows repeat an earlier row's id "
              f"({'kept' if cfg.get('duplicates') == 'keep' else 'withheld as duplicate_id'})",
              file=sys.stderr)


def check_kept(report: dict, cfg, out_dir: str) -> None:
    """A run that read rows but kept none is an error: one sentence with the top reasons."""
    if not report["input_rows"] or report["buckets"]["kept"]:
        return
    counts = [(n, status, code) for status in ("withheld", "invalid")
              for code, n in report["reasons"][status].items()]
    top = sorted(counts, key=lambda c: -c[0])[:3]
    words = []
    for n, status, code in top:
        hint = ""
        if code == "too_long":
            hint = (f" (rows are longer than config.max_length={cfg.max_length} tokens; raise it, "
                    f"0 = no limit)")
        words.append(f"{n} {status} as {code}{hint}")
    raise InputError(f"{cfg.input}: none of the {report['input_rows']} rows was kept: "
                     f"{'; '.join(words)}; each row's reason is in {out_dir}/withheld.jsonl and "
                     f"{out_dir}/invalid.jsonl")


def finish(cfg, report: dict, out_dir: str) -> dict:
    """After either runner: the Parquet export (config.export_format; the local runner wrote it
    in its stage already) and the kept-nothing check; then the Beam runner's lock is released."""
    try:
        if (cfg.get("export_format", "") == "parquet" and report["buckets"]["kept"]
                and not os.path.exists(os.path.join(out_dir, "data.parquet"))):
            _export(out_dir, out_dir)
        check_kept(report, cfg, out_dir)
    finally:
        runlock.release(out_dir)
    return report


def run(cfg, workdir: str | None = None) -> dict:
    """`rossjax curate`: the pipeline into `workdir` (default config.output)."""
    return finish(cfg, curate(cfg, workdir), workdir or cfg.output)
