"""`run(cfg, workdir)`: rollouts in, reviewer-annotated rollouts out, every row accounted for in
curate's ledger (curate/ledger.py: the same Report, withheld/invalid lists and report.json sum
check as `rossjax curate`).

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
            report.json: buckets add up to the input rows, `stages` counts requests, tokens,
            failed checks and withheld rows per stage, and `outcomes` the answers that decide a
            row: audit accept / revise / drop, localization located / unresolved.
`check_kept(report, cfg, workdir)` turns a run that kept no row into one sentence saying why and
which setting changes it (the CLI exits 2 on it).
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
from urllib.parse import urlsplit

from rossjax.curate.ledger import Report, RowLists, write_json
from rossjax.errors import ConfigError, InputError
from rossjax.openai_api.transport import display_url
from rossjax.review.agentic import review_agentic
from rossjax.review.checks import AUDIT_OUTCOMES
from rossjax.review.client import REASK, ReviewerClient, ReviewerError
from rossjax.review.prompts import PROMPT_VERSION, response_format
from rossjax.review.render import MODES, review_mode
from rossjax.review.single_turn import review_single_turn
from rossjax.review.steps import Row, RowWithheld
from rossjax.review.transcripts import TRANSCRIPTS

ROW_FILTERS = ("verifier_positive", "all")
SHARD_PREFIX = "reviewed-"
STAGES = ("proposal", "audit", "repair", "discovery", "localization")
KEPT_BY = ("reviewed", "passed_through", "bypassed")
OUTCOMES = {"audit": AUDIT_OUTCOMES, "localization": ("located", "unresolved")}
# Reasons a row is withheld before anything is asked, and the setting that would review it.
NOT_ELIGIBLE = {
    "unverified": "the rows store no verifier verdict (a reward is not one); "
                  "--config.unverified=keep reviews them (set it in the curate run too)",
    "verifier_failed": "their verifier failed; --config.rows=all reviews them",
    "verifier_undecided": "their verifier could not decide; --config.undecided=keep reviews them "
                          "(set it in the curate run too)",
    "too_long": "raise --config.max_length (0 = no limit)",
}


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
    """The config as report.json records it: the API key blanked, URL credentials hidden."""
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else json.loads(json.dumps(dict(cfg), default=str))
    e = d.get("endpoint") or {}
    if e.get("api_key"):
        e["api_key"] = "<redacted>"
    if e.get("base_url"):
        e["base_url"] = display_url(urlsplit(e["base_url"]))
    return d


def make_client(cfg, cache_dir: str, *, base_url: str | None = None,
                model: str | None = None) -> ReviewerClient:
    """The client of config.endpoint; `base_url` / `model` when the caller derived them (a model
    it serves itself) instead of configuring them."""
    e = cfg.endpoint
    return ReviewerClient(base_url or e.base_url or None, model or e.model,
                          api_key=e.api_key or None,
                          timeout_s=e.timeout_s, max_retries=e.max_retries,
                          temperature=e.temperature, max_tokens=e.max_tokens, cache_dir=cache_dir,
                          backoff_s=e.backoff_s, extra_body=e.get("extra_body", ""),
                          max_response_bytes=e.get("max_response_bytes", 8 << 20),
                          reask=cfg.get("reask", "failed"))


def _check_config(cfg):
    if cfg.rows not in ROW_FILTERS:
        raise ConfigError(f"config.rows {cfg.rows!r} must be one of {', '.join(ROW_FILTERS)}")
    if cfg.mode not in MODES:
        raise ConfigError(f"config.mode {cfg.mode!r} must be one of {', '.join(MODES)}")
    if cfg.get("reask", "failed") not in REASK:
        raise ConfigError(f"config.reask {cfg.reask!r} must be one of {', '.join(REASK)}")
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
        return "verifier_failed", (f"verifier {ver.get('name', '?')} failed this rollout "
                                   "(config.rows=all reviews it)")
    if isinstance(ver, dict) and "passed" in ver:
        return "verifier_undecided", (f"verifier {ver.get('name', '?')} could not decide "
                                      "(config.undecided=keep reviews it)")
    return "unverified", ("the row stores no verifier verdict (a reward is not one); "
                          "config.unverified=keep reviews it")


class ReviewRun:
    """One review of `cfg.input` into `workdir`: `prepare` settles or queues each row read,
    `procedure` reviews a queued row (in worker threads), `settle` books its outcome;
    `execute` drives the chunks and returns the report. Use as a context manager (the output
    files are closed however the run ends)."""

    def __init__(self, cfg, workdir: str):
        from rossjax.curate.schema import expand_inputs
        from rossjax.tokenizers import load_tokenizer

        _check_config(cfg)
        self.cfg, self.workdir = cfg, workdir
        self.files = expand_inputs(cfg.input)  # one file, a directory, a glob or a comma list
        try:
            self.tok = load_tokenizer(cfg.tokenizer)
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(f"config.tokenizer {cfg.tokenizer!r} cannot be loaded: {e}") from None
        self.client = make_client(cfg, cfg.cache_dir or os.path.join(workdir, "cache"))
        os.makedirs(workdir, exist_ok=True)
        _clear_outputs(workdir)
        self.if_domains = {d.strip() for d in cfg.if_domains.split(",") if d.strip()}
        self._compile_lock = threading.Lock()  # tokenizers are not all thread-safe
        self.ledger = Report(public_config(cfg))
        self.rows_read = 0
        self.answered = 0  # reviewer answers received so far (a refusal before any: setup error)
        self.kept_by, self.procedures, self.attempts = Counter(), Counter(), Counter()
        self.risks = Counter()  # the proposal's risk tags over kept reviewed rows
        self.outcomes = Counter()  # "stage:outcome" over every row's deciding answers
        self.stage_withheld = {s: Counter() for s in STAGES}
        self.stage_checks = {s: Counter() for s in STAGES}
        self.shards = _Shards(workdir, cfg.rows_per_shard, cfg.compress)
        self.lists = RowLists(workdir, self.ledger)
        self.transcripts = open(os.path.join(workdir, TRANSCRIPTS), "w", encoding="utf-8")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shards.close()
        self.transcripts.close()
        self.lists.close()

    def compile(self, rec):
        from rossjax.curate.masks import compile_rollout

        with self._compile_lock:
            return compile_rollout(rec, self.tok, template=self.cfg.template,
                                   max_length=self.cfg.max_length or None)

    def keep(self, record: dict, how: str, status: str):
        self.ledger.add("kept", review=status)
        self.kept_by[how] += 1
        self.shards.write(record)

    def prepare(self, row):
        """(row number, Row) to review, or None once the row is settled without asking."""
        from rossjax.curate.schema import verifier_positive
        from rossjax.templates import render_chat

        cfg, rec = self.cfg, row.record
        self.rows_read += 1
        if rec is None:
            self.lists.add("invalid", row.row, row.id, "invalid_record", row.reason)
            return None
        positive = verifier_positive(rec, undecided=cfg.undecided, unverified=cfg.unverified)
        if cfg.rows == "verifier_positive" and not positive:
            self.lists.add("withheld", row.row, rec["id"], *_not_positive(rec))
            return None
        if rec.get("annotation") is not None and not cfg.overwrite:
            self.keep(rec, "passed_through", rec["annotation"].get("status", "accept"))
            return None
        rec = {k: v for k, v in rec.items() if k not in ("annotation", "review")}
        pre = self.compile(rec)
        if pre.status != "kept":  # no annotation could make this row compile: do not ask
            self.lists.add(pre.status, row.row, rec["id"], pre.reason, pre.detail)
            return None
        if cfg.if_bypass and positive and (rec.get("task") or {}).get("domain") in self.if_domains:
            self.keep({**rec, "annotation": {"status": "accept"},
                       "review": {"bypass": "instruction_following",
                                  "prompt_version": PROMPT_VERSION}}, "bypassed", "accept")
            return None
        return row.row, Row(self.client, rec, render_chat(rec["messages"], cfg.template, self.tok),
                            self.compile, cfg.max_step_retries, cfg.max_answer_chars,
                            cfg.endpoint.response_format)

    def _procedure_name(self, r: Row) -> str:
        return "agentic" if review_mode(r.record, self.cfg.mode) == "exclude" else "single_turn"

    def procedure(self, item):
        """The row's annotation (a dict) or the RowWithheld that ended its review."""
        _, r = item
        try:
            if self._procedure_name(r) == "agentic":
                return review_agentic(r, self.cfg.step_group)
            return review_single_turn(r, self.cfg.max_repair_rounds)
        except RowWithheld as e:
            return e

    def settle(self, item, out):
        row, r = item
        proc = self._procedure_name(r)
        self.procedures[proc] += 1
        self.attempts[r.answers] += 1
        self.answered += r.answers
        self.outcomes.update(r.outcomes)
        for entry in r.transcript:
            if "check" in entry:
                self.stage_checks[entry["stage"]][entry["check"]["code"]] += 1
        rid = r.record["id"]
        withheld = isinstance(out, RowWithheld)
        if withheld:
            self.lists.add("withheld", row, rid, out.code, out.detail)
            self.stage_withheld[out.stage][out.code] += 1
        else:
            info = {"model": self.client.model, "prompt_version": PROMPT_VERSION,
                    "procedure": proc, "answers": r.answers, "reason": out["reason"]}
            info.update({k: out[k] for k in ("repair_rounds", "proposal", "excluded_errors",
                                             "findings") if k in out})
            self.risks.update((out.get("proposal") or {}).get("risk", ()))
            self.keep({**r.record, "annotation": out["annotation"], "review": info}, "reviewed",
                      out["annotation"]["status"])
        self.transcripts.write(json.dumps(
            {"row": row, "id": rid, "procedure": proc, "status": "withheld" if withheld else "kept",
             "reason": out.code if withheld else None, "entries": r.transcript},
            ensure_ascii=False) + "\n")

    def review_chunk(self, pool, chunk):
        items = [it for it in map(self.prepare, chunk) if it is not None]
        outs = list(pool.map(self.procedure, items))
        failed = [o for o in outs if isinstance(o, RowWithheld) and o.endpoint]
        if (outs and len(failed) == len(outs) and not self.answered
                and not any(r.answers for _, r in items)):
            # every request failed at the endpoint, none ever answered: the setup, not the rows
            raise ReviewerError(failed[0].detail)
        for item, out in zip(items, outs):  # input order
            self.settle(item, out)

    def execute(self) -> dict:
        from tqdm import tqdm

        from rossjax.curate.schema import chunked, iter_records

        t0 = time.perf_counter()
        bar = tqdm(unit="row", desc="review", disable=not self.cfg.progress, file=sys.stderr)
        try:
            with ThreadPoolExecutor(max(1, self.cfg.endpoint.concurrency)) as pool:
                for chunk in chunked(iter_records(self.files), self.cfg.chunk_rows):
                    self.review_chunk(pool, chunk)
                    bar.update(len(chunk))
                    bar.set_postfix_str(f"kept {self.ledger.buckets['kept']}")
        finally:
            bar.close()
        self.shards.close()
        report = self.report(time.perf_counter() - t0)
        write_json(os.path.join(self.workdir, "report.json"), report)
        return report

    def stages(self) -> dict:
        out = {}
        for s in STAGES:
            c = dict(self.client.stats.get(s, {}))
            if c or self.stage_withheld[s] or self.stage_checks[s]:
                out[s] = {**{k: c.get(k, 0) for k in ("requests", "retries", "cache_hits",
                                                      "reasked", "prompt_tokens",
                                                      "completion_tokens")},
                          "failed_checks": dict(sorted(self.stage_checks[s].items())),
                          "withheld": dict(sorted(self.stage_withheld[s].items()))}
        return out

    def report(self, elapsed_s: float) -> dict:
        acc = self.ledger.accounts(self.rows_read)  # every row read is settled exactly once
        kept_by_review = acc.pop("kept_by_review")
        return {
            **acc,
            "kept_by": {k: self.kept_by[k] for k in KEPT_BY},
            "kept_by_status": {k: n for k, n in sorted(kept_by_review.items()) if n},
            "procedures": dict(sorted(self.procedures.items())),
            "risk_tags": dict(sorted(self.risks.items())),
            "attempts": {str(k): v for k, v in sorted(self.attempts.items())},
            "requests": {**self.client.totals(), "connections": self.client.connections},
            "stages": self.stages(),
            "outcomes": {st: {o: self.outcomes[f"{st}:{o}"] for o in names}
                         for st, names in OUTCOMES.items()},
            "reviewer": {"url": self.client.url, "model": self.client.model,
                         "prompt_version": PROMPT_VERSION},
            "outputs": self.shards.written,
            "transcripts": TRANSCRIPTS,
            "config": self.ledger.config,
            "elapsed_s": round(elapsed_s, 3),
        }


