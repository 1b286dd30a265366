"""The accounts of a run over rollout rows (curate; review writes the same files): every input
row in exactly one bucket, with a reason for each row not kept, plus token accounting.

`RowLists` writes withheld.jsonl and invalid.jsonl ({row, id, reason, detail} per line) while
`Report` counts; `write_json` writes report.json atomically; `open_stage` and `publish` put a
finished run's folder in place atomically (below).

report.json holds
  input_rows                      rows read (valid or not)
  buckets   {kept, withheld, invalid}   -> sum == input_rows (checked before writing)
  reasons   {withheld: {code: n}, invalid: {code: n}}
  tokens    {kept_total, kept_eligible, kept_supervised, kept_excluded_eligible, kept_content,
             kept_excluded_content}: eligible counts include the end-of-turn markers, content
             counts are the response content alone (content, reasoning, tool calls)
  ter       target exclusion rate: unsupervised / all response-content tokens over kept rows,
            token-weighted, end-of-turn markers excluded
  ter_by_step {step: {content, excluded, ter}}: the same per RL step of origin (the row's
            source.step, as an RL run's history.jsonl records it); {} when no row has one
  verify    {mode, unverified_policy, undecided_policy, passed, failed, undecided, unverified,
             rerun}: verdicts by outcome; `unverified` rows had no verdict at all (withheld as
             `unverified` unless config.unverified="keep"); `rerun` verdicts were computed in
             this run, the rest were read from the records
  kept_by_review {accept, revise, drop, none}: kept rows by their reviewer decision (drop and
                  none only appear with config.rows="verifier_positive")
  ids       {derived, duplicate}: rows that had no id (given one from their content) and rows
            whose id an earlier row already had (withheld as `duplicate_id` unless
            config.duplicates="keep")
  token_ids {max, tokenizer, tokenizer_vocab_size}: the largest token id in the kept rows and
            the tokenizer that wrote them (`rossjax train` checks both against the model)
  kept_lengths {min, max}: tokens per kept row (train names rows too long for data.seq_len)
  shards    [{path, examples}], config (with mask_mode and rows, which `rossjax train` checks
            against its recipe), elapsed_s, rows_per_s
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import json
import os
import shutil
import stat
from collections import Counter

from rossjax import runlock
from rossjax.curate.compiled import SHARD_GLOB
from rossjax.errors import ConfigError


def write_json(path: str, obj) -> None:
    """Write JSON atomically (tmp + rename): a reader never sees a half-written report; a link
    planted at the tmp name is removed, never written through (runlock.write_atomic)."""
    text = json.dumps(obj, indent=2, default=str) + "\n"
    runlock.write_atomic(path, text.encode("utf-8"), what="a report")


LISTS = ("invalid", "withheld")


def list_line(row: int, rid, code: str, detail: str) -> str:
    """One line of withheld.jsonl / invalid.jsonl (also written by the Beam runner)."""
    return json.dumps({"row": row, "id": rid, "reason": code, "detail": detail},
                      ensure_ascii=False) + "\n"


class RowLists:
    """DIR/invalid.jsonl and DIR/withheld.jsonl, opened for writing (truncated); `add` counts the
    row in `report` and lists it with its reason. Use as a context manager (closes the files)."""

    def __init__(self, out_dir: str, report: Report):
        self.report = report
        # backslashreplace: a detail quoting unencodable text must not stop the run
        self._files = {k: open(os.path.join(out_dir, f"{k}.jsonl"), "w", encoding="utf-8",
                               errors="backslashreplace") for k in LISTS}

    def add(self, status: str, row: int, rid, code: str, detail: str):
        self.report.add(status, code)
        self._files[status].write(list_line(row, rid, code, detail))

    def close(self):
        for f in self._files.values():
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Report:
    def __init__(self, config: dict | None = None):
        self.config = dict(config or {})
        self.input_rows = 0
        self.buckets = Counter({"kept": 0, "withheld": 0, "invalid": 0})
        self.reasons = {"withheld": Counter(), "invalid": Counter()}
        self.tokens = Counter({"kept_total": 0, "kept_eligible": 0, "kept_supervised": 0,
                               "kept_excluded_eligible": 0, "kept_content": 0,
                               "kept_excluded_content": 0})
        self.ter_steps: dict = {}  # step of origin -> Counter(content, excluded)
        self.sandbox = None  # the layers of this machine's sandbox runs (None: no code run)
        self.verify = Counter({"passed": 0, "failed": 0, "undecided": 0, "unverified": 0,
                               "rerun": 0})
        self.kept_by_review = Counter({"accept": 0, "revise": 0, "drop": 0, "none": 0})
        self.ids = Counter({"derived": 0, "duplicate": 0})
        self.max_token_id = -1
        self.lengths: list = [None, 0]  # [min, max] tokens of a kept row
        self.tokenizer_vocab_size: int | None = None
        self.shards: list[dict] = []

    def add(self, status: str, reason: str | None = None, example=None, review: str | None = None):
        """Count one input row; `example` (a kept CompiledExample) adds its tokens, `review` (its
        reviewer decision) counts it in kept_by_review."""
        if status not in self.buckets:
            raise ValueError(f"unknown bucket {status!r}")
        self.input_rows += 1
        self.buckets[status] += 1
        if status != "kept":
            self.reasons[status][reason or "unspecified"] += 1
            return
        if review is not None:
            self.kept_by_review[review] += 1
        if example is not None:
            n = int(len(example.input_ids))
            if n:
                self.max_token_id = max(self.max_token_id, int(example.input_ids.max()))
            self._length(n, n)
            self.tokens["kept_total"] += n
            self.tokens["kept_eligible"] += int(example.n_eligible)
            self.tokens["kept_supervised"] += int(example.n_supervised)
            self.tokens["kept_excluded_eligible"] += int(example.n_excluded_eligible)
            content, excluded = int(example.n_content), int(example.n_excluded_content)
            self.tokens["kept_content"] += content
            self.tokens["kept_excluded_content"] += excluded
            step = (getattr(example, "provenance", None) or {}).get("step")
            if step is not None:
                self.ter_steps.setdefault(step, Counter()).update(content=content, excluded=excluded)

    def _length(self, lo, hi):
        if lo is not None:
            self.lengths = [lo if self.lengths[0] is None else min(self.lengths[0], lo),
                            max(self.lengths[1], hi)]

    def merge(self, other: "Report") -> "Report":
        """Add the counts of `other` (a report over other rows) into this one (Beam combines the
        reports of its bundles this way); config and shards stay this report's."""
        self.input_rows += other.input_rows
        for mine, theirs in ((self.buckets, other.buckets), (self.tokens, other.tokens),
                             (self.verify, other.verify),
                             (self.kept_by_review, other.kept_by_review),
                             (self.ids, getattr(other, "ids", Counter())),
                             *((self.reasons[k], other.reasons[k]) for k in self.reasons)):
            mine.update(theirs)
        for step, c in getattr(other, "ter_steps", {}).items():
            self.ter_steps.setdefault(step, Counter()).update(c)
        self.max_token_id = max(self.max_token_id, getattr(other, "max_token_id", -1))
        self._length(*getattr(other, "lengths", [None, 0]))
        return self

    def add_verdict(self, passed):
        self.verify[{True: "passed", False: "failed", None: "undecided"}[passed]] += 1

    @property
    def ter(self) -> float:
        c = self.tokens["kept_content"]
        return self.tokens["kept_excluded_content"] / c if c else 0.0

    def ter_by_step(self) -> dict:
        def key(s):  # numeric steps in order, any other label after them
            return (0, s, "") if isinstance(s, (int, float)) else (1, 0, str(s))
        return {str(s): {"content": c["content"], "excluded": c["excluded"],
                         "ter": c["excluded"] / c["content"] if c["content"] else 0.0}
                for s, c in sorted(self.ter_steps.items(), key=lambda kv: key(kv[0]))}

    def accounts(self, rows_read: int | None = None) -> dict:
        """input_rows, buckets, reasons and kept_by_review: the part of report.json every run
        over rows writes (review adds its own fields). `rows_read` (the reader's own count) must
        equal the rows settled here: a row read but never settled is a bug, never a report."""
        if rows_read is not None and rows_read != self.input_rows:
            raise AssertionError(f"{rows_read} rows were read but {self.input_rows} settled")
        return {"input_rows": self.input_rows, "buckets": dict(self.buckets),
                "reasons": {k: dict(sorted(v.items())) for k, v in self.reasons.items()},
                "kept_by_review": dict(self.kept_by_review)}

    def top_reasons(self, k: int = 3) -> list[tuple[int, str, str]]:
        """The `k` most frequent (rows, bucket, reason) among withheld and invalid rows."""
        counts = [(n, status, code) for status in LISTS
                  for code, n in self.reasons[status].items()]
        return sorted(counts, key=lambda c: (-c[0], c[1], c[2]))[:k]

    def to_dict(self, elapsed_s: float = 0.0) -> dict:
        total = sum(self.buckets.values())
        if total != self.input_rows:  # the accounting promise (docs/data.md); never ship a lie
            raise AssertionError(f"buckets sum to {total} but {self.input_rows} rows were read")
        return {
            "input_rows": self.input_rows,
            "buckets": dict(self.buckets),
            "reasons": {k: dict(sorted(v.items())) for k, v in self.reasons.items()},
            "tokens": dict(self.tokens),
            "ter": self.ter,
            "ter_by_step": self.ter_by_step(),
            "kept_by_review": dict(self.kept_by_review),
            "ids": {**self.ids, "duplicates_policy": self.config.get("duplicates", "withhold")},
            "token_ids": {"max": self.max_token_id if self.max_token_id >= 0 else None,
                          "tokenizer": self.config.get("tokenizer"),
                          "tokenizer_vocab_size": self.tokenizer_vocab_size},
            "kept_lengths": {"min": self.lengths[0], "max": self.lengths[1]},
            "verify": {"mode": self.config.get("verify"),
                       "unverified_policy": self.config.get("unverified"),
                       "undecided_policy": self.config.get("undecided"),
                       "sandbox": self.sandbox, **self.verify},
            "shards": self.shards,
            "config": self.config,
            "elapsed_s": round(elapsed_s, 3),
            "rows_per_s": round(self.input_rows / elapsed_s, 2) if elapsed_s > 0 else None,
        }

    def write(self, out_dir: str, elapsed_s: float = 0.0) -> dict:
        d = self.to_dict(elapsed_s)
        write_json(os.path.join(out_dir, "report.json"), d)
        return d

    def summary(self) -> str:
        b, v = self.buckets, self.verify
        top = ", ".join(f"{k} {n}" for k, n in (self.reasons["withheld"] + self.reasons["invalid"]).most_common(4))
        rows = f"rows={self.config.get('rows', 'accepted')}, mask_mode={self.config.get('mask_mode')}: "
        return (f"{rows}{self.input_rows} rows: {b['kept']} kept, {b['withheld']} withheld, "
                f"{b['invalid']} invalid ({top or 'no reasons'}); "
                f"{self.tokens['kept_supervised']} supervised tokens, TER {self.ter:.3f}; "
                f"verify={self.config.get('verify')}: {v['passed']} passed, {v['failed']} failed, "
                f"{v['undecided']} undecided, {v['unverified']} unverified, "
                f"{v['rerun']} verdicts computed now")


