"""Rollout records: read JSONL (plain or .gz) and Parquet, validate every row.

A row that cannot be used never stops a run: `iter_records` yields it with a one-sentence reason
("rollouts.jsonl row 7: messages[2].role 'robot' is not one of ...") and moves on, so the
pipeline can put it in the `invalid` bucket and the report still adds up to the input count.
Rows in other tools' formats (TRL, verl, OpenAI messages, a config field mapping) are converted
by formats.normalize first. The record layout, the accepted formats and every check are in
docs/data.md.
"""

from __future__ import annotations

import math
import os
import re
from typing import Iterator, NamedTuple

from rossjax.curate.files import (  # noqa: F401
    ROLLOUT_SUFFIXES,
    SchemaError,
    expand_inputs,
    is_regular,
    iter_json_lines,
    parquet_rows,
)
from rossjax.curate.formats import FormatError, normalize
from rossjax.errors import InputError

ROLES = ("system", "user", "assistant", "tool")
STATUSES = ("accept", "revise", "drop")
# Which rendered part of a message a selector's `line`/`quote` refer to (default: content).
SELECTOR_PARTS = ("content", "reasoning", "tool_calls")


class Row(NamedTuple):
    row: int  # 1-based position in the file (in the input, counting on across several files)
    record: dict | None
    reason: str | None
    id: str | None = None  # the record's id when it could be read, also for an invalid row
    source: str | None = None  # the file it came from
    derived_id: bool = False  # the row had no id: formats.content_id gave it one


