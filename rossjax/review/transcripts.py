"""Per-row review transcripts: WORKDIR/transcripts.jsonl, one line per reviewed row
{row, id, procedure, status, reason, entries}, each entry one request and its answer
{stage, messages, answer, finish_reason, usage, cached, key, check?}. `key` names the cache entry
(WORKDIR/cache/KK/KEY.json) holding the same request and the response fields the reviewer read
(content, finish_reason, usage; `failed` when the answer failed its check).
`rossjax inspect` prints `format_transcript` next to the mask."""

from __future__ import annotations

import json
import os

TRANSCRIPTS = "transcripts.jsonl"
_STAGE_MARKERS = ("PROPOSAL.", "AUDIT.", "REPAIR.", "SEMANTIC ERROR DISCOVERY.",
                  "BOUNDARY LOCALIZATION", "Your answer failed a check")


def read_transcript(workdir: str, rid: str) -> dict | None:
    """The transcript of rollout `rid` in a review WORKDIR (None when it was not asked)."""
    path = os.path.join(workdir, TRANSCRIPTS)
    if not os.path.exists(path):
        return None
    needle = f'"id": {json.dumps(rid, ensure_ascii=False)}'
    with open(path, encoding="utf-8") as f:
        for line in f:
            if needle in line:  # cheap pre-filter; the parse decides
                obj = json.loads(line)
                if obj.get("id") == rid:
                    return obj
    return None


def format_transcript(t: dict, width: int = 600) -> str:
    """Each request's stage instructions (from its stage marker on) and its answer, one block
    per entry, clipped to `width` characters each (the full text stays in the file)."""
    def clip(s: str) -> str:
        s = s or ""
        return s if len(s) <= width else s[:width] + f" ... [{len(s) - width} more characters]"

    head = (f"review transcript of {t['id']} (row {t['row']}, {t['procedure']}): {t['status']}"
            + (f" ({t['reason']})" if t.get("reason") else ""))
    out = [head]
    for k, e in enumerate(t["entries"], start=1):
        ask = e["messages"][-1]["content"]
        tokens = sum(e.get("usage", {}).values())
        out.append(f"-- {k}. {e['stage']}{' (cached)' if e.get('cached') else ''}"
                   f"{f', {tokens} tokens' if tokens else ''}")
        k = max(ask.rfind(m) for m in _STAGE_MARKERS)  # the stage's own instructions
        out.append("   asked: " + clip(ask[k:] if k >= 0 else ask).replace("\n", "\n          "))
        out.append("   answer: " + clip(e["answer"]).replace("\n", "\n           "))
        if e.get("check"):
            out.append(f"   failed check {e['check']['code']}: {clip(e['check']['detail'])}")
    return "\n".join(out)