# -- publishing a run's folder ---------------------------------------------------------------
# A run writes everything into OUTPUT.partial (beside OUTPUT, same filesystem) and `publish` puts
# it in place with one atomic step: renameat2(RENAME_EXCHANGE) swaps the two folders, so a reader,
# and a kill at any moment, sees either the previous output whole or the new one complete. Files
# of OUTPUT that are not curate's (anything not in OUTPUT_NAMES or a shard) are hard-linked into
# the new folder before the swap, so they are in OUTPUT at every moment. Where the kernel or the
# filesystem cannot exchange, OUTPUT goes to OUTPUT.previous and the new folder takes its place
# (two renames; a kill between them is undone by the next run's `open_stage`). Where OUTPUT's
# parent cannot hold a sibling (not writable, or OUTPUT is a mount point), the stage is
# OUTPUT/.partial and files are moved one by one, report.json removed first and written last:
# a kill then can leave a folder without report.json, which `rossjax train` refuses.
# One run at a time (issue 36): a run holds OUTPUT/run.lock (runlock.py) from its last check
# until it has published, so a second run is refused before it can delete the first's stage;
# publish carries run.lock into the new folder as a hard link (the same locked file).

OUTPUT_NAMES = ("report.json", "invalid.jsonl", "withheld.jsonl", "data.parquet")
STAGE_SUFFIX, PREVIOUS_SUFFIX, INNER_STAGE = ".partial", ".previous", ".partial"
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def _step(point: str) -> None:
    """A named point of the publish sequence (tests kill the process here, one point per run)."""


