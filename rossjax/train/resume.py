"""A workdir resumes only the run that made it: the same config and the same training data.

`check` runs before a training command restores a checkpoint. It compares the config as given
with the one saved in `WORKDIR/resume.json` by the run that wrote the checkpoints, and a
fingerprint of the training data (curated folders: each one's report.json sha256, its timing
fields left out so a deterministic re-curate of the same rows matches, and its shard files'
names, sizes and whole-file sha256: the one curate recorded while writing each shard, which the
reader checks against the file, else the file hashed now; GRPO: the task file's size and sha256)
with the saved one. A record from before whole-file hashes (`shard_hash` absent: first and last
MiB only) is compared the old way once, and saved anew. A difference
is refused with the changed fields listed, unless `--config.resume_changes=FIELD,...` accepts
them (a section, e.g. `optim`, accepts every field in it; `data.train` / `data.tasks` accepts
other data behind the same or a moved path). Accepted changes are printed and appended to
resume.json's `accepted` list; a refused run writes nothing. resume.json is read and written without following links
(runlock.read_nofollow / write_atomic): a planted link is refused, never written through.

Some fields change without being asked:
  * where and how the run runs, not what it computes (OPERATIONAL: checkpoint and log
    intervals, the mesh, the distributed set-up, worker counts, remat and attention kernels,
    loss chunking, GRPO's completion packing, debug switches), noted on stderr;
  * the run's length (LENGTH: train.num_steps, train.epochs, grpo.steps), which is how a
    finished run is extended ("Raise --config.train.num_steps ..."); the note says the learning
    rate schedule now spans the new length, so its later steps differ from a run started long.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys

from etils import epath

from rossjax import runlock
from rossjax.checksums import file_sha256
from rossjax.errors import ConfigError, InputError, read_json

FIELD = "resume_changes"
FILE = "resume.json"
OPERATIONAL = ("workdir", FIELD, "checkpoint", "log", "log_every", "sample_every",
               "train.log_every", "train.eval_every", "train.debug_kill_at_step", "grpo.stop_after",
               "distributed", "reward.workers", "data.worker_count", "mesh", "sharding_rules",
               "model.remat_policy", "model.attention_impl", "train.loss_chunk", "grpo.loss_chunk",
               "grpo.pack_completions")
LENGTH = ("train.num_steps", "train.epochs", "grpo.steps")


class ResumeRefused(InputError):
    """Resuming would continue a run with another config or other data."""


def flatten(d: dict, prefix: str = "") -> dict:
    """{"a.b": value} of a nested dict, values as JSON gives them back (tuples as lists)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _as_json(cfg) -> dict:
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    return json.loads(json.dumps(d, default=str))


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


_MISSING = "(not set)"


def changed_fields(saved: dict, current: dict) -> list[tuple[str, object, object]]:
    """(field, saved value, current value) of every field that differs, sorted."""
    a, b = flatten(saved), flatten(current)
    return [(k, a.get(k, _MISSING), b.get(k, _MISSING)) for k in sorted(set(a) | set(b))
            if k not in a or k not in b or not _same(a[k], b[k])]


def _covers(field: str, names) -> bool:
    return any(field == n or field.startswith(n + ".") for n in names)


def accepted_fields(cfg, fields) -> list[str]:
    """The fields `config.resume_changes` names (comma-separated); ConfigError for one that is
    no field or section of the config."""
    raw = str(cfg.get(FIELD, "") or "")
    names = [x.strip().removeprefix("config.") for x in raw.split(",") if x.strip()]
    for n in names:
        if not any(f == n or f.startswith(n + ".") for f in fields):
            raise ConfigError(f"config.{FIELD} names {n!r}, which is not a field or section of "
                              f"this config.")
    return names


def curated_fingerprint(paths) -> list[dict]:
    """Per training path: its report.json's sha256 and its shards' names, sizes and sha256."""
    from rossjax.curate.compiled import shard_digests

    out = []
    for p in paths:
        report = os.path.join(p, "report.json") if os.path.isdir(p) else ""
        out.append({"path": os.path.abspath(p),
                    "report_sha256": _report_sha256(report) if report and os.path.exists(report)
                    else None,
                    "shard_hash": "sha256",
                    "shards": {os.path.basename(s): [size, sha]
                               for s, (size, sha) in shard_digests(p).items()}})
    return out


