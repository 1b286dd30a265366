"""`run(cfg, workdir)`: expert artifacts in, verified trajectories out, every artifact in one
bucket of curate's ledger (curate/ledger.py: report.json's buckets add up to the input rows).

  read     config.input (.jsonl): {"id", "domain", "text", "kind"?, "title"?, "context"?} per
           line (context: side context such as an abstract, shown to induction only); a line
           that is not JSON or lacks a field is invalid (invalid_artifact, naming file, row and
           field), a repeated id is invalid (duplicate_id)
  anchor   anchor.py; trace trace.py; verify verify.py; per config.method (baselines.py)
  write    WORKDIR/trajectories.jsonl: the kept records, the input of
           `rossjax retrogen --config.input=WORKDIR/trajectories.jsonl` (gate, thresholds,
           serialization into SFT rollouts); withheld.jsonl / invalid.jsonl ({row, id, reason,
           detail}); transcripts.jsonl (every request and answer per artifact); report.json
           (buckets, reasons, requests and failed checks per stage, signal means per domain,
           the diversity draws of the kept records, the next command)
  resume   WORKDIR/journal.jsonl holds each settled artifact (record or reason, transcript): a
           rerun with the same settings settles those from it and asks nothing for them; the
           answer cache (config.cache_dir, default WORKDIR/cache) covers an artifact cut off
           halfway. An artifact the endpoint failed or refused (endpoint_error,
           endpoint_refused) is not journaled: a rerun asks it again. Outputs are rewritten
           whole, so no artifact is ever listed twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from rossjax.curate.ledger import Report, RowLists, write_json
from rossjax.errors import ConfigError, InputError
from rossjax.openai_api import REASK
from rossjax.reconstruct import journal as journal_lib, prompts
from rossjax.reconstruct.asking import LONE_SURROGATE, NOT_TEXT, Asker, Settled
from rossjax.reconstruct.baselines import METHODS, run_artifact
from rossjax.reconstruct.trace import Tools
from rossjax.reconstruct.verify import SIGNALS
from rossjax.review.run import make_client, public_config

OUTPUTS = ("trajectories.jsonl", "transcripts.jsonl", "report.json")


def check_config(cfg):
    if cfg.method not in METHODS:
        raise ConfigError(f"config.method {cfg.method!r} must be one of {', '.join(METHODS)}")
    if cfg.get("reask", "failed") not in REASK:
        raise ConfigError(f"config.reask {cfg.reask!r} must be one of {', '.join(REASK)}")
    for key, lo in (("max_tool_steps", 1), ("window_chars", 200), ("retrieval_depth", 1),
                    ("max_evidence", 1), ("rubric_min", 1), ("answer_retries", 0),
                    ("max_writing_steps", 0), ("max_cues", 0),
                    ("evidence_chars", 100), ("search_k", 1), ("max_answer_chars", 1),
                    ("min_artifact_chars", 1), ("leak.max_task_chars", 1),
                    ("endpoint.max_tokens", 1)):
        v = cfg[key.split(".")[0]][key.split(".")[1]] if "." in key else cfg[key]
        if v < lo:
            raise ConfigError(f"config.{key} must be >= {lo}, got {v}")
    if cfg.max_artifact_chars < cfg.min_artifact_chars:
        raise ConfigError(f"config.max_artifact_chars ({cfg.max_artifact_chars}) < "
                          f"config.min_artifact_chars ({cfg.min_artifact_chars})")
    if cfg.rubric_max < cfg.rubric_min:
        raise ConfigError(f"config.rubric_max ({cfg.rubric_max}) < config.rubric_min "
                          f"({cfg.rubric_min})")
    if cfg.endpoint.response_format not in ("none", "json_object"):
        raise ConfigError(f"config.endpoint.response_format {cfg.endpoint.response_format!r} must "
                          f"be none or json_object (every stage answers one JSON object)")
    if not 0 <= cfg.retrieval_min_ratio <= 1:
        raise ConfigError(f"config.retrieval_min_ratio must be in [0, 1], got "
                          f"{cfg.retrieval_min_ratio}")
    if not 0 < cfg.lam <= 1:
        raise ConfigError(f"config.lam must be in (0, 1], got {cfg.lam}")
    if cfg.leak.ngram < 2 or not 0 < cfg.leak.max_task_ratio <= 1:
        raise ConfigError("config.leak.ngram must be >= 2 and config.leak.max_task_ratio in (0, 1]")
    for key in ("input", "corpus"):
        if not cfg[key]:
            raise ConfigError(f"config.{key} is empty: name the artifacts .jsonl (input) and the "
                              f"corpus .jsonl (corpus)")
        if not os.path.isfile(cfg[key]):
            raise FileNotFoundError(f"{cfg[key]}: no such file (config.{key})")


def read_artifacts(path: str, min_chars: int, max_chars: int = 20_000):
    """(row, artifact or None, reason code, detail) per line of `path`."""
    from rossjax.curate.files import iter_json_lines

    name, seen = os.path.basename(path), set()
    for line in iter_json_lines(path):
        rec, where = line.record, f"{name} row {line.row}"
        if rec is None:
            yield line.row, None, None, "invalid_artifact", line.reason
            continue
        rid = rec.get("id") if isinstance(rec, dict) else None
        why = None
        if not isinstance(rec, dict):
            why = f"{where}: an artifact must be a JSON object, got {type(rec).__name__}"
        elif not isinstance(rid, str) or not rid.strip():
            why = f"{where}: id must be a non-empty string, got {rid!r:.40}"
        elif LONE_SURROGATE.search(rid):
            why, rid = f"{where}: id {rid!r:.40} {NOT_TEXT}", None  # the invalid row names none
        elif not isinstance(rec.get("domain"), str) or not rec["domain"].strip():
            why = f"{where} (artifact {rid}): domain must be a non-empty string"
        elif (not isinstance(rec.get("text"), str)
              or not min_chars <= len(rec["text"].strip()) <= max_chars):
            got = rec.get("text")
            size = f"{len(got.strip())} characters" if isinstance(got, str) else type(got).__name__
            why = (f"{where} (artifact {rid}): text must be a string of {min_chars} to {max_chars} "
                   f"characters (config.min_artifact_chars, max_artifact_chars), got {size}")
        else:
            for key in ("kind", "title", "context"):
                if rec.get(key) is not None and not isinstance(rec[key], str):
                    why = f"{where} (artifact {rid}): {key} must be a string when given"
            for key in ("domain", "text", "kind", "title", "context"):
                if not why and isinstance(rec.get(key), str) and LONE_SURROGATE.search(rec[key]):
                    why = f"{where} (artifact {rid}): {key} {NOT_TEXT}"
        if why:
            yield line.row, None, rid if isinstance(rid, str) else None, "invalid_artifact", why
        elif rid in seen:
            yield line.row, None, rid, "duplicate_id", f"{where}: id {rid!r} repeats an earlier row"
        else:
            seen.add(rid)
            art = {"id": rid, "domain": rec["domain"].strip(), "text": rec["text"].strip(),
                   "kind": rec.get("kind") or "", "title": rec.get("title") or "",
                   **({"context": rec["context"].strip()} if rec.get("context") else {})}
            yield line.row, art, rid, None, f"{where} (artifact {rid})"


def config_view(cfg, derived: dict | None = None) -> dict:
    """The config as a dict with the values the run derived (`{"endpoint.model": ...}`: the
    served model's URL and id, the model folder it built) in place: what the run fingerprints
    and reports. The config itself is never written."""
    d = cfg.to_dict()
    for key, value in (derived or {}).items():
        section, field = key.split(".")
        d.setdefault(section, {})[field] = value
    return d


def fingerprint(cfg, derived: dict | None = None) -> str:
    """What an artifact's outcome depends on: settings, prompts, model (not the URL: `:runlocal`
    serves on a fresh port each run; not concurrency, progress or where outputs go)."""
    d = config_view(cfg, derived)
    for k in ("output", "progress", "cache_dir", "then_retrogen", "then_sft", "sft",
              "loop"):
        d.pop(k, None)
    d["serve"] = {k: d.get("serve", {}).get(k) for k in ("model", "model_id", "max_len")}
    with open(cfg.corpus, "rb") as f:  # the corpus's content: its tools' answers depend on it
        d["corpus_sha256"] = hashlib.sha256(f.read()).hexdigest()
    e = d.get("endpoint", {})
    for k in ("base_url", "api_key", "concurrency", "timeout_s", "max_retries", "backoff_s"):
        e.pop(k, None)
    blob = json.dumps([d, prompts.PROMPT_VERSION], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _sha(art: dict) -> str:
    return hashlib.sha256(json.dumps(art, sort_keys=True).encode()).hexdigest()[:16]


class ReconstructRun:
    """One run over `cfg`; `derived` holds the values it derived instead of configured
    (config_view): the endpoint it serves itself, the model folder it built."""

    def __init__(self, cfg, workdir: str, derived: dict | None = None):
        from rossjax.agents.corpus import CorpusEnv

        check_config(cfg)
        self.cfg, self.workdir, derived = cfg, workdir, dict(derived or {})
        os.makedirs(workdir, exist_ok=True)
        for name in OUTPUTS:  # a killed run leaves no report of an earlier run behind
            if os.path.isfile(os.path.join(workdir, name)):
                os.remove(os.path.join(workdir, name))
        env = CorpusEnv(path=cfg.corpus, k=cfg.search_k)
        self.index, self.tools = env.index, Tools(env)
        self.client = make_client(cfg, cfg.cache_dir or os.path.join(workdir, "cache"),
                                  base_url=derived.get("endpoint.base_url"),
                                  model=derived.get("endpoint.model"))
        self.client.name = "reconstruct"  # its messages name this command, not review's reviewer
        self.ledger = Report(public_config(config_view(cfg, derived)))
        self.journal = journal_lib.Journal(workdir, fingerprint(cfg, derived))
        self.lists = RowLists(workdir, self.ledger)
        self.response_format = ({"type": "json_object"}
                                if cfg.endpoint.response_format == "json_object" else None)
        self.kept, self.transcripts = [], []
        self.failed_checks: dict = {}
        self.ended_at: dict = {}  # stage -> {"withheld:CODE" | "invalid:CODE": artifacts}
        self.resumed = self.rows_read = self.asked_rows = self.answered = 0
        self.settled_by_endpoint = []

    def close(self):
        self.lists.close()
        self.journal.close()

    def one(self, item):
        row, art, where = item
        asker = Asker(self.client, art["id"], where, self.cfg.answer_retries,
                      self.cfg.max_answer_chars, self.response_format)
        try:
            return item, run_artifact(asker, art, self.index, self.tools, self.cfg), asker
        except Settled as e:
            return item, e, asker

    def settle(self, row, rid, status, code, detail, record, transcript, failed_checks,
               stage=None):
        self.rows_read += 1
        if status == "kept":
            self.ledger.add("kept")
            self.kept.append(record)
        else:
            self.lists.add(status, row, rid, code, detail)
            self.ended_at.setdefault(stage or "read", Counter())[f"{status}:{code}"] += 1
        for stage, c in (failed_checks or {}).items():
            self.failed_checks.setdefault(stage, Counter()).update(c)
        self.transcripts.append({"row": row, "id": rid, "status": status, "reason": code,
                                 "entries": transcript or []})

    def finish(self, item, out, asker):
        row, art, _ = item
        self.asked_rows += 1
        self.answered += asker.answers
        if isinstance(out, Settled):
            status, code, detail, record, stage = out.status, out.code, out.detail, None, out.stage
        else:
            status, code, detail, record, stage = "kept", None, None, out, None
            record["model"] = self.client.model
        entry = {"row": row, "id": art["id"], "sha": _sha(art), "status": status, "reason": code,
                 "stage": stage, "detail": detail, "record": record,
                 "failed_checks": asker.failed_checks, "transcript": asker.transcript}
        if code in ("endpoint_error", "endpoint_refused"):  # not journaled: a rerun asks again
            self.settled_by_endpoint.append(detail)
        else:
            self.journal.add(entry)
        self.settle(row, art["id"], status, code, detail, record, asker.transcript,
                    asker.failed_checks, stage)

    def execute(self) -> dict:
        from tqdm import tqdm

        t0 = time.perf_counter()
        items = list(read_artifacts(self.cfg.input, self.cfg.min_artifact_chars,
                                    self.cfg.max_artifact_chars))
        bar = tqdm(total=len(items), unit="artifact", desc="reconstruct", file=sys.stderr,
                   disable=not self.cfg.progress)
        todo = []
        for row, art, rid, code, detail in items:
            if art is None:
                self.settle(row, rid, "invalid", code, detail, None, [], {})
                continue
            prev = self.journal.done.get((row, art["id"]))
            if prev is not None and prev.get("sha") == _sha(art):
                self.resumed += 1
                self.settle(row, art["id"], prev["status"], prev["reason"], prev["detail"],
                            prev["record"], prev["transcript"], prev["failed_checks"],
                            prev["stage"])
                continue
            todo.append((row, art, detail))
        bar.update(len(items) - len(todo))
        with ThreadPoolExecutor(max(1, self.cfg.endpoint.concurrency)) as pool:
            for item, out, asker in pool.map(self.one, todo):  # results in input order
                self.finish(item, out, asker)
                bar.update(1)
        bar.close()
        if todo and len(self.settled_by_endpoint) == len(todo) and not self.answered:
            # every request failed at the endpoint and none was ever answered: the setup
            raise InputError(f"no artifact got an answer from {self.client.url}: "
                             f"{self.settled_by_endpoint[0]}")
        return self.write(time.perf_counter() - t0)

    def write(self, elapsed_s: float) -> dict:
        self.transcripts.sort(key=lambda t: t["row"])  # input order
        path = os.path.join(self.workdir, "trajectories.jsonl")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in self.kept)
        os.replace(path + ".tmp", path)
        tpath = os.path.join(self.workdir, "transcripts.jsonl")
        with open(tpath + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(t, ensure_ascii=False) + "\n" for t in self.transcripts)
        os.replace(tpath + ".tmp", tpath)
        report = self.report(elapsed_s, path)
        if self.cfg.get("then_retrogen") and self.kept:
            report["retrogen"] = then_retrogen(path, os.path.join(self.workdir, "retrogen"))
        write_json(os.path.join(self.workdir, "report.json"), report)
        return report

    def report(self, elapsed_s: float, path: str) -> dict:
        acc = self.ledger.accounts(self.rows_read)
        acc.pop("kept_by_review")
        by_dom: dict = {}
        for r in self.kept:
            by_dom.setdefault(r["domain"], []).append(r)
        scores = {d: {"kept": len(rs), **{k: round(sum(r["scores"][k] for r in rs) / len(rs), 4)
                                          for k in SIGNALS},
                      "eq4": round(sum(r["score"] for r in rs) / len(rs), 4)}
                  for d, rs in sorted(by_dom.items())}
        draws = {}
        for r in self.kept:
            for k, v in (r.get("diversity") or {}).items():
                draws.setdefault(k, Counter())[str(v)] += 1
        stages = {}
        for s in sorted(set(self.client.stats) | set(self.failed_checks) | set(self.ended_at)):
            c = self.client.stats.get(s, Counter())
            stages[s] = {**{k: c.get(k, 0) for k in ("requests", "retries", "cache_hits",
                                                     "reasked", "prompt_tokens",
                                                     "completion_tokens")},
                         "failed_checks": dict(sorted(self.failed_checks.get(s, {}).items())),
                         "ended": dict(sorted(self.ended_at.get(s, {}).items()))}
        steps = [r["tool_steps"] for r in self.kept]
        return {
            **acc, "method": self.cfg.method, "resumed": self.resumed,
            "asked": self.asked_rows,
            "requests": {**self.client.totals(), "connections": self.client.connections},
            "stages": stages, "scores": scores,
            "tool_steps": {"min": min(steps), "max": max(steps),
                           "mean": round(sum(steps) / len(steps), 2)} if steps else {},
            "diversity": {k: dict(sorted(v.items())) for k, v in sorted(draws.items())},
            "model": {"url": self.client.url, "model": self.client.model,
                      "prompt_version": prompts.PROMPT_VERSION,
                      **({"standin": standin_notice()} if self.cfg.serve.model == "standin"
                         else {})},
            "outputs": {"trajectories": path, "withheld": "withheld.jsonl",
                        "invalid": "invalid.jsonl", "transcripts": "transcripts.jsonl"},
            "next": f"rossjax retrogen --config.input={path} "
                    f"--config.output={os.path.join(self.workdir, 'retrogen')}",
            "config": self.ledger.config, "elapsed_s": round(elapsed_s, 3),
        }


def then_retrogen(trajectories: str, out_dir: str) -> dict:
    """`rossjax retrogen` with configs/retrogen.py's defaults (the gate, the paper's per-domain
    thresholds, serialization into SFT rollouts) on this run's records, for `:runlocal`."""
    from rossjax.configs import retrogen as rg_config
    from rossjax.curate import retrogen

    g = rg_config.get_config()
    g.input, g.output = trajectories, out_dir
    res = retrogen.run(g)
    return {"kept": len(res.kept), "discarded": len(res.discarded),
            "thresholds": {d: r["threshold"] for d, r in res.report.items()},
            "rows": os.path.join(out_dir, "retrogen.jsonl")}