def is_output(name: str) -> bool:
    """A file name curate writes into OUTPUT (and so replaces); every other entry is carried."""
    return (name in OUTPUT_NAMES or fnmatch.fnmatchcase(name, SHARD_GLOB) or name == INNER_STAGE
            or name.endswith(".tmp") and is_output(name[:-4]))


def stage_path(out_dir: str) -> str:
    return os.path.realpath(out_dir) + STAGE_SUFFIX


def check_inputs_outside(files: list[str], out_dir: str) -> None:
    """Refuse an input that publishing would replace or delete: one of curate's outputs in
    OUTPUT (e.g. a previous run's invalid.jsonl), or a file under the stage folders. Other
    files inside OUTPUT are read and carried into the new output untouched."""
    out = os.path.realpath(out_dir)
    doomed = (stage_path(out_dir), out + PREVIOUS_SUFFIX, os.path.join(out, INNER_STAGE))
    for f in files:
        if "://" in f:
            continue
        real = os.path.realpath(f)
        if os.path.dirname(real) == out and is_output(os.path.basename(real)):
            raise ConfigError(f"config.input names {f}, which is {os.path.basename(real)} of "
                              f"config.output {out_dir}: this run replaces that file, so the input "
                              f"would be lost; copy it out of {out_dir} first, or write to "
                              f"another config.output")
        if any(real == d or real.startswith(d + os.sep) for d in doomed):
            raise ConfigError(f"config.input names {f}, inside a folder curate deletes when it "
                              f"writes {out_dir} ({next(d for d in doomed if real.startswith(d))}); "
                              f"move it elsewhere first")


