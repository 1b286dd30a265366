"""The base model of `rossjax repro retrogen`: a STAND-IN for the paper's instruct model, one that
already writes tool calls before any arm's SFT.

RetroGen fine-tunes an instruct model that can call tools; a random tiny model cannot, and no arm
can teach the call format, the copying of a name into a query and of an id into `open`, and the
quoting of an opened document in the few steps a CPU run gives it (the e99bf7a run: no arm wrote
one valid call after 80 steps). So every arm starts from this base: the same random init trained
on programmatic tool-use episodes of another kind, in another corpus, on materials the
experiment's world never names: "what did X sell for" (search "X trade", open X's trade note,
quote it) and "where was X found" (search "X discovery", open X's discovery note, quote it). No
episode asks for a melting point, opens a measurement note or uses the briefs' task form, so what
each arm's data teaches about evidence-seeking is its own. Episodes run through the real tools
(reconstruct.trace.Tools over this corpus) and `rossjax retrogen`'s serializer, so their calls
and observations are the arms' format.
"""

from __future__ import annotations

import os

import numpy as np

from rossjax.repro import stages, warmup
from rossjax.repro.retrogen_world import SITES, names

# full: copying an id out of an observation came late (its own held-out episodes: the record
# opened 0.03 of the time after 480 steps, 0.63 after 659 of a longer run; the figure quoted
# back lagged), so 1,200 steps, ~1 hour on 2 quiet CPU cores
SIZES = {"full": dict(n_materials=600, n_test=32, steps=1200),
         "quick": dict(n_materials=40, n_test=4, steps=3)}
# The other repros' tiny shape with 4 heads of 32 in place of 8 of 16: the same parameters at
# ~1.5x the tokens a second on 2 CPU cores (2,000 against 1,300 measured side by side on rows of
# ~720 tokens), which these long rows need. From scratch at their lr.
SHAPE = dict(warmup.SHAPE, n_heads=4, n_kv_heads=4, head_dim=32)
TRAIN = dict(batch=16, seq_len=800, lr=3e-3)
KINDS = ("trade", "discovery")


def _docs(name: str, rng) -> dict:
    price, year = int(rng.integers(20, 90)), int(rng.integers(1890, 2020))
    site, found = str(rng.choice(SITES)), int(rng.integers(1700, 1890))
    fsite = str(rng.choice(SITES))
    return {"trade": {"id": f"{name.lower()}-trade", "title": f"{name} trade",
                      "text": f"{name} sold for {price} crowns in {year}, at {site}."},
            "discovery": {"id": f"{name.lower()}-discovery", "title": f"{name} discovery",
                          "text": f"{name} was found near {fsite} in {found}."}}


def _task(name: str, kind: str) -> str:
    return (f"What did {name.lower()} sell for? Look it up in the corpus and cite it."
            if kind == "trade" else
            f"Where was {name.lower()} found? Look it up in the corpus and cite it.")


def corpus(n_materials: int, n_test: int, avoid: set, seed: int = 1) -> dict:
    """Documents, episode specs (material, kind) for training and held-out base tests."""
    rng = np.random.default_rng(seed)
    # two and three syllables: the world's names are two, and 256 two-syllable names run out
    mats = [m for m in names(n_materials + n_test + len(avoid), rng, (2, 3)) if m not in avoid]
    mats = mats[:n_materials + n_test]
    docs, specs = [], []
    for k, name in enumerate(mats):
        d = _docs(name, rng)
        docs += [d["trade"], d["discovery"]]
        specs.append({"material": name, "kind": str(rng.choice(KINDS)), "test": k >= n_materials,
                      "doc": d})
    return {"docs": docs, "specs": specs}


def held_out(c: dict) -> list:
    """The held-out base episodes as agent_eval's tests: the figure asked (the price, the site)."""
    return [{"id": f"base-{s['material']}", "doc": s["doc"][s["kind"]]["id"],
             "value": s["doc"][s["kind"]]["text"].split()[3 if s["kind"] == "trade" else 4],
             "prompt": _task(s["material"], s["kind"])} for s in c["specs"] if s["test"]]


def episode(spec: dict, tools) -> dict:
    """A reconstruct-format record (task, trace, draft) of one base episode, its calls run."""
    name, kind = spec["material"], spec["kind"]
    doc = spec["doc"][kind]
    trace = []
    for i, (tool, args, note) in enumerate((
            ("search", {"query": f"{name} {kind}"}, "Look for the record."),
            ("open", {"id": doc["id"]}, "Read it."))):
        cid = f"c{i + 1}"
        trace += [{"type": "note", "content": note},
                  {"type": "call", "id": cid, "name": tool, "arguments": args},
                  {"type": "observation", "call_id": cid, "content": tools.run(tool, args, cid)}]
    trace.append({"type": "note", "content": "Answer from it."})
    return {"id": f"base-{name}", "task_id": f"base-{name}", "domain": "base",
            "task": _task(name, kind), "trace": trace, "draft": f"{doc['text']} [{doc['id']}]"}


def rows(records: list) -> list:
    """Serialized like `rossjax retrogen`'s JSON-form rows (no evidence list after the task)."""
    from rossjax.curate.retrogen import to_rollouts

    kept = [{"record": r, "score": 1.0, "threshold": 0.0} for r in records]
    return to_rollouts(kept, react_prob=0.0, evidence_in_prompt=False)


def build(root: str, quick: bool, tok_path: str, avoid: set, log=print) -> dict:
    """Build (or reuse) the base; returns {"hf", "rows", "steps", "tests"} where tests are the
    held-out base episodes in the experiment's test format (agent_eval's)."""
    from rossjax.agents.corpus import CorpusEnv
    from rossjax.reconstruct.trace import Tools

    size = SIZES["quick" if quick else "full"]
    wd = os.path.join(root, f"base-{'quick' if quick else 'full'}")
    st = stages.Stages(wd, log, key=dict(size=size, shape=SHAPE, train=TRAIN))
    c = corpus(size["n_materials"], size["n_test"], avoid)
    path = stages.write_jsonl(os.path.join(wd, "corpus.jsonl"), c["docs"])
    tests = held_out(c)

    def episodes():
        tools = Tools(CorpusEnv(path=path, k=3))
        return len(stages.write_jsonl_rows(os.path.join(wd, "episodes.jsonl"), rows(
            [episode(s, tools) for s in c["specs"] if not s["test"]])))

    n = st.run("episodes", episodes)
    cur = os.path.join(wd, "curated")
    rep = st.run("curate", lambda: stages.curated_summary(stages.curate(
        os.path.join(wd, "episodes.jsonl"), cur, tok_path, rows="verifier_positive",
        mask_mode="eligible")))
    init = stages.init_model(os.path.join(wd, "init"), 0, **SHAPE)
    run = os.path.join(wd, "run")
    st.run("train", lambda: stages.train(
        cur, run, "positive_sft", seed=0, steps=size["steps"], model={},
        seq_len=TRAIN["seq_len"], batch=TRAIN["batch"], lr=TRAIN["lr"],
        vocab_size=SHAPE["vocab_size"], rows=rep["kept"], init=init))
    return {"hf": os.path.join(run, "hf"), "rows": n, "steps": size["steps"], "tests": tests,
            "corpus": path}
