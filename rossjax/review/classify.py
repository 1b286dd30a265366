"""What the masks leave out: `rossjax review --config.classify=True` samples excluded spans of
annotated rollouts and has the reviewer LLM label each with one of seven categories.

Excluded span: a maximal run of response-content characters (assistant content, reasoning and
tool calls; end-of-turn markers are not content) that the row's annotation leaves unsupervised:
outside every keep span, or inside an exclusion (the selectors of curate/selectors.py, resolved
on the same rendering as curate's). Whitespace-only runs are not spans.

Sampling protocol (seeded, stated in report.json): per domain (`task.domain`), the rows with at
least one excluded span in a PCG64(seed) permutation; one span per row, drawn uniformly from
that row's spans, in permutation order, until `classify_per_domain` spans; if the domain's rows
run out first, a second round draws a second span from the rows that have one, and so on. So
spans are uniform over rows first, and a long row with many spans cannot fill a domain.

Each sampled span is one request (context: the task and verdict, `classify_context_chars` of
rollout text before and after, the span itself); the answer must be one JSON object with a
`category` from CATEGORIES and a one-sentence `reason`, else it is asked again with the failing
check quoted (steps.Row.ask: bounded, cached, transcripts). A span whose answers all fail is
counted as unlabelled with its code, never dropped. Outputs in WORKDIR/classify/: spans.jsonl
(every sampled span, its offsets in the rendered text, label and reason), report.json (the
protocol, per-domain counts and shares, every row's fate, requests and tokens) and
categories.png (the distribution per domain).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rossjax.errors import ConfigError, InputError
from rossjax.review import render
from rossjax.review.answers import malformed, want_str
from rossjax.review.steps import Row, RowWithheld

PROMPT_VERSION = "ross-classify-v1"
# rossjax's names for the seven categories of excluded content (docs/review.md)
CATEGORIES = {
    "arithmetic_error": "a computation that is wrong (a wrong sum, product, simplification, unit "
                        "or numeric value)",
    "logical_error": "an invalid inference or reasoning step (a non sequitur, a wrong case "
                     "analysis, a misapplied rule) whose computations may be right",
    "unsupported_claim": "a statement asserted without the derivation or evidence the solution "
                         "needs, which may be true but is not shown",
    "abandoned_attempt": "a failed or abandoned attempt: a line of work the rollout later drops, "
                         "revises or contradicts",
    "bad_tool_use": "a wrong tool call or bad command: wrong tool, wrong arguments, a command "
                    "that fails or whose result is ignored",
    "hallucinated_fact": "an observation, tool result, quotation or fact that the context does "
                         "not contain or contradicts",
    "irrelevant_content": "formatting, filler, boilerplate or content unrelated to solving the "
                          "task, with no error in it",
}
SCHEMA = {"type": "object", "properties": {"category": {"type": "string", "enum": list(CATEGORIES)},
                                           "reason": {"type": "string"}},
          "required": ["category", "reason"]}
OUT_DIR = "classify"

_SYSTEM = ("You classify content that a reviewer excluded from the training targets of a "
           "verified rollout. Read the excluded span in its context and choose the one category "
           "that best says why it was left out:\n"
           + "\n".join(f"- {k}: {v}" for k, v in CATEGORIES.items())
           + "\nJudge the span itself; if several fit, choose the first in this list that does.")
_ASK = ("EXCLUDED CONTENT CLASSIFICATION. Answer with one JSON object: "
        '{{"category": one of {names}, "reason": "one sentence on why"}}.')


def excluded_spans(record: dict, rendered) -> list[tuple[int, int]]:
    """Half-open character spans of the rendering that the annotation leaves unsupervised."""
    from rossjax.curate.masks import interval_mask, ordered_keep_intervals
    from rossjax.curate.selectors import exclude_intervals

    ann = record.get("annotation") or {}
    n = len(rendered.text)
    content = interval_mask(n, [(p.start, p.end) for p in rendered.parts
                                if p.eligible and p.kind != "end" and p.end > p.start])
    left = np.zeros(n, bool)
    if ann.get("keep"):
        left |= ~interval_mask(n, ordered_keep_intervals(rendered, ann["keep"]))
    left |= interval_mask(n, exclude_intervals(rendered, ann))
    left &= content
    edges = np.flatnonzero(np.diff(np.r_[0, left.astype(np.int8), 0]))
    return [(int(s), int(e)) for s, e in zip(edges[::2], edges[1::2])
            if rendered.text[s:e].strip()]


def sample_spans(rows: dict, per_domain: int, seed: int) -> list[tuple[str, int, int]]:
    """The protocol of the module doc: rows {row_key: (domain, [spans])} -> [(row_key, span
    index, round)] in draw order."""
    rng = np.random.Generator(np.random.PCG64(seed))
    by_domain: dict[str, list] = {}
    for key, (domain, spans) in rows.items():
        if spans:
            by_domain.setdefault(domain, []).append(key)
    out = []
    for domain in sorted(by_domain):
        keys = [by_domain[domain][i] for i in rng.permutation(len(by_domain[domain]))]
        left = {k: list(rng.permutation(len(rows[k][1]))) for k in keys}
        taken, rnd = 0, 0
        while taken < per_domain and any(left[k] for k in keys):
            for k in keys:
                if taken == per_domain:
                    break
                if left[k]:
                    out.append((k, int(left[k].pop(0)), rnd))
                    taken += 1
            rnd += 1
    return out


def _messages(record: dict, text: str, span: tuple[int, int], ctx: int) -> list[dict]:
    s, e = span
    before, after = text[max(0, s - ctx):s], text[e:e + ctx]
    body = (f"{render.context(record)}\n\nRollout text before the span:\n<<<{before}>>>\n\n"
            f"EXCLUDED SPAN:\n<<<{text[s:e]}>>>\n\nRollout text after the span:\n<<<{after}>>>\n\n"
            + _ASK.format(names=", ".join(CATEGORIES)))
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": body}]


def _check(obj: dict) -> dict:
    cat = want_str(obj, "category", "answer")
    if cat not in CATEGORIES:
        raise malformed("answer.category", f"{cat!r:.60} is not one of {', '.join(CATEGORIES)}")
    return {"category": cat, "reason": want_str(obj, "reason", "answer")}


def _label(client, cfg, record, text, span) -> dict:
    row = Row(client, record, None, None, cfg.max_step_retries, cfg.max_answer_chars,
              cfg.endpoint.response_format)
    try:
        out, _ = row.ask("classify", _messages(record, text, span, cfg.classify_context_chars),
                         _check)
        return {**out, "code": None, "transcript": row.transcript}
    except RowWithheld as e:
        return {"category": None, "reason": e.detail, "code": e.code, "transcript": row.transcript}


def plot(domains: dict, path: str) -> None:
    """Stacked bars: each domain's share of every category among its labelled spans."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(domains)
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(names) + 1.8))
    left = np.zeros(len(names))
    for cat in CATEGORIES:
        share = np.array([domains[d]["shares"].get(cat, 0.0) for d in names])
        ax.barh(names, share, left=left, label=cat)
        left += share
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of labelled excluded spans")
    ax.set_title("what the masks leave out, per domain")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(cfg, workdir: str) -> dict:
    """Sample, label and report (module doc); returns report.json's content."""
    from rossjax.curate.schema import expand_inputs, iter_records
    from rossjax.curate.selectors import SelectorError
    from rossjax.review.run import make_client, public_config
    from rossjax.templates import TemplateError, render_chat
    from rossjax.tokenizers import load_tokenizer

    if cfg.classify_per_domain < 1:
        raise ConfigError(f"config.classify_per_domain is {cfg.classify_per_domain}; it must be >= 1.")
    tok = load_tokenizer(cfg.tokenizer)
    fate, rows, where, invalid = Counter(), {}, {}, []

    def rendered_rows():
        for path in expand_inputs(cfg.input):
            for r in iter_records(path):
                yield path, r

    def render_row(rec):
        return render_chat(rec["messages"], cfg.template, tok, tools=rec.get("tools"))

    for path, r in rendered_rows():  # pass 1: which rows have which spans (offsets only)
        rec = r.record
        if rec is None:
            fate["invalid"] += 1
            if len(invalid) < 5:
                invalid.append(r.reason)
            continue
        ann = rec.get("annotation")
        if not ann or ann.get("status") == "drop" or not (ann.get("keep") or ann.get("exclude")):
            fate["dropped" if ann and ann.get("status") == "drop" else "not_annotated"] += 1
            continue
        try:
            spans = excluded_spans(rec, render_row(rec))
        except (TemplateError, SelectorError) as e:
            fate[f"unresolved:{e.code}"] += 1
            continue
        fate["with_excluded" if spans else "no_excluded_content"] += 1
        key = f"{path}:{r.row}"
        rows[key] = ((rec.get("task") or {}).get("domain") or "unknown", spans)
        where[key] = (path, r.row)
    picks = sample_spans(rows, cfg.classify_per_domain, cfg.classify_seed)
    if not picks:
        raise InputError(f"{cfg.input}: no excluded content to classify (rows: "
                         f"{dict(fate) or 'none'}); give annotated rows, e.g. `rossjax review` "
                         f"output.")
    want = {where[k] for k, _, _ in picks}
    records = {f"{p}:{r.row}": r.record for p, r in rendered_rows() if (p, r.row) in want}
    out_dir = os.path.join(workdir, OUT_DIR)
    os.makedirs(out_dir, exist_ok=True)
    client = make_client(cfg, cfg.cache_dir or os.path.join(workdir, "cache"))

    def one(pick):
        key, j, rnd = pick
        rec = records[key]
        text = render_row(rec).text
        s, e = rows[key][1][j]
        lab = _label(client, cfg, rec, text, (s, e))
        return {"id": rec["id"], "domain": rows[key][0], "row": where[key][1], "span": [s, e],
                "round": rnd, "text": text[s:e], **lab}

    with ThreadPoolExecutor(max(1, cfg.endpoint.concurrency)) as pool:
        labelled = list(pool.map(one, picks))
    with open(os.path.join(out_dir, "spans.jsonl"), "w", encoding="utf-8") as f:
        for x in labelled:
            f.write(json.dumps(x, ensure_ascii=False) + "\n")
    domains = {}
    for d in sorted({dom for dom, _ in rows.values()}):
        mine = [x for x in labelled if x["domain"] == d]
        counts = Counter(x["category"] for x in mine if x["category"])
        n_lab = sum(counts.values())
        domains[d] = {"rows_with_excluded": sum(1 for dom, sp in rows.values() if dom == d and sp),
                      "spans_total": sum(len(sp) for dom, sp in rows.values() if dom == d),
                      "sampled": len(mine), "labelled": n_lab,
                      "counts": {c: counts.get(c, 0) for c in CATEGORIES},
                      "shares": {c: counts.get(c, 0) / n_lab if n_lab else 0.0 for c in CATEGORIES},
                      "unlabelled": dict(Counter(x["code"] for x in mine if x["code"]))}
    report = {"kind": "classify", "prompt_version": PROMPT_VERSION,
              "protocol": {"per_domain": cfg.classify_per_domain, "seed": cfg.classify_seed,
                           "rule": "per domain: rows in a seeded permutation, one uniformly drawn "
                                   "span per row per round, until per_domain spans",
                           "context_chars": cfg.classify_context_chars},
              "categories": CATEGORIES, "rows": {"read": sum(fate.values()), **dict(fate)},
              "invalid_examples": invalid,
              "domains": domains, "requests": client.totals(),
              "config": public_config(cfg), "spans": os.path.join(OUT_DIR, "spans.jsonl")}
    if domains and cfg.get("plot", True):
        plot(domains, os.path.join(out_dir, "categories.png"))
        report["plot"] = os.path.join(OUT_DIR, "categories.png")
    with open(os.path.join(out_dir, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    return report