def _carry(src_dir: str, dst_dir: str) -> None:
    """Move entries of `src_dir` that are not curate's and that `dst_dir` lacks into `dst_dir`."""
    for n in os.listdir(src_dir):
        if not is_output(n) and not os.path.lexists(os.path.join(dst_dir, n)):
            os.rename(os.path.join(src_dir, n), os.path.join(dst_dir, n))


@contextlib.contextmanager
def staged(out_dir: str):
    """A fresh stage for a run into `out_dir` (open_stage), published when the block ends and
    removed when it raises; the run's lock (pipeline.check_config took it) released either way."""
    try:
        stage = open_stage(out_dir)  # also undoes what a killed run left
        try:
            yield stage
        except BaseException:  # a stopped run (a kill leaves the stage; the next run removes it)
            shutil.rmtree(stage, ignore_errors=True)
            raise
        publish(stage, out_dir)
    finally:
        runlock.release(out_dir)


def open_stage(out_dir: str) -> str:
    """A fresh, empty stage folder for a run into `out_dir`, after undoing what a killed run
    left: OUTPUT.previous put back when OUTPUT is missing (else deleted), a stale stage deleted
    (entries of OUTPUT's own it still holds carried back first)."""
    out = os.path.realpath(out_dir)
    prev, stage = out + PREVIOUS_SUFFIX, stage_path(out_dir)
    for p in (prev, stage, os.path.join(out, INNER_STAGE)):  # clearing one would move or
        runlock.refuse_link(p, "its stage")  # delete the files it points to
    if os.path.isdir(prev):
        if not os.path.lexists(out):
            os.rename(prev, out)
        else:
            _carry(prev, out)
            shutil.rmtree(prev)
    for old in (stage, os.path.join(out, INNER_STAGE)):
        if os.path.isdir(old):
            if os.path.isdir(out) and old == stage:
                _carry(old, out)
            shutil.rmtree(old)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    same_fs = not os.path.isdir(out) or os.stat(out).st_dev == os.stat(parent).st_dev
    if same_fs:
        try:
            os.mkdir(stage)
            return stage
        except OSError:  # the parent is not writable: stage inside OUTPUT
            pass
    os.makedirs(os.path.join(out, INNER_STAGE))
    return os.path.join(out, INNER_STAGE)


