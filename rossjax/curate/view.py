"""`rossjax inspect DIR --id ID`: draw one compiled example so a person can check its mask by eye
(`rossjax inspect DIR --list`: every id there, kept, withheld or invalid, with its reason).

Supervised tokens, eligible-but-excluded tokens and context are drawn differently in the
terminal, and in an HTML page written to --out (or WORKDIR/ID.html with --workdir; never into
DIR). DIR is a curated output dir
(read with `rossjax.curate.compiled.read_compiled`); a rollout file (.jsonl[.gz] / .parquet) works
too and is compiled on the fly with --tokenizer/--template/--mask_mode.
"""

from __future__ import annotations

import html
import json
import os

import numpy as np

from rossjax.errors import InputError

SUPERVISED, EXCLUDED, CONTEXT = "supervised", "excluded", "context"
_ANSI = {SUPERVISED: "\x1b[1;32m", EXCLUDED: "\x1b[9;31m", CONTEXT: "\x1b[2m"}
_RESET = "\x1b[0m"


def _get(example, key, default=None):
    return example.get(key, default) if isinstance(example, dict) else getattr(example, key, default)


def token_classes(example) -> list[str]:
    loss = np.asarray(_get(example, "loss_mask"), bool)
    elig = np.asarray(_get(example, "eligible_mask"), bool)
    if loss.shape != elig.shape:
        raise InputError(f"example {_get(example, 'id')}: loss_mask and eligible_mask differ in length")
    return [SUPERVISED if lo else EXCLUDED if el else CONTEXT for lo, el in zip(loss, elig)]


def token_texts(example, tokenizer) -> list[str]:
    """Each token's text; bytes of a character split over tokens go with the token that ends it."""
    out, pending = [], b""
    for t in np.asarray(_get(example, "input_ids")).tolist():
        pending += tokenizer.token_bytes(int(t))
        try:
            out.append(pending.decode("utf-8"))
            pending = b""
        except UnicodeDecodeError:
            out.append("")  # an incomplete character: shown with the token that completes it
    if pending:
        out[-1] = pending.decode("utf-8", errors="replace")
    return out


def _summary(example, classes) -> str:
    n = len(classes)
    s, x = classes.count(SUPERVISED), classes.count(EXCLUDED)
    status = _get(example, "status", "kept")
    reason = _get(example, "reason")
    head = f"{_get(example, 'id')}: {status}" + (f" ({reason})" if reason else "")
    ter = x / (s + x) if s + x else 0.0
    return f"{head} | {n} tokens, {s} supervised, {x} excluded eligible, TER {ter:.3f}"


def render_terminal(example, tokenizer, color: bool = True) -> str:
    classes = token_classes(example)
    out = [_summary(example, classes)]
    if not color:
        out.append("legend: [+text+] supervised, [-text-] excluded eligible, plain text context")
    body = []
    run_cls, run = None, []

    def flush():
        if not run:
            return
        txt = "".join(run)
        if color:
            body.append(_ANSI[run_cls] + txt + _RESET)
        else:
            body.append({SUPERVISED: "[+{}+]", EXCLUDED: "[-{}-]", CONTEXT: "{}"}[run_cls].format(txt))

    for cls, txt in zip(classes, token_texts(example, tokenizer)):
        if cls != run_cls:
            flush()
            run_cls, run = cls, []
        run.append(txt)
    flush()
    out.append("".join(body))
    return "\n".join(out)


_CSS = """body{font-family:sans-serif;margin:2em}pre{white-space:pre-wrap;font:13px/1.6 monospace}
.supervised{background:#c8f7c5;border-bottom:2px solid #1a7f37}
.excluded{background:#ffd6d6;text-decoration:line-through;color:#a40e26}
.context{color:#777}.tok{border-right:1px dotted #bbb}.nl{color:#bbb}
.legend span{padding:2px 6px;margin-right:8px}"""


def render_html(example, tokenizer) -> str:
    classes = token_classes(example)
    ids = np.asarray(_get(example, "input_ids")).tolist()
    spans = []
    for k, (cls, txt, tid) in enumerate(zip(classes, token_texts(example, tokenizer), ids)):
        shown = html.escape(txt).replace("\n", '<span class="nl">\u21b5</span>\n')
        spans.append(f'<span class="tok {cls}" title="#{k} id={tid} {cls}">{shown}</span>')
    prov = html.escape(json.dumps(_get(example, "provenance", {}) or {}, default=str))
    title = html.escape(str(_get(example, "id")))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{_CSS}</style></head><body><h2>{title}</h2>"
            f"<p>{html.escape(_summary(example, classes))}</p><p><code>{prov}</code></p>"
            "<p class='legend'><span class='supervised'>supervised</span>"
            "<span class='excluded'>excluded (eligible, not supervised)</span>"
            "<span class='context'>context</span></p>"
            f"<pre>{''.join(spans)}</pre></body></html>\n")


