"""The world of `rossjax repro retrogen`: a corpus, expert artifacts that rest on it, and held-out
tasks of the same kind on materials no training artifact names.

Each invented material has two documents: its measurement note (the evidence: its melting
point) and a trade note (a distractor that names it with other figures). An artifact is a
short expert brief on one material that cites its measurement note. The held-out tasks are the
stand-in's induced task (reconstruct/standin.py induced_task, the rule that writes x̂ for the
training artifacts) of briefs on held-out materials, so a model meets tasks of the form it was
trained on, and must find a figure it has never seen: the evidence has to be searched for and
opened. Both documents of a held-out material stay in the corpus.
"""

from __future__ import annotations

import numpy as np

SYLLABLES = ("var", "kel", "bor", "dri", "mon", "tas", "lum", "qua", "zen", "pho", "rix", "sol",
             "nar", "tel", "vio", "gor")
SITES = ("Oslo", "Lyon", "Porto", "Graz", "Turku", "Brno")
KIND, DOMAIN = "brief", "materials"  # a domain without a paper threshold: the run calibrates


def names(n: int, rng, parts=(2,)) -> list[str]:
    """n distinct names of a number of syllables drawn from `parts` (two syllables: 256 names)."""
    out: list[str] = []
    while len(out) < n:
        w = "".join(rng.choice(SYLLABLES, int(rng.choice(parts)))).capitalize() + "ite"
        if w not in out:
            out.append(w)
    return out


def brief(k: int, name: str, melt: int) -> dict:
    doc = f"{name.lower()}-note"
    return {"id": f"brief-{k}", "domain": DOMAIN, "kind": KIND, "title": f"{name} melting point",
            "text": f"{name} melts at {melt} kelvin [{doc}], a figure that sets how {name} can be "
                    f"cast. Later work on {name} relies on this measured value, and the archived "
                    f"samples of {name} let anyone check it again. Among the minerals of the "
                    f"northern deposits, {name} is studied for its behaviour under heat, and "
                    f"this brief gives the one number a caster needs first."}


def world(n_artifacts: int, n_test: int, seed: int = 0) -> dict:
    """Documents, training artifacts and held-out tasks (seeded)."""
    from rossjax.reconstruct.standin import induced_task

    rng = np.random.default_rng(seed)
    mats = names(n_artifacts + n_test, rng)
    docs, arts, tests = [], [], []
    for k, name in enumerate(mats):
        melt, price = int(rng.integers(300, 1900)), int(rng.integers(20, 90))
        site, year = str(rng.choice(SITES)), int(rng.integers(1890, 2020))
        docs.append({"id": f"{name.lower()}-note", "title": f"{name} measurements",
                     "text": f"{name} melts at {melt} kelvin."})
        docs.append({"id": f"{name.lower()}-trade", "title": f"{name} trade",
                     "text": f"{name} sold for {price} crowns in {year}, at {site}."})
        art = brief(k, name, melt)
        if k < n_artifacts:
            arts.append(art)
        else:
            tests.append({"id": f"q-{name}", "material": name, "doc": f"{name.lower()}-note",
                          "value": str(melt), "prompt": induced_task(art["text"], KIND)})
    order = rng.permutation(len(docs))  # no document's position says which material it is
    return {"docs": [docs[i] for i in order], "artifacts": arts, "tests": tests,
            "materials": mats}
