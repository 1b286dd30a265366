"""Artifact-anchored initialization (RetroGen §1): from the expert artifact y* (and its side
context, when it has one), its cues (rules first, the model for the rest), the instance rubric
R = {(criterion, aspect)} in the paper's categories, then the task x̂ conditioned on R under the
leak rules (App. C's order), and the evidence set Ê retrieved from the corpus by the cues.
"""

from __future__ import annotations

from dataclasses import dataclass

from rossjax.reconstruct import cues as cue_rules, prompts
from rossjax.reconstruct.asking import Asker, Settled, bad, want_items, want_text


@dataclass
class Anchor:
    cues: list  # [{"text", "kind", "source": rule|model}]
    cues_dropped: list  # model cues not found verbatim in the artifact
    task: str
    rubric: list  # [{"criterion", "aspect"}]
    evidence: list  # [{"id", "title", "text", "cues": [cue texts that retrieved it], "score"}]
    leak_retries: int


def model_cues(asker: Asker, art: dict, found: list[dict], max_cues: int):
    """The model's cues beyond the rules': each must occur verbatim in the artifact (else it is
    dropped and listed: a cue the artifact does not hold retrieves nothing of it)."""
    room = max(0, max_cues - len(found))
    if room == 0:
        return [], []

    def check(obj):
        items = want_items(obj, "cues", "cues", lo=0, hi=max(room, 1) * 2)
        for j, c in enumerate(items):
            want_text(c, "text", f"cues.cues[{j}]", max_chars=200)
            kind = c.get("kind", "other")
            if not isinstance(kind, str):
                raise bad(f"cues.cues[{j}].kind", f"must be a string, got {kind!r:.40}")
        return items

    items = asker.ask("cues", prompts.cues(art, found, room), check)
    seen = {c["text"].lower() for c in found}
    kept, dropped = [], []
    for c in items:
        text = c["text"].strip()
        kind = c.get("kind", "other").strip().lower()
        kind = kind if kind in cue_rules.KINDS else "other"
        if text.lower() in seen:
            continue
        if text not in art["text"]:
            dropped.append(text)
            continue
        seen.add(text.lower())
        kept.append({"text": text, "kind": kind, "source": "model"})
    return kept[:room], dropped


def induce_rubric(asker: Asker, art: dict, rules: dict) -> list[dict]:
    """The instance rubric first (App. C order), each criterion in one of the paper's
    categories (prompts.RUBRIC_CATEGORIES)."""
    def check(obj):
        rubric = want_items(obj, "rubric", "rubric", lo=rules["rubric_min"], hi=rules["rubric_max"])
        out = []
        for j, r in enumerate(rubric):
            crit = want_text(r, "criterion", f"rubric.rubric[{j}]", max_chars=500)
            aspect = want_text(r, "aspect", f"rubric.rubric[{j}]", max_chars=40).lower()
            if aspect not in prompts.RUBRIC_CATEGORIES:
                raise bad(f"rubric.rubric[{j}].aspect", f"must be one of "
                          f"{', '.join(prompts.RUBRIC_CATEGORIES)}, got {aspect!r:.40}")
            out.append({"criterion": crit, "aspect": aspect})
        return out

    return asker.ask("rubric", prompts.rubric(art, rules), check)


def induce(asker: Asker, art: dict, cue_list: list[dict], rules: dict, rubric: list[dict]):
    """(task, leak retries): x̂ conditioned on the rubric; it must pass the leak rules
    (cues.leak); a leaking answer is asked again with the broken rule quoted, then the artifact
    is withheld task_leak."""
    leaks = []

    def check(obj):
        task = want_text(obj, "task", "task")
        why = cue_rules.leak(task, art["text"], cue_list, ngram=rules["ngram"],
                             max_chars=rules["max_chars"], max_ratio=rules["max_ratio"])
        if why:
            leaks.append(why)
            raise bad("task.task", f"leaks the artifact: {why}")
        return task

    try:
        task = asker.ask("task", prompts.task(art, cue_list, rules, rubric), check)
    except Settled as e:
        if leaks and e.code == "model_malformed" and "leaks the artifact" in e.detail:
            raise Settled("withheld", "task_leak", f"{asker.where}: the induced task {leaks[-1]}; "
                          f"still leaking after {len(leaks)} answer(s)", "task") from None
        raise
    return task, len(leaks)


def retrieve(index, art: dict, cue_list: list[dict], depth: int, max_evidence: int,
             min_ratio: float = 0.3, per_cue_words: int = 40) -> list[dict]:
    """Ê: for each cue, BM25 over the corpus with the cue and the artifact's sentence around it
    as the query, and once with its title and opening sentence; the top `depth` documents of
    each query. A document is kept when its best score is at least `min_ratio` of the best
    score of any (a low-score hit of one query is a stray shared word, not evidence); ranked by
    its summed score over the queries; at most `max_evidence`."""
    hits: dict[str, dict] = {}
    opening = " ".join(art["text"].split(". ", 1)[0].split()[:per_cue_words])
    queries = [(c["text"], f"{c['text']} {cue_rules.sentence_of(art['text'], c['text'], per_cue_words)}")
               for c in cue_list] + [("(opening sentence)", f"{art.get('title', '')} {opening}")]
    for name, query in queries:  # the opening sentence too: an artifact may hold no cue
        for doc_id, score in index.search(query, depth):
            h = hits.setdefault(doc_id, {"id": doc_id, "cues": [], "best": 0.0, "total": 0.0,
                                         "first": len(hits)})
            if name not in h["cues"]:
                h["cues"].append(name)
            h["best"], h["total"] = max(h["best"], float(score)), h["total"] + float(score)
    top = max((h["best"] for h in hits.values()), default=0.0)
    ranked = sorted((h for h in hits.values() if h["best"] >= min_ratio * top),
                    key=lambda h: (-h["total"], h["first"]))
    out = []
    for h in ranked[:max_evidence]:
        doc = index.by_id[h["id"]]
        out.append({"id": h["id"], "title": doc.get("title") or doc["text"][:80],
                    "text": doc["text"], "cues": h["cues"], "score": round(h["total"], 4)})
    return out


def initialize(asker: Asker, art: dict, index, cfg) -> Anchor:
    found = cue_rules.rule_cues(art["text"])[:cfg.max_cues]
    more, dropped = model_cues(asker, art, found, cfg.max_cues)
    cue_list = found + more
    rules = {"ngram": cfg.leak.ngram, "max_chars": cfg.leak.max_task_chars,
             "max_ratio": cfg.leak.max_task_ratio, "leak_kinds": cue_rules.LEAK_KINDS,
             "rubric_min": cfg.rubric_min, "rubric_max": cfg.rubric_max}
    rubric = induce_rubric(asker, art, rules)
    task, leak_retries = induce(asker, art, cue_list, rules, rubric)
    evidence = retrieve(index, art, cue_list, cfg.retrieval_depth, cfg.max_evidence,
                        cfg.retrieval_min_ratio)
    if not evidence:
        raise Settled("withheld", "no_evidence",
                      f"{asker.where}: no corpus document matches any of the artifact's "
                      f"{len(cue_list)} cue(s) ({', '.join(c['text'] for c in cue_list[:5]) or 'none'})",
                      "retrieval")
    return Anchor(cue_list, dropped, task, rubric, evidence, leak_retries)
