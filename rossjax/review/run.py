"""`run(cfg, workdir)`: rollouts in, reviewer-annotated rollouts out, every row accounted for.

Per chunk of `chunk_rows` input rows (memory stays bounded; the answer cache makes a killed run
resume where it stopped, asking nothing twice):
  read      curate.schema.iter_records; a bad row is `invalid` with the reader's sentence;
  select    rows=verifier_positive (default) reviews the rows curate will train on
            (curate.schema.verifier_positive with config.undecided / config.unverified); the
            rest are withheld verifier_failed / verifier_undecided / unverified, as curate
            would. A row that already carries an annotation is passed through unless
            `overwrite`; a row that cannot compile even without an annotation (too_long,
            token_mismatch, template errors, no eligible token) is withheld with curate's code
            before anything is asked. With config.if_bypass, a verifier-positive row of an
            instruction-following domain (config.if_domains) is kept with full supervision and
            never asked (the paper's IF rule);
  review    single_turn.py or agentic.py per row (render.review_mode), rows concurrently;
  write     kept rows (record + `annotation` + `review` {model, prompt_version, procedure,
            answers, reason, ...}) into WORKDIR/reviewed-NNNNN.jsonl[.gz]; withheld/invalid rows
            into withheld.jsonl / invalid.jsonl; every request and answer of each reviewed row
            into transcripts.jsonl (what `rossjax inspect` shows next to the mask); counts into
            report.json: buckets add up to the input rows, and `stages` counts requests, tokens,
            failed checks and withheld rows per stage.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from rossjax.errors import ConfigError
from rossjax.review.agentic import review_agentic
from rossjax.review.client import ReviewerClient, ReviewerError
from rossjax.review.prompts import PROMPT_VERSION, response_format
from rossjax.review.render import MODES, review_mode
from rossjax.review.single_turn import review_single_turn
from rossjax.review.steps import Row, RowWithheld
from rossjax.review.transcripts import TRANSCRIPTS

ROW_FILTERS = ("verifier_positive", "all")
SHARD_PREFIX = "reviewed-"
STAGES = ("proposal", "audit", "repair", "discovery", "localization")


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
            os.path.join(out_dir, n) for n in ("report.json", "invalid.jsonl", "withheld.jsonl",
                                               TRANSCRIPTS)]:
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
    return ReviewerClient(e.base_url or None, e.model, api_key=e.api_key or None,
                          timeout_s=e.timeout_s, max_retries=e.max_retries,
                          temperature=e.temperature, max_tokens=e.max_tokens, cache_dir=cache_dir,
                          backoff_s=e.backoff_s, extra_body=e.get("extra_body", ""))


def _check_config(cfg):
    if cfg.rows not in ROW_FILTERS:
        raise ConfigError(f"config.rows {cfg.rows!r} must be one of {', '.join(ROW_FILTERS)}")
    if cfg.mode not in MODES:
        raise ConfigError(f"config.mode {cfg.mode!r} must be one of {', '.join(MODES)}")
    for key in ("max_step_retries", "max_repair_rounds"):
        if cfg[key] < 0:
            raise ConfigError(f"config.{key} must be >= 0, got {cfg[key]}")
    if cfg.step_group < 1:
        raise ConfigError(f"config.step_group must be >= 1, got {cfg.step_group}")
    for key in ("undecided", "unverified"):
        if cfg[key] not in ("withhold", "keep"):
            raise ConfigError(f"config.{key} {cfg[key]!r} must be 'withhold' or 'keep'")
    try:
        response_format("proposal", cfg.endpoint.response_format)
    except ValueError as e:
        raise ConfigError(f"config.endpoint.{e}") from None


def _not_positive(rec: dict) -> tuple[str, str]:
    ver = rec.get("verifier")
    if isinstance(ver, dict) and ver.get("passed") is False:
        return "verifier_failed", f"verifier {ver.get('name', '?')} failed this rollout"
    if isinstance(ver, dict) and "passed" in ver:
        return "verifier_undecided", (f"verifier {ver.get('name', '?')} could not decide "
                                      "(config.undecided=keep reviews it)")
    return "unverified", ("the row stores no verifier verdict (a reward is not one); run "
                          "`rossjax curate` verification first, or config.unverified=keep")


def run(cfg, workdir: str) -> dict:
    """Review the rollouts of an ml-collections config (configs/review.py) into `workdir`;
    returns the report (also written to WORKDIR/report.json)."""
    from tqdm import tqdm

    from rossjax.curate.ledger import list_line, write_json
    from rossjax.curate.masks import compile_rollout
    from rossjax.curate.schema import chunked, expand_inputs, iter_records, verifier_positive
    from rossjax.templates import render_chat
    from rossjax.tokenizers import load_tokenizer

    _check_config(cfg)
    files = expand_inputs(cfg.input)  # one file, a directory, a glob or a comma list
    try:
        tok = load_tokenizer(cfg.tokenizer)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"config.tokenizer {cfg.tokenizer!r} cannot be loaded: {e}") from None
    client = make_client(cfg, cfg.cache_dir or os.path.join(workdir, "cache"))
    os.makedirs(workdir, exist_ok=True)
    _clear_outputs(workdir)
    max_length = cfg.max_length or None
    if_domains = {d.strip() for d in cfg.if_domains.split(",") if d.strip()}
    compile_lock = threading.Lock()  # tokenizers are not all thread-safe

    def compile_(rec):
        with compile_lock:
            return compile_rollout(rec, tok, template=cfg.template, max_length=max_length)

    buckets = Counter({"kept": 0, "withheld": 0, "invalid": 0})
    reasons = {"withheld": Counter(), "invalid": Counter()}
    kept_by, kept_status, procs, answers = Counter(), Counter(), Counter(), Counter()
    stage_withheld = {s: Counter() for s in STAGES}
    stage_checks = {s: Counter() for s in STAGES}
    n_rows = [0]
    answered = [0]  # reviewer answers received so far (a refusal before any is a setup error)
    shards = _Shards(workdir, cfg.rows_per_shard, cfg.compress)
    lists = {k: open(os.path.join(workdir, f"{k}.jsonl"), "w", encoding="utf-8")
             for k in ("invalid", "withheld")}
    transcripts = open(os.path.join(workdir, TRANSCRIPTS), "w", encoding="utf-8")

    def bucket(status, row, rid, code, detail):
        buckets[status] += 1
        reasons[status][code] += 1
        lists[status].write(list_line(row, rid, code, detail))

    def keep(record, how, status):
        buckets["kept"] += 1
        kept_by[how] += 1
        kept_status[status] += 1
        shards.write(record)

    def prepare(row):
        """A Row to review, or None once the row is settled without asking."""
        n_rows[0] += 1
        rec = row.record
        if rec is None:
            bucket("invalid", row.row, row.id, "invalid_record", row.reason)
            return None
        positive = verifier_positive(rec, undecided=cfg.undecided, unverified=cfg.unverified)
        if cfg.rows == "verifier_positive" and not positive:
            bucket("withheld", row.row, rec["id"], *_not_positive(rec))
            return None
        if rec.get("annotation") is not None and not cfg.overwrite:
            keep(rec, "passed_through", rec["annotation"].get("status", "accept"))
            return None
        rec = {k: v for k, v in rec.items() if k not in ("annotation", "review")}
        pre = compile_(rec)
        if pre.status != "kept":  # no annotation could make this row compile: do not ask
            bucket(pre.status, row.row, rec["id"], pre.reason, pre.detail)
            return None
        if cfg.if_bypass and positive and (rec.get("task") or {}).get("domain") in if_domains:
            keep({**rec, "annotation": {"status": "accept"},
                  "review": {"bypass": "instruction_following", "prompt_version": PROMPT_VERSION}},
                 "bypassed", "accept")
            return None
        return (row.row, Row(client, rec, render_chat(rec["messages"], cfg.template, tok),
                             compile_, cfg.max_step_retries, cfg.max_answer_chars,
                             cfg.endpoint.response_format))

    def procedure(item):
        _, r = item
        agentic = review_mode(r.record, cfg.mode) == "exclude"
        try:
            if agentic:
                return review_agentic(r, cfg.step_group)
            return review_single_turn(r, cfg.max_repair_rounds)
        except RowWithheld as e:
            return e

    def settle(item, out):
        row, r = item
        proc = "agentic" if review_mode(r.record, cfg.mode) == "exclude" else "single_turn"
        procs[proc] += 1
        answers[r.answers] += 1
        answered[0] += r.answers
        for entry in r.transcript:
            if "check" in entry:
                stage_checks[entry["stage"]][entry["check"]["code"]] += 1
        rid = r.record["id"]
        if isinstance(out, RowWithheld):
            bucket("withheld", row, rid, out.code, out.detail)
            stage_withheld[out.stage][out.code] += 1
            status = "withheld"
        else:
            info = {"model": client.model, "prompt_version": PROMPT_VERSION, "procedure": proc,
                    "answers": r.answers, "reason": out["reason"]}
            for k in ("repair_rounds", "findings"):
                if k in out:
                    info[k] = out[k]
            keep({**r.record, "annotation": out["annotation"], "review": info}, "reviewed",
                 out["annotation"]["status"])
            status = "kept"
        transcripts.write(json.dumps(
            {"row": row, "id": rid, "procedure": proc, "status": status,
             "reason": out.code if status == "withheld" else None, "entries": r.transcript},
            ensure_ascii=False) + "\n")

    t0 = time.perf_counter()
    bar = tqdm(unit="row", desc="review", disable=not cfg.progress, file=sys.stderr)
    try:
        with ThreadPoolExecutor(max(1, cfg.endpoint.concurrency)) as pool:
            for chunk in chunked(iter_records(files), cfg.chunk_rows):
                items = [it for it in map(prepare, chunk) if it is not None]
                outs = list(pool.map(procedure, items))
                refused = [o for o in outs if isinstance(o, RowWithheld)
                           and o.code == "reviewer_refused"]
                if (outs and len(refused) == len(outs) and not answered[0]
                        and not any(r.answers for _, r in items)):
                    # every request refused, none ever answered: a setup problem, not the rows
                    raise ReviewerError(refused[0].detail)
                for item, out in zip(items, outs):  # input order
                    settle(item, out)
                bar.update(len(chunk))
                bar.set_postfix_str(f"kept {buckets['kept']}")
    finally:
        bar.close()
        shards.close()
        transcripts.close()
        for f in lists.values():
            f.close()
    if sum(buckets.values()) != n_rows[0]:  # the accounting promise (docs/data.md)
        raise AssertionError(f"buckets sum to {sum(buckets.values())} but {n_rows[0]} rows "
                             "were read")
    stages = {}
    for s in STAGES:
        c = dict(client.stats.get(s, {}))
        if c or stage_withheld[s] or stage_checks[s]:
            stages[s] = {**{k: c.get(k, 0) for k in ("requests", "retries", "cache_hits",
                                                     "prompt_tokens", "completion_tokens")},
                         "failed_checks": dict(sorted(stage_checks[s].items())),
                         "withheld": dict(sorted(stage_withheld[s].items()))}
    report = {
        "input_rows": n_rows[0],
        "buckets": dict(buckets),
        "reasons": {k: dict(sorted(v.items())) for k, v in reasons.items()},
        "kept_by": {k: kept_by[k] for k in ("reviewed", "passed_through", "bypassed")},
        "kept_by_status": dict(sorted(kept_status.items())),
        "procedures": dict(sorted(procs.items())),
        "attempts": {str(k): v for k, v in sorted(answers.items())},
        "requests": {**client.totals(), "connections": client.connections},
        "stages": stages,
        "reviewer": {"url": client.url, "model": client.model, "prompt_version": PROMPT_VERSION},
        "outputs": shards.written,
        "transcripts": TRANSCRIPTS,
        "config": public_config(cfg),
        "elapsed_s": round(time.perf_counter() - t0, 3),
    }
    write_json(os.path.join(workdir, "report.json"), report)
    return report