def _id_of(obj) -> str | None:
    rid = obj.get("id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, str) and rid else None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return (_is_int(x) or isinstance(x, float)) and not (isinstance(x, float) and math.isnan(x))


def _tname(x) -> str:
    return "null" if x is None else type(x).__name__


def _check_tool_call(tc, where: str) -> str | None:
    if not isinstance(tc, dict):
        return f"{where} must be an object, got {_tname(tc)}"
    fn = tc.get("function", tc)  # OpenAI style {"type","function":{...}} or flat {"name","arguments"}
    if not isinstance(fn, dict):
        return f"{where}.function must be an object, got {_tname(fn)}"
    if not isinstance(fn.get("name"), str) or not fn.get("name"):
        return f"{where}.name must be a non-empty string"
    args = fn.get("arguments", {})
    if not isinstance(args, (dict, str)):
        return f"{where}.arguments must be an object or a JSON string, got {_tname(args)}"
    return None


def _check_message(i: int, m) -> str | None:
    w = f"messages[{i}]"
    if not isinstance(m, dict):
        return f"{w} must be an object, got {_tname(m)}"
    role = m.get("role")
    if role not in ROLES:
        return f"{w}.role {role!r} is not one of {', '.join(ROLES)}"
    content = m.get("content")
    if content is not None and not isinstance(content, str):
        return f"{w}.content must be a string, got {_tname(content)}"
    if content is None and not (role == "assistant" and m.get("tool_calls")):
        return f"{w}.content is missing"
    for key in ("reasoning", "tool_calls"):
        if m.get(key) is not None and role != "assistant":
            return f"{w}.{key} is only allowed on assistant messages, not {role}"
    if m.get("reasoning") is not None and not isinstance(m["reasoning"], str):
        return f"{w}.reasoning must be a string, got {_tname(m['reasoning'])}"
    tcs = m.get("tool_calls")
    if tcs is not None:
        if not isinstance(tcs, list):
            return f"{w}.tool_calls must be a list, got {_tname(tcs)}"
        for j, tc in enumerate(tcs):
            err = _check_tool_call(tc, f"{w}.tool_calls[{j}]")
            if err:
                return err
    for key in ("name", "tool_call_id"):
        if m.get(key) is not None and not isinstance(m[key], str):
            return f"{w}.{key} must be a string, got {_tname(m[key])}"
    return None


def _check_selector(kind: str, j: int, s, n_messages: int) -> str | None:
    w = f"annotation.{kind}[{j}]"
    if not isinstance(s, dict):
        return f"{w} must be an object, got {_tname(s)}"
    msg = s.get("message")
    if not _is_int(msg):
        return f"{w}.message must be an integer, got {_tname(msg)}"
    if not 0 <= msg < n_messages:
        return f"{w}.message {msg} points at a message that does not exist ({n_messages} messages)"
    if kind == "keep":
        for key in ("start", "end"):
            if not isinstance(s.get(key), str) or not s[key]:
                return f"{w}.{key} must be a non-empty string"
        return None
    if kind == "omissions":
        for key in ("after", "note"):
            if s.get(key) is not None and not isinstance(s[key], str):
                return f"{w}.{key} must be a string, got {_tname(s[key])}"
        return None
    line = s.get("line")
    if not _is_int(line) or line < 1:
        return f"{w}.line must be an integer >= 1, got {line!r}"
    if s.get("quote") is not None and (not isinstance(s["quote"], str) or not s["quote"]):
        return f"{w}.quote must be a non-empty string"
    occ = s.get("occurrence", 0)
    if not _is_int(occ) or occ < 0:
        return f"{w}.occurrence must be an integer >= 0, got {occ!r}"
    if s.get("part", "content") not in SELECTOR_PARTS:
        return f"{w}.part {s.get('part')!r} is not one of {', '.join(SELECTOR_PARTS)}"
    return None


def _check_annotation(a, n_messages: int) -> str | None:
    if not isinstance(a, dict):
        return f"annotation must be an object, got {_tname(a)}"
    status = a.get("status", "accept")
    if status not in STATUSES:
        return f"annotation.status {status!r} is not one of {', '.join(STATUSES)}"
    for kind in ("keep", "exclude", "protect", "omissions"):
        sels = a.get(kind)
        if sels is None:
            continue
        if not isinstance(sels, list):
            return f"annotation.{kind} must be a list, got {_tname(sels)}"
        for j, s in enumerate(sels):
            err = _check_selector(kind, j, s, n_messages)
            if err:
                return err
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _bad_text(x, where: str) -> str | None:
    """The first string under `x` that cannot be encoded as UTF-8 (a lone surrogate such as
    JSON "\\ud800"), named by its path; such text can be neither tokenized nor written."""
    if isinstance(x, str):
        m = _SURROGATE.search(x)
        if m:
            return (f"{where or 'record'} holds a lone surrogate (U+{ord(m.group()):04X} at "
                    f"character {m.start()}), which is not valid Unicode text")
        return None
    if isinstance(x, dict):
        for k, v in x.items():
            err = _bad_text(k, f"{where} key") or _bad_text(v, f"{where}.{k}" if where else str(k))
            if err:
                return err
    elif isinstance(x, list):
        for i, v in enumerate(x):
            err = _bad_text(v, f"{where}[{i}]")
            if err:
                return err
    return None


def _check_tools(tools) -> str | None:
    if not isinstance(tools, list):
        return f"tools must be a list of OpenAI tool objects, got {_tname(tools)}"
    for j, t in enumerate(tools):
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            return (f"tools[{j}] must be an OpenAI tool object with a function name "
                    f"(type function, function.name, function.parameters)")
    return None


def validate_record(obj) -> str | None:
    """Return None for a usable rollout record, else a reason naming the offending field."""
    if not isinstance(obj, dict):
        return f"record must be a JSON object, got {_tname(obj)}"
    err = _bad_text({k: v for k, v in obj.items() if k != "token_ids"}, "")  # ints: skip the walk
    if err:
        return err
    if obj.get("id") is None:  # no id and none derived: say what the row lacks, not the id
        msgs = obj.get("messages")
        if msgs == []:
            return "messages is empty (a row needs at least one turn)"
        if msgs is None:
            return (f"no messages column (the row has {', '.join(map(repr, sorted(obj))) or 'none'});"
                    " map the prompt and completion columns with --config.fields.input_key=COLUMN"
                    " --config.fields.label_key=COLUMN")
    if not isinstance(obj.get("id"), str) or not obj["id"]:
        return "id must be a non-empty string"
    task = obj.get("task")
    if task is not None:
        if not isinstance(task, dict):
            return f"task must be an object, got {_tname(task)}"
        for key in ("id", "domain", "prompt"):
            if task.get(key) is not None and not isinstance(task[key], str):
                return f"task.{key} must be a string, got {_tname(task[key])}"
    src = obj.get("source")
    if src is not None:
        if not isinstance(src, dict):
            return f"source must be an object, got {_tname(src)}"
        if src.get("step") is not None and not _is_int(src["step"]):
            return f"source.step must be an integer, got {_tname(src['step'])}"
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return "messages must be a non-empty list"
    if obj.get("tools") is not None:
        err = _check_tools(obj["tools"])
        if err:
            return err
    for i, m in enumerate(msgs):
        err = _check_message(i, m)
        if err:
            return err
    tids = obj.get("token_ids")
    if tids is not None:
        if not isinstance(tids, list) or not tids:
            return "token_ids must be a non-empty list of integers"
        for k, t in enumerate(tids):
            if not _is_int(t) or t < 0:
                return f"token_ids[{k}] must be a non-negative integer, got {t!r}"
    if obj.get("reward") is not None and not _is_num(obj["reward"]):
        return f"reward must be a number, got {_tname(obj['reward'])}"
    ver = obj.get("verifier")
    if ver is not None:
        if not isinstance(ver, dict):
            return f"verifier must be an object, got {_tname(ver)}"
        if ver.get("passed") is not None and not isinstance(ver["passed"], bool):
            return f"verifier.passed must be true, false or null, got {ver['passed']!r}"
        for key in ("name", "evidence"):
            if ver.get(key) is not None and not isinstance(ver[key], str):
                return f"verifier.{key} must be a string, got {_tname(ver[key])}"
    if obj.get("annotation") is not None:
        return _check_annotation(obj["annotation"], len(msgs))
    return None


def verifier_positive(record: dict, *, undecided: str = "withhold",
                      unverified: str = "withhold") -> bool:
    """Whether ROSS may train on this row by its verdict: the one definition that review and
    curate share. True when the stored `verifier.passed` is true; a verdict of null (the verifier
    could not decide) counts only with undecided="keep", a row with no verdict at all only with
    unverified="keep". The reward is never consulted: a reward > 0 without a verdict is not a
    verdict, so a row reviewed on its reward alone would later be withheld by curate."""
    for name, policy in (("undecided", undecided), ("unverified", unverified)):
        if policy not in ("withhold", "keep"):
            raise InputError(f"{name} policy {policy!r} must be 'withhold' or 'keep'")
    ver = record.get("verifier")
    if not isinstance(ver, dict) or "passed" not in ver:
        return unverified == "keep"
    if ver["passed"] is None:
        return undecided == "keep"
    return ver["passed"] is True


def iter_records(path: str, fields: dict | None = None) -> Iterator[Row]:
    """Yield one `Row` per record (JSONL: `row` is the 1-based line number; blank lines skipped).
    Each row goes through formats.normalize (with the field mapping `fields`, config.fields).

    `path` may name several files (see expand_inputs; or be their list): they are read in order and `row` counts on
    (a file's rows follow the last row of the one before, so rows stay unique); `source` names
    the file and every reason names the file and its own row.
    """
    files = list(path) if isinstance(path, (list, tuple)) else expand_inputs(path)
    offset = 0
    for f in files:
        last = 0
        for r in _file_records(f, fields):
            last = r.row
            yield r._replace(row=offset + r.row, source=f)
        offset += last


def _safe_id(obj) -> str | None:
    rid = _id_of(obj)
    return rid if rid is None or not _SURROGATE.search(rid) else rid.encode(
        "utf-8", "backslashreplace").decode("utf-8")


def _checked(name: str, k: int, obj, fields) -> Row:
    try:
        rec, derived = normalize(obj, fields)
    except FormatError as e:
        return Row(k, None, f"{name} row {k}: {e}", _safe_id(obj))
    err = validate_record(rec)
    if err:
        return Row(k, None, f"{name} row {k}: {err}", _safe_id(rec))
    return Row(k, rec, None, derived_id=derived)


def _file_records(path: str, fields=None) -> Iterator[Row]:
    name = os.path.basename(path)
    if path.endswith(".parquet"):
        lines = parquet_rows(path)
    elif path.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")) or (
            os.path.exists(path) and not is_regular(path)):  # a pipe (<(cmd)) is read as JSONL
        lines = iter_json_lines(path)
    else:
        raise SchemaError(f"{path}: rollout files must be .jsonl, .jsonl.gz or .parquet")
    for row in lines:
        yield Row(row.row, None, row.reason) if row.record is None else _checked(
            name, row.row, row.record, fields)


def chunked(it, n: int):
    """Lists of n consecutive items of `it` (the last one shorter): bounded-memory batches of rows."""
    chunk = []
    for x in it:
        chunk.append(x)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