def _exchange(a: str, b: str) -> None:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); OSError where unsupported."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), a)


def _link(src: str, dst: str) -> None:
    """`dst` as another name of `src` (a folder: its tree, files linked); a copy where the
    filesystem has no hard links."""
    if os.path.isdir(src) and not os.path.islink(src):
        shutil.copytree(src, dst, symlinks=True, copy_function=_link)
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISREG(os.lstat(src).st_mode):
            shutil.copy2(src, dst)
        else:
            raise


def _publish_in_place(stage: str, out: str) -> None:
    """The fallback without a sibling stage: old outputs out (report.json first), new ones in
    (report.json last)."""
    old = [n for n in os.listdir(out) if is_output(n) and n != INNER_STAGE]
    for n in sorted(old, key=lambda n: n != "report.json"):
        os.remove(os.path.join(out, n))
        _step("cleared")
    for n in sorted(os.listdir(stage), key=lambda n: n == "report.json"):
        os.replace(os.path.join(stage, n), os.path.join(out, n))
        _step("moved")
    os.rmdir(stage)


def publish(stage: str, out_dir: str) -> None:
    """Put the finished run in `stage` in place as `out_dir` (see above); `stage` is
    `open_stage`'s folder, or OUTPUT/.partial (the Beam runner's)."""
    out = os.path.realpath(out_dir)
    stage = os.path.realpath(stage)
    _step("staged")
    if os.path.dirname(stage) == out:  # an inner stage: beside OUTPUT if the parent allows it
        shutil.rmtree(out + STAGE_SUFFIX, ignore_errors=True)  # a killed run's stale stage
        try:
            os.rename(stage, out + STAGE_SUFFIX)
            stage = out + STAGE_SUFFIX
        except OSError:
            _publish_in_place(stage, out)
            return
    if not os.path.lexists(out):
        os.rename(stage, out)
        _step("swapped")
        return
    for n in os.listdir(out):
        if not is_output(n):
            _link(os.path.join(out, n), os.path.join(stage, n))
    _step("linked")
    try:
        _exchange(stage, out)
        old = stage
    except OSError as e:
        if e.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP,
                           errno.EPERM):
            raise
        old = out + PREVIOUS_SUFFIX
        os.rename(out, old)
        _step("aside")
        os.rename(stage, out)
    _step("swapped")
    _carry(old, out)  # entries written into OUTPUT while this run was linking
    _step("carried")
    shutil.rmtree(old)