def run(cfg, workdir: str) -> dict:
    """Review the rollouts of an ml-collections config (configs/review.py) into `workdir`;
    returns the report (also written to WORKDIR/report.json)."""
    with ReviewRun(cfg, workdir) as r:
        return r.execute()


def nothing_asked(report: dict) -> str:
    """A run that asked the reviewer nothing although rows were withheld before review: the
    reasons with the setting that would review them ("" when something was asked)."""
    q = report["requests"]
    withheld = {k: n for k, n in report["reasons"]["withheld"].items() if k in NOT_ELIGIBLE}
    if q["requests"] + q["cache_hits"] or not withheld:
        return ""
    why = "; ".join(f"{n} withheld as {k}: {NOT_ELIGIBLE[k]}"
                    for k, n in sorted(withheld.items(), key=lambda kv: -kv[1]))
    return f"no row was sent to the reviewer (0 requests): {why}"


def check_kept(report: dict, cfg, workdir: str) -> None:
    """A run that read rows but kept none is an InputError: one sentence with the top reasons,
    each with the setting that changes it."""
    if not report["input_rows"] or report["buckets"]["kept"]:
        return
    ledger = Report()
    for status in ("withheld", "invalid"):
        ledger.reasons[status].update(report["reasons"][status])
    top = ledger.top_reasons(3)
    asked = report["requests"]["requests"] + report["requests"]["cache_hits"]
    words = []
    for n, status, code in top:
        hint = NOT_ELIGIBLE.get(code)
        if code == "too_long":
            hint = f"rows are longer than config.max_length={cfg.max_length} tokens; {hint}"
        elif code.startswith("reviewer_") and code not in ("reviewer_drop",):
            hint = ("a rerun asks failed answers again (config.reask=failed); "
                    f"see {os.path.join(workdir, TRANSCRIPTS)}")
        words.append(f"{n} {status} as {code}" + (f" ({hint})" if hint else ""))
    what = ("no row is eligible for review" if not asked
            else "none of the reviewed rows was kept")
    raise InputError(f"{cfg.input}: {what} ({report['input_rows']} rows read): "
                     f"{'; '.join(words)}; each row's reason is in "
                     f"{os.path.join(workdir, 'withheld.jsonl')} and invalid.jsonl")