def standin_notice() -> str:
    from rossjax.reconstruct.standin import NOTICE

    return NOTICE


def run(cfg, workdir: str, serve_model: str | None = None) -> dict:
    """Reconstruct the artifacts of an ml-collections config (configs/reconstruct.py) into
    `workdir`; serves config.serve.model itself when set (`serve_model`: the folder to serve in
    its place, one the caller built for 'tiny'). Returns report.json's content. One run per
    workdir (its run.lock, rossjax/runlock.py): a second one would rewrite the journal and
    outputs of the first."""
    from rossjax import runlock

    if (serve_model or cfg.serve.model) == "tiny":
        raise ConfigError("config.serve.model='tiny' is built by `rossjax reconstruct` "
                          "(rossjax/cli/reconstruct.py tiny_model); give run() a model folder")
    check_config(cfg)
    lock = runlock.acquire(workdir, "rossjax reconstruct")
    try:
        return _served(cfg, workdir, {"serve.model": serve_model} if serve_model else {})
    finally:
        if lock is not None:
            lock.release()


def _served(cfg, workdir: str, derived: dict) -> dict:
    model = derived.get("serve.model", cfg.serve.model)
    if not model:
        return _run(cfg, workdir, derived)
    if model == "standin":  # rules, not a model: `:runlocal` offline (standin.py)
        from rossjax.reconstruct.standin import MODEL_ID, StandinServer

        derived = {**derived, "endpoint.model": MODEL_ID}
        if not _pending(cfg, workdir, derived):
            return _run(cfg, workdir, {**derived, "endpoint.base_url": "http://127.0.0.1:9/v1"})
        with StandinServer(cfg.corpus) as srv:
            return _run(cfg, workdir, {**derived, "endpoint.base_url": srv.url})
    # the served run names the model by its id; the URL is not fingerprinted
    derived = {**derived, "endpoint.model": cfg.serve.model_id}
    if not _pending(cfg, workdir, derived):
        # every artifact is journaled: nothing will be asked, so nothing is served
        return _run(cfg, workdir, {**derived, "endpoint.base_url": "http://127.0.0.1:9/v1"})
    from rossjax.reconstruct.local import LocalServer

    os.makedirs(workdir, exist_ok=True)
    with LocalServer(model, os.path.join(workdir, "serve.log"), max_len=cfg.serve.max_len,
                     slots=cfg.serve.slots, model_id=cfg.serve.model_id,
                     startup_s=cfg.serve.startup_s) as srv:
        return _run(cfg, workdir, {**derived, "endpoint.base_url": srv.url,
                                   "endpoint.model": srv.model_id})


def _pending(cfg, workdir: str, derived: dict) -> bool:
    """Whether a run would ask anything: an artifact of the input that the journal (written with
    these settings) does not settle."""
    check_config(cfg)
    done = journal_lib.settled(workdir, fingerprint(cfg, derived))
    if done is None:
        return True
    return any(art is not None and (row, art["id"], _sha(art)) not in done
               for row, art, *_ in read_artifacts(cfg.input, cfg.min_artifact_chars,
                                                cfg.max_artifact_chars))


def _run(cfg, workdir, derived=None):
    r = ReconstructRun(cfg, workdir, derived)
    try:
        return r.execute()
    finally:
        r.close()