def find_example(path: str, example_id: str, tokenizer, template: str, mask_mode: str):
    if os.path.isdir(path):
        from rossjax.curate.compiled import read_compiled

        for ex in read_compiled(path):
            if ex["id"] == example_id:
                return ex
        raise InputError(f"{path}: no compiled example with id {example_id!r} "
                         "(withheld and invalid rows are listed in withheld.jsonl / invalid.jsonl)")
    from rossjax.curate.masks import compile_rollout
    from rossjax.curate.schema import iter_records

    for row in iter_records(path):
        if row.record is not None and row.record["id"] == example_id:
            return compile_rollout(row.record, tokenizer, template=template, mask_mode=mask_mode)
    raise InputError(f"{path}: no valid record with id {example_id!r}")


def list_examples(path: str) -> list[dict]:
    """Every row `rossjax inspect --list` shows: for a curated dir its kept examples (id,
    tokens, supervised, excluded), then its withheld and invalid rows (id, reason, detail); for
    a rollout file each row (id, turns, verdict) or its invalid reason."""
    out = []
    if os.path.isdir(path):
        from rossjax.curate.compiled import read_compiled

        for ex in read_compiled(path):
            loss, elig = np.asarray(ex["loss_mask"], bool), np.asarray(ex["eligible_mask"], bool)
            out.append({"id": ex["id"], "status": "kept", "tokens": int(loss.size),
                        "supervised": int(loss.sum()), "excluded": int((elig & ~loss).sum())})
        for status in ("withheld", "invalid"):
            name = os.path.join(path, f"{status}.jsonl")
            if os.path.exists(name):
                with open(name, encoding="utf-8") as f:
                    for line in f:
                        if line.strip():
                            r = json.loads(line)
                            out.append({"id": r.get("id"), "status": status, "row": r.get("row"),
                                        "reason": r.get("reason"), "detail": r.get("detail", "")})
        if not out and not os.path.exists(os.path.join(path, "report.json")):
            raise InputError(f"{path}: not a curated dir (no compiled-*.array_record shards, no "
                             f"report.json)")
        return out
    from rossjax.curate.schema import iter_records

    for row in iter_records(path):
        if row.record is None:
            out.append({"id": row.id, "status": "invalid", "row": row.row, "reason": "invalid_record",
                        "detail": row.reason})
            continue
        ver = row.record.get("verifier") or {}
        out.append({"id": row.record["id"], "status": "record", "row": row.row,
                    "turns": len(row.record.get("messages") or []),
                    "verdict": {True: "passed", False: "failed", None: "undecided"}.get(
                        ver.get("passed"), "undecided") if "passed" in ver else "none",
                    "annotation": (row.record.get("annotation") or {}).get("status", "accept")
                    if row.record.get("annotation") is not None else "none"})
    return out


def _clip(text: str, width: int = 160) -> str:
    """A detail for one list line: whole words only, `...` where it was cut."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[:width + 1].rsplit(" ", 1)[0]
    return (cut if len(cut) > width // 2 else text[:width]) + " ..."


def format_list(rows: list[dict]) -> str:
    """The --list table: one line per row, kept examples first, the counts last."""
    lines = []
    for r in rows:
        if r["status"] == "kept":
            lines.append(f"kept      {r['id']}  {r['tokens']} tokens, {r['supervised']} supervised, "
                         f"{r['excluded']} excluded")
        elif r["status"] == "record":
            lines.append(f"row {r['row']:<5} {r['id']}  {r['turns']} turns, verdict {r['verdict']}, "
                         f"annotation {r['annotation']}")
        else:
            lines.append(f"{r['status']:<9} {r['id']}  row {r['row']}: {r['reason']}"
                         + (f" ({_clip(str(r['detail']))})" if r.get("detail") else ""))
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) or "no rows")
    return "\n".join(lines)


def _default_tokenizer(path: str) -> str:
    """The tokenizer a curated dir was compiled with, if its report says so."""
    rep = os.path.join(path, "report.json") if os.path.isdir(path) else ""
    if rep and os.path.exists(rep):
        with open(rep, encoding="utf-8") as f:
            r = json.load(f)
        for d in (r, r.get("config") or {}):
            if isinstance(d.get("tokenizer"), str):
                return d["tokenizer"]
    return "qwen"


def html_name(example_id: str) -> str:
    """ID.html with the characters a file name cannot hold replaced."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in example_id) + ".html"


def write_inspection(path: str, example_id: str, *, tokenizer: str | None = None,
                     template: str = "chatml", mask_mode: str = "annotated",
                     out: str | None = None):
    """Find `example_id` in `path` (a curated dir or a rollout file) and write its HTML view to
    `out` when one is named (never into the data folder by default: a curated dir is one run's
    output). Returns (example, tokenizer, html path or None)."""
    from rossjax.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer or _default_tokenizer(path))
    ex = find_example(path, example_id, tok, template, mask_mode)
    if not out:
        return ex, tok, None
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(render_html(ex, tok))
    return ex, tok, out
