"""Staged annotation: rollouts in, reviewer-annotated rollouts out, every row accounted for.

Per chunk of `chunk_rows` input rows (memory stays bounded; the answer cache makes a killed run
resume where it stopped):
  read      curate.schema.iter_records (JSONL, .gz, Parquet); a bad row is `invalid` with the
            reader's sentence naming file, row and field, exactly as `rossjax curate` reports it;
  select    rows=verifier_positive (default) reviews rows whose verifier passed (or, with no
            verdict, whose reward > 0); the rest are withheld `not_verifier_positive`. A row that
            already carries an annotation is passed through unchanged unless `overwrite`.
            A row that cannot compile even without an annotation (too_long, token_mismatch,
            template errors, no eligible token) is withheld with curate's code before anything
            is asked, since no annotation can rescue it;
  ask       one chat request per row (prompt.py), concurrently (client.complete_many);
  check     the answer's one JSON object (answers.py; else `reviewer_unparseable`), status
            `drop` -> withheld `reviewer_drop`; otherwise the annotation is COMPILED with
            curate.masks.compile_rollout, tokenizer and template of the config: the very code
            `rossjax curate` runs, so an annotation that passes here compiles there;
  repair    on a failure to compile, up to `max_repairs` rounds: the reviewer gets its answer
            back with the exact error sentence and is asked for a corrected object; a row still
            failing is withheld with curate's code (anchor_missing, exclude_protected, ...);
  write     kept rows (input record + `annotation` + `review` {model, prompt_version, mode,
            attempts, raw_response_sha, reason}) into WORKDIR/reviewed-NNNNN.jsonl[.gz];
            withheld/invalid rows with row, id, reason and detail into withheld.jsonl /
            invalid.jsonl; counts into report.json (buckets add up to the input rows).
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass

from rossjax.curate.report import write_json
from rossjax.review.answers import Unparseable, extract_json, to_annotation
from rossjax.review.client import ReviewerClient, ReviewerError
from rossjax.review.prompt import MODES, PROMPT_VERSION, build_messages, repair_messages, review_mode

ROW_FILTERS = ("verifier_positive", "all")
SHARD_PREFIX = "reviewed-"
# Refusals that concern one request (too long for the context, a payload the server rejects):
# that row is withheld, the run goes on. Any other 4xx (auth, unknown model) stops the run.
_ROW_REFUSALS = (400, 413, 422)


def is_verifier_positive(record: dict) -> bool:
    """verifier.passed when the row stores a verdict, else reward > 0."""
    ver = record.get("verifier") or {}
    if ver.get("passed") is not None:
        return ver["passed"] is True
    reward = record.get("reward")
    return reward is not None and reward > 0


@dataclass
class _Item:
    row: int
    record: dict  # without annotation
    mode: str
    messages: list
    attempts: int = 0


class _Shards:
    """Annotated rows into reviewed-NNNNN.jsonl[.gz], renamed into place when complete."""

    def __init__(self, out_dir: str, per_shard: int, compress: bool):
        self.out_dir, self.per_shard, self.compress = out_dir, per_shard, compress
        self.f, self.index, self.count, self.tmp = None, 0, 0, None
        self.written: list[dict] = []

    def write(self, record: dict):
        if self.f is None:
            name = f"{SHARD_PREFIX}{self.index:05d}.jsonl" + (".gz" if self.compress else "")
            self.tmp = os.path.join(self.out_dir, name + ".tmp")
            self.f = (gzip.open(self.tmp, "wt", encoding="utf-8") if self.compress
                      else open(self.tmp, "w", encoding="utf-8"))
            self.written.append({"path": name, "rows": 0})
        self.f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.count += 1
        self.written[-1]["rows"] += 1
        if self.per_shard and self.count == self.per_shard:
            self.close()

    def close(self):
        if self.f is not None:
            self.f.close()
            os.replace(self.tmp, self.tmp[:-len(".tmp")])
            self.f, self.count, self.index = None, 0, self.index + 1


def _clear_outputs(out_dir: str):
    for p in glob.glob(os.path.join(out_dir, SHARD_PREFIX + "*")) + [
            os.path.join(out_dir, n) for n in ("report.json", "invalid.jsonl", "withheld.jsonl")]:
        if os.path.isfile(p):
            os.remove(p)


def public_config(cfg) -> dict:
    """The config as report.json records it, with the API key blanked."""
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else json.loads(json.dumps(dict(cfg), default=str))
    if (d.get("endpoint") or {}).get("api_key"):
        d["endpoint"]["api_key"] = "<redacted>"
    return d


def make_client(cfg, cache_dir: str) -> ReviewerClient:
    e = cfg.endpoint
    return ReviewerClient(e.base_url, e.model, api_key=e.api_key, timeout_s=e.timeout_s,
                          max_retries=e.max_retries, temperature=e.temperature,
                          max_tokens=e.max_tokens, cache_dir=cache_dir, backoff_s=e.backoff_s)


def review(cfg, workdir: str) -> dict:
    """Run the staged annotation for an ml-collections config (configs/review.py) into
    `workdir`; returns the report (also written to WORKDIR/report.json)."""
    from tqdm import tqdm

    from rossjax.templates import render_chat
    from rossjax.curate.masks import compile_rollout
    from rossjax.curate.schema import chunked, expand_inputs, iter_records
    from rossjax.tokenizers import load_tokenizer

    if cfg.rows not in ROW_FILTERS:
        raise ValueError(f"config.rows {cfg.rows!r} must be one of {', '.join(ROW_FILTERS)}")
    if cfg.mode not in MODES:
        raise ValueError(f"config.mode {cfg.mode!r} must be one of {', '.join(MODES)}")
    if cfg.max_repairs < 0:
        raise ValueError(f"config.max_repairs must be >= 0, got {cfg.max_repairs}")
    files = expand_inputs(cfg.input)  # one file, a directory, a glob or a comma list
    try:
        tok = load_tokenizer(cfg.tokenizer)
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"config.tokenizer {cfg.tokenizer!r} cannot be loaded: {e}") from None
    client = make_client(cfg, cfg.cache_dir or os.path.join(workdir, "cache"))
    os.makedirs(workdir, exist_ok=True)
    _clear_outputs(workdir)
    max_length = cfg.max_length or None

    def compile_(rec):
        return compile_rollout(rec, tok, template=cfg.template, max_length=max_length)

    buckets = Counter({"kept": 0, "withheld": 0, "invalid": 0})
    reasons = {"withheld": Counter(), "invalid": Counter()}
    kept_by, kept_status, modes, attempts = Counter(), Counter(), Counter(), Counter()
    n_rows = [0]
    answered = [0]  # answers received this run (a refusal before any answer stops the run)
    shards = _Shards(workdir, cfg.rows_per_shard, cfg.compress)
    lists = {k: open(os.path.join(workdir, f"{k}.jsonl"), "w", encoding="utf-8")
             for k in ("invalid", "withheld")}

    def bucket(status, row, rid, code, detail):
        buckets[status] += 1
        reasons[status][code] += 1
        lists[status].write(json.dumps({"row": row, "id": rid, "reason": code, "detail": detail},
                                       ensure_ascii=False) + "\n")

    def keep(record, how, status):
        buckets["kept"] += 1
        kept_by[how] += 1
        kept_status[status] += 1
        shards.write(record)

    def prepare(row) -> _Item | None:
        n_rows[0] += 1
        rec = row.record
        if rec is None:
            bucket("invalid", row.row, row.id, "invalid_record", row.reason)
            return None
        if cfg.rows == "verifier_positive" and not is_verifier_positive(rec):
            bucket("withheld", row.row, rec["id"], "not_verifier_positive",
                   "the verifier did not pass this rollout (or, with no verdict stored, its "
                   "reward is not > 0); config.rows=all reviews it anyway")
            return None
        if rec.get("annotation") is not None and not cfg.overwrite:
            keep(rec, "passed_through", rec["annotation"].get("status", "accept"))
            return None
        rec = {k: v for k, v in rec.items() if k not in ("annotation", "review")}
        pre = compile_(rec)
        if pre.status != "kept":  # no annotation could make this row compile: do not ask
            bucket(pre.status, row.row, rec["id"], pre.reason, pre.detail)
            return None
        mode = review_mode(rec, cfg.mode)
        modes[mode] += 1
        rendered = render_chat(rec["messages"], cfg.template, tok)
        return _Item(row.row, rec, mode, build_messages(rec, rendered, mode))

    def settle(it: _Item, answer, last_round: bool) -> bool:
        """Bucket the row for `answer`, or prepare its repair request (returns True)."""
        it.attempts += 1
        again = _settle(it, answer, last_round)
        if not again:
            attempts[it.attempts] += 1
        return again

    def _settle(it: _Item, answer, last_round: bool) -> bool:
        rid = it.record["id"]
        if isinstance(answer, ReviewerError):
            bucket("withheld", it.row, rid, "reviewer_refused", str(answer))
            return False
        try:
            ann, err = to_annotation(extract_json(answer))
        except Unparseable as e:
            bucket("withheld", it.row, rid, "reviewer_unparseable",
                   f"the reviewer's answer is not one JSON object ({e}): {answer[:160]!r}")
            return False
        code = "invalid_annotation"
        reason = ann.pop("reason", None)
        if err is None and ann["status"] == "drop":
            bucket("withheld", it.row, rid, "reviewer_drop",
                   f"the reviewer dropped this rollout: {reason or 'no reason given'}")
            return False
        if err is None:
            ex = compile_({**it.record, "annotation": ann})
            if ex.status == "kept":
                review_info = {"model": client.model, "prompt_version": PROMPT_VERSION,
                               "mode": it.mode, "attempts": it.attempts,
                               "raw_response_sha": hashlib.sha256(answer.encode()).hexdigest()}
                if reason:
                    review_info["reason"] = reason
                keep({**it.record, "annotation": ann, "review": review_info}, "reviewed",
                     ann["status"])
                return False
            # after the schema check passed on the bare row, any failure is the annotation's
            code = "invalid_annotation" if ex.reason == "invalid_record" else ex.reason
            err = ex.detail
        if last_round:
            bucket("withheld", it.row, rid, code,
                   f"{err} (still failing after {it.attempts} reviewer answer(s))")
            return False
        it.messages = repair_messages(it.messages, answer, err)
        return True

    def ask(items: list[_Item]):
        for round_ in range(cfg.max_repairs + 1):
            if not items:
                return
            answers = client.complete_many([it.messages for it in items], cfg.endpoint.concurrency,
                                           progress=cfg.progress, return_exceptions=True,
                                           desc="review" if round_ == 0 else f"repair {round_}")
            for a in answers:
                if isinstance(a, ReviewerError) and a.status not in _ROW_REFUSALS:
                    raise a
            ok = sum(not isinstance(a, ReviewerError) for a in answers)
            if ok == 0 and answered[0] == 0:
                raise answers[0]  # every request refused, none ever answered: a setup problem
            answered[0] += ok
            last = round_ == cfg.max_repairs
            items = [it for it, a in zip(items, answers) if settle(it, a, last)]

    t0 = time.perf_counter()
    bar = tqdm(unit="row", desc="rows", disable=not cfg.progress, file=sys.stderr)
    try:
        for chunk in chunked(iter_records(files), cfg.chunk_rows):
            ask([it for it in map(prepare, chunk) if it is not None])
            bar.update(len(chunk))
            bar.set_postfix_str(f"kept {buckets['kept']}")
    finally:
        bar.close()
        shards.close()
        for f in lists.values():
            f.close()
    if sum(buckets.values()) != n_rows[0]:  # the accounting promise of the design
        raise AssertionError(f"buckets sum to {sum(buckets.values())} but {n_rows[0]} rows "
                             "were read")
    report = {
        "input_rows": n_rows[0],
        "buckets": dict(buckets),
        "reasons": {k: dict(sorted(v.items())) for k, v in reasons.items()},
        "kept_by": {"reviewed": kept_by["reviewed"], "passed_through": kept_by["passed_through"]},
        "kept_by_status": dict(sorted(kept_status.items())),
        "modes": dict(sorted(modes.items())),
        "attempts": {str(k): v for k, v in sorted(attempts.items())},
        "requests": dict(client.stats),
        "reviewer": {"url": client.url, "model": client.model, "prompt_version": PROMPT_VERSION},
        "outputs": shards.written,
        "config": public_config(cfg),
        "elapsed_s": round(time.perf_counter() - t0, 3),
    }
    write_json(os.path.join(workdir, "report.json"), report)
    return report