def _as_saved(saved: list, now: list) -> list:
    """`now` as an older resume.json recorded it: shards hashed by first and last MiB where the
    saved entry has no `shard_hash`, so upgrading rossjax does not refuse the same data."""
    out = []
    for old, new in zip(saved, now):
        if "shards" in new and "shard_hash" not in old:
            root = new["path"]
            new = {**{k: v for k, v in new.items() if k != "shard_hash"}, "shards": {
                n: [size, _ends_sha256(os.path.join(root, n) if os.path.isdir(root) else root)]
                for n, (size, _) in new["shards"].items()}}
        out.append(new)
    return out + now[len(out):]


# report.json fields that differ between two curations of the same rows (rossjax/curate/ledger.py)
_REPORT_TIMING = ("elapsed_s", "rows_per_s")


def _report_sha256(path: str) -> str:
    """sha256 of a report's canonical JSON without its timing (the raw bytes for a report that
    is not a JSON object)."""
    import hashlib

    raw = open(path, "rb").read()
    try:
        rep = json.loads(raw)
    except ValueError:
        rep = None
    if isinstance(rep, dict):
        raw = json.dumps({k: v for k, v in rep.items() if k not in _REPORT_TIMING},
                         sort_keys=True).encode()
    return hashlib.sha256(raw).hexdigest()


def _ends_sha256(path, span: int = 1 << 20) -> str:
    """sha256 of a file's first and last `span` bytes (all of a small file): the fingerprint of
    resume.json files written before whole-shard hashes (`_as_saved`)."""
    import hashlib

    size = os.path.getsize(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(span))
        if size > span:
            f.seek(max(span, size - span))
            h.update(f.read(span))
    return h.hexdigest()


def tasks_fingerprint(spec: str) -> list[dict]:
    """A GRPO task file's size and sha256 (nothing for the built-in `gen:` generators)."""
    if str(spec).startswith("gen:") or not os.path.exists(spec):
        return [{"path": str(spec)}]
    return [{"path": os.path.abspath(spec), "size": os.path.getsize(spec),
             "sha256": file_sha256(spec)}]


def _data_changes(saved: list, now: list) -> list[str]:
    """What differs between two fingerprints (paths aside: a moved folder is the same data)."""
    if len(saved) != len(now):
        return [f"{len(saved)} training path(s) then, {len(now)} now"]
    out = []
    for old, new in zip(saved, now):
        where = new["path"]
        for key in ("report_sha256", "sha256", "size"):
            if old.get(key) != new.get(key):
                what = "report.json" if key == "report_sha256" else key
                out.append(f"{where}: {what} {_short(old.get(key))} -> {_short(new.get(key))}")
        a, b = old.get("shards") or {}, new.get("shards") or {}
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                out.append(f"{where}: shard {name} " + (
                    "is new" if name not in a else "is gone" if name not in b
                    else f"{a[name][0]} -> {b[name][0]} bytes" if a[name][0] != b[name][0]
                    else "holds other bytes"))
    return out


def _short(v) -> str:
    return "none" if v is None else f"{v[:12]}..." if isinstance(v, str) and len(v) > 16 else str(v)


def _fmt(v) -> str:
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _derived(current: dict) -> tuple[str, ...]:
    """Fields a run fills in from others: GRPO with the ASCII tokenizer and a from-scratch model
    sets model.vocab_size to the tokenizer's when it is unset (grpo_setup.Run), so an unset and
    a filled-in value are the same model (a real shape change fails the checkpoint's own check)."""
    if current.get("tokenizer") == "ascii" and not (current.get("model") or {}).get("path"):
        return ("model.vocab_size",)
    return ()


def check(workdir, cfg, command: str, *, resuming: bool, data: list, data_field: str,
          lead: bool, log=None) -> list[str]:
    """Refuse (ResumeRefused) to resume `workdir` with another config or other data than its
    checkpoints were trained with, unless `config.resume_changes` accepts the difference; then,
    on the lead process, record this run's config and data in WORKDIR/resume.json. Returns the
    notes printed (lead only)."""
    log = log or sys.stderr
    path = epath.Path(workdir) / FILE
    current = _as_json(cfg)
    there = path.exists() if "://" in os.fspath(path) else os.path.lexists(path)  # a link too
    saved = _read_record(path) if resuming and there else None
    notes, record = [], {"accepted": []}
    fields = flatten(current)
    accepted = accepted_fields(cfg, list(fields) + ([] if saved is None else
                                                    list(flatten(saved.get("config", {})))))
    if resuming and saved is None:
        notes.append(f"{workdir} holds checkpoints but no {FILE} (made by an older rossjax), so "
                     f"this run's config and data cannot be compared with theirs.")
    elif saved is not None:
        record["accepted"] = list(saved.get("accepted") or [])
        diff = [d for d in changed_fields(saved.get("config") or {}, current)
                if not _covers(d[0], (FIELD, "workdir") + _derived(current))]
        data_diff = _data_changes(saved.get("data") or [], _as_saved(saved.get("data") or [], data))
        refused = [d for d in diff if not _covers(d[0], OPERATIONAL + LENGTH + tuple(accepted))]
        data_refused = data_diff and not _covers(data_field, accepted)
        if refused or data_refused:
            parts = []
            if refused:
                parts.append("its config differs in " + ", ".join(
                    f"{k} ({_fmt(a)} -> {_fmt(b)})" for k, a, b in refused))
            if data_refused:
                parts.append(f"its training data ({data_field}) differs: " + "; ".join(data_diff[:4])
                             + (f"; and {len(data_diff) - 4} more" if len(data_diff) > 4 else ""))
            names = [k for k, _, _ in refused] + ([data_field] if data_refused else [])
            raise ResumeRefused(
                f"--workdir {workdir} holds checkpoints of another run: "
                + " and ".join(parts) + f"; resuming would mix the two. Give a new --workdir, or "
                f"accept the changes with --config.{FIELD}={','.join(names)}.")
        taken = [d for d in diff if _covers(d[0], tuple(accepted))
                 and not _covers(d[0], OPERATIONAL + LENGTH)]
        if taken or (data_diff and _covers(data_field, accepted)):
            entry = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "fields": {k: [a, b] for k, a, b in taken},
                     **({"data": data_diff} if data_diff else {})}
            record["accepted"].append(entry)
            notes.append("resuming with changes accepted by --config.resume_changes: " + ", ".join(
                [f"{k} ({_fmt(a)} -> {_fmt(b)})" for k, a, b in taken]
                + ([f"{data_field} data ({'; '.join(data_diff[:2])})"] if data_diff else [])) + ".")
        for k, a, b in diff:
            if _covers(k, LENGTH) and not _covers(k, tuple(accepted)):
                notes.append(f"{k} changed {_fmt(a)} -> {_fmt(b)} on resume: the run's length, "
                             f"so the learning-rate schedule now spans the new length.")
        ops = [f"{k} ({_fmt(a)} -> {_fmt(b)})" for k, a, b in diff
               if _covers(k, OPERATIONAL) and not _covers(k, (FIELD, "workdir"))]
        if ops:
            notes.append("resuming with other run settings: " + ", ".join(ops) + ".")
    if lead:
        for n in notes:
            print(f"rossjax {command}: note: {n}", file=log)
        current[FIELD] = ""  # an acceptance is for the run that gave it, not for later reruns
        record.update(config=current, data=data)
        text = json.dumps(record, indent=1, sort_keys=True) + "\n"
        if "://" in os.fspath(path):  # gs://: no links there
            tmp = epath.Path(workdir) / (FILE + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
        else:
            runlock.write_atomic(os.fspath(path), text.encode(), what="a resume record")
    return notes if lead else []


def _read_record(path) -> dict:
    """WORKDIR/resume.json; a local one is read without following a link (another run's record
    linked in would resume against the wrong config and data)."""
    if "://" in os.fspath(path):
        return read_json(os.fspath(path), "resume record")
    raw = runlock.read_nofollow(os.fspath(path), what="a resume record")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise InputError(f"{path}: the resume record is not valid JSON ({e}).") from None
