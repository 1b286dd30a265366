"""`rossjax reconstruct` (rossjax/reconstruct/) against a scripted OpenAI-compatible server that
answers every stage: the whole path to serialized SFT rows through `rossjax retrogen`,
observations verbatim from the corpus, a trace past the step cap, the leak rule, malformed
answers and artifacts invalid with the artifact and field named, resume without duplicates, the
baselines, and a served tiny model (`:runlocal`'s stand-in: test_reconstruct_standin.py)."""

import json
import os
import re
import subprocess
import sys

import pytest
from review_server import Reviewer

from rossjax.agents.corpus import CorpusEnv
from rossjax.agents.env import ToolCall
from rossjax.configs import reconstruct as rc_config, retrogen as rg_config
from rossjax.curate import compile_rollout, load_tokenizer, retrogen
from rossjax.reconstruct import run as rc_run
from rossjax.reconstruct.cues import leak, rule_cues
from rossjax.reconstruct.trace import window
from rossjax.tokenizers.ascii import write_ascii_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.path.join(ROOT, "data", "retrogen", "artifacts.jsonl")
CORPUS = os.path.join(ROOT, "data", "retrogen", "corpus.jsonl")
DOCS = {d["id"]: d for d in map(json.loads, open(CORPUS))}
ARTS = {a["id"]: a for a in map(json.loads, open(ARTIFACTS))}
HIT = re.compile(r"(?:^|observation: )(\S+) \(\d+\.\d+\): ", re.M)


def stage_of(body):
    return re.search(r"^STAGE: (\S+)", body["messages"][1]["content"], re.M).group(1)


def artifact_of(body):
    return re.search(r"^Artifact id: (\S+)", body["messages"][1]["content"], re.M).group(1)


def user(body):
    return body["messages"][1]["content"]


def good_task(rid):
    return {"task": f"Research the sources behind topic {rid.replace('-', ' ')} and write the "
                    f"document an expert in the field would write."}


RUBRIC = {"rubric": [{"criterion": "Covers the main sources", "aspect": "coverage"},
                     {"criterion": "Relates the sources' findings", "aspect": "synthesis"},
                     {"criterion": "Every claim cites a retrieved document", "aspect": "citation"}]}


def step_answer(body):
    """A policy that reads its history: search, open the top hit, extract, compare the top two
    hits, outline, draft."""
    text = user(body)
    used = int(re.search(r"Tool steps used: (\d+) of|\((\d+) of \d+ tool steps\)", text)
               .group(1) or 0) if "Tool steps used" in text else 99
    hits = HIT.findall(text)
    rid = artifact_of(body)
    if used == 0:
        query = rule_cues(ARTS[rid]["text"])[0]["text"] if rid in ARTS else "revenue"
        return {"note": "Start from the first cited source.", "action": "search",
                "arguments": {"query": query}}
    top = hits[0]
    pattern = DOCS[top]["text"].split()[2]
    if used == 1:
        return {"note": f"Open {top}.", "action": "open", "arguments": {"id": top}}
    if used == 2:
        return {"note": "Pull the key line.", "action": "extract",
                "arguments": {"id": top, "pattern": pattern}}
    if used == 3:
        second = next((h for h in hits[1:] if h != top), top)
        return {"note": "Compare with the second hit.", "action": "compare",
                "arguments": {"ids": [top, second], "aspect": pattern}}
    if "Outline:" not in text:
        return {"note": "Plan the write-up.", "action": "outline",
                "arguments": {"outline": ["context", "findings", "gap"]}}
    return {"note": "", "action": "draft",
            "arguments": {"text": f"Drawing on {top}: {DOCS[top]['text'].splitlines()[0]}"}}


def expert(rid, body, overrides=None):
    """A good answer for every stage; `overrides[stage]` (body -> answer) replaces one."""
    stage = stage_of(body)
    if overrides and stage in overrides:
        got = overrides[stage](body)
        if got is not None:
            return got
    text = user(body)
    if stage == "cues":
        first = ARTS.get(rid, {"text": "x"})["text"].split(". ")[0].split()[:3]
        return json.dumps({"cues": [{"text": " ".join(first), "kind": "term"},
                                    {"text": "a phrase the artifact never says", "kind": "term"}]})
    if stage == "rubric":
        return json.dumps(RUBRIC)
    if stage == "task":
        return json.dumps(good_task(rid))
    if stage == "plan":
        return json.dumps({"plan": [{"action": a, "purpose": f"{a} step"} for a in
                                    ("search", "open", "extract", "compare", "outline", "draft")]})
    if stage == "step":
        return json.dumps(step_answer(body))
    if stage == "verify_rubric":
        n = len(re.findall(r"^\d+\. \(", text, re.M))
        return json.dumps({"verdicts": [{"criterion": k, "verdict": "full" if k % 2 else "partial",
                                         "why": "-"} for k in range(1, n + 1)]})
    if stage == "verify_quality":
        return json.dumps({"score": 4, "why": "clear"})
    if stage == "verify_grounding":
        ev = re.search(r"^\[(\S+)\] ", text.split("EVIDENCE", 1)[1], re.M).group(1)
        return ("```json\n" + json.dumps({"claims": [
            {"source": "draft", "claim": "the finding", "supported": True, "evidence": ev},
            {"source": "draft", "claim": "an outside fact", "supported": True, "evidence": "nowhere"}]})
            + "\n```")
    if stage == "verify_consistency":
        n = len(re.findall(r"^\[\d+\] ", text.split("WORKFLOW", 1)[1], re.M))
        refs = [{"entry": n, "refers_to": 1, "consistent": True, "why": "-"}] if n > 1 else []
        return json.dumps({"references": refs})
    raise AssertionError(stage)


def serve(overrides=None, **kw):
    return Reviewer(default=lambda rid, body: expert(rid, body, overrides), id_of=artifact_of,
                    stage_fn=stage_of, **kw)


def config(url, tmp_path, **over):
    c = rc_config.get_config()
    c.endpoint.base_url, c.endpoint.model = url, "scripted"
    c.endpoint.backoff_s, c.endpoint.max_retries, c.progress = 0.01, 1, False
    c.input, c.corpus = ARTIFACTS, CORPUS
    for k, v in over.items():
        node, *path = k.split(".")
        target = c
        for p in [node, *path][:-1]:
            target = target[p]
        target[[node, *path][-1]] = v
    return c


def lines(path):
    return [json.loads(x) for x in open(path)] if os.path.exists(path) else []


def adds_up(report):
    b = report["buckets"]
    assert b["kept"] + b["withheld"] + b["invalid"] == report["input_rows"]
    assert sum(report["reasons"]["withheld"].values()) == b["withheld"]
    assert sum(report["reasons"]["invalid"].values()) == b["invalid"]


def test_whole_path_to_serialized_sft_rows(tmp_path):
    with serve() as srv:
        rep = rc_run.run(config(srv.url, tmp_path), str(tmp_path / "rc"))
    adds_up(rep)
    assert rep["input_rows"] == len(ARTS) == rep["buckets"]["kept"] == 6
    recs = lines(tmp_path / "rc" / "trajectories.jsonl")
    assert [r["id"] for r in recs] == list(ARTS)
    env = CorpusEnv(path=CORPUS)
    for r in recs:
        assert {d["domain"] for d in recs} == {"science", "finance", "legal"}
        assert retrogen.gate(r) is None, r["id"]
        calls = [s for s in r["trace"] if s["type"] == "call"]
        obs = [s for s in r["trace"] if s["type"] == "observation"]
        assert [c["name"] for c in calls] == ["search", "open", "extract", "compare"]
        for c, o in zip(calls, obs):  # every observation is the environment's own output
            if c["name"] == "compare":
                want = "\n\n".join(f"[{i}]\n" + env.call(ToolCall(
                    "extract", {"id": i, "pattern": c["arguments"]["aspect"]})).content
                    for i in c["arguments"]["ids"])
            else:
                want = env.call(ToolCall(c["name"], c["arguments"])).content
            assert o["content"] == want and o["ok"] is True and o["call_id"] == c["id"]
        opened = next(o for c, o in zip(calls, obs) if c["name"] == "open")
        assert opened["content"] == DOCS[calls[1]["arguments"]["id"]]["text"][:2000]
        # Eq. 4 over the four signals: rubric 2 full + 1 partial, quality 4/5, grounding 1 of 2
        # (a claim "supported" by an id outside Ê is not), consistency 1 of 1
        assert r["scores"] == {"rubric": pytest.approx(2.5 / 3), "quality": 0.75,
                               "grounding": 0.5, "consistency": 1.0}
        assert r["score"] == pytest.approx(0.25 * (2.5 / 3 + 0.75 + 0.5 + 1.0), abs=1e-6)
        assert r["cues_dropped"] == ["a phrase the artifact never says"]
        assert r["model"] == "scripted" and r["prompt_version"] == "reconstruct-v3"
        assert any(c["source"] == "model" for c in r["cues"])
        assert set(r["diversity"]) == {"query_style", "plan_realization", "outline",
                                       "reflect_every", "format", "persona", "tool_schema",
                                       "thought"}
        assert r["evidence"] and all(e.split(": ", 1)[0] in DOCS for e in r["evidence"])
    st = rep["stages"]
    assert st["task"]["requests"] == st["plan"]["requests"] == st["verify_rubric"]["requests"] == 6
    assert st["step"]["requests"] == 6 * 6 and rep["requests"]["requests"] == len(srv.requests)
    # the diversity draws are seeded per artifact and reach the prompts
    first = {artifact_of(b): b for b in reversed(srv.bodies(stage="step"))}
    from rossjax.reconstruct import prompts
    for r in recs:  # A.2's axes too: persona (system prompt), tool schema, thought template
        d, b = r["diversity"], first[r["id"]]
        assert d["query_style"] in user(b) and d["thought"] in user(b)
        assert b["messages"][0]["content"].startswith(prompts.PERSONAS[d["persona"]])
        assert ("; arguments {" in user(b)) == (d["tool_schema"] == "described")
    assert len({tuple(sorted(r["diversity"].items())) for r in recs}) > 1
    # `rossjax retrogen` gates, thresholds and serializes them into SFT rollouts
    g = rg_config.get_config()
    g.input, g.output = str(tmp_path / "rc" / "trajectories.jsonl"), str(tmp_path / "rg")
    res = retrogen.run(g)
    assert len(res.kept) == 6 and not res.discarded
    rows = lines(tmp_path / "rg" / "retrogen.jsonl")
    tok = load_tokenizer(write_ascii_tokenizer(str(tmp_path / "tok")))
    assert sorted(x["id"] for x in rows) == sorted(ARTS)
    by_id = {r["id"]: r for r in recs}
    for row in rows:
        r = by_id[row["id"]]
        text = "\n".join(m["content"] for m in row["messages"])
        for o in (s for s in r["trace"] if s["type"] == "observation"):
            assert o["content"].strip() in text  # verbatim in the SFT sample
        assert row["loss_scope"] == "sequence" and row["messages"][-1]["content"].endswith(r["draft"])
        ex = compile_rollout(row, tok, mask_mode="eligible")
        assert ex.status == "kept", ex.reason
        assert ex.n_supervised == len(ex.input_ids) > 0  # Eq. 7: the whole sequence


def test_a_trace_past_the_step_cap_is_withheld(tmp_path):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(ARTS["fin-10k-1"]) + "\n")
    always = {"step": lambda b: json.dumps({"note": "Search again " + "x" * 200,
                                            "action": "search",
                                            "arguments": {"query": "Norrland revenue"}})}
    with serve(always) as srv:
        rep = rc_run.run(config(srv.url, tmp_path, input=str(one)), str(tmp_path / "rc"))
    adds_up(rep)
    assert rep["reasons"]["withheld"] == {"step_cap": 1}
    w = lines(tmp_path / "rc" / "withheld.jsonl")[0]
    assert w["id"] == "fin-10k-1" and "cap of 30 tool steps" in w["detail"]
    assert "one.jsonl row 1" in w["detail"]
    steps = srv.bodies(stage="step")
    assert len(steps) == 31  # 30 tool steps executed, the 31st asked for the draft
    assert "The tool budget is spent (30 of 30 tool steps)" in user(steps[-1])
    for b in steps:  # the history the model sees stays inside the 8,000-character window
        hist = user(b).split("HISTORY:\n", 1)[1].split("\n\nTool steps used", 1)[0]
        hist = hist.split("\n\nThe tool budget", 1)[0]
        assert len(hist) <= 8000 + 80
    assert "earlier entries are outside the 8000-character window" in user(steps[-1])


def test_outlining_without_end_is_withheld_no_draft(tmp_path):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(ARTS["sci-rw-2"]) + "\n")
    loop = {"step": lambda b: json.dumps({"note": "", "action": "outline",
                                          "arguments": {"outline": ["again"]}})}
    with serve(loop) as srv:
        rep = rc_run.run(config(srv.url, tmp_path, input=str(one), max_writing_steps=2),
                         str(tmp_path / "w"))
        assert len(srv.bodies(stage="step")) == 3
    assert rep["reasons"]["withheld"] == {"no_draft": 1}
    assert "outline step 3 is over config.max_writing_steps=2" in \
        lines(tmp_path / "w" / "withheld.jsonl")[0]["detail"]


def test_window_keeps_whole_newest_entries():
    trace = [{"type": "note", "content": f"n{i} " + "y" * 50} for i in range(200)]
    w = window(trace, 1000)
    assert w.startswith("(") and "[200] note: n199" in w and "[1] note" not in w
    assert len(w) <= 1000 + 80


def test_rule_cues_and_artifact_conditioned_retrieval_on_the_sample():
    from rossjax.reconstruct.anchor import retrieve

    cues = {c["text"]: c["kind"] for c in rule_cues(ARTS["legal-judg-2"]["text"])}
    assert cues == {"Article 14": "statute", "Rule 41(b)": "statute",
                    "Pruett v. City of Lanark": "case"}
    fin = {c["text"]: c["kind"] for c in rule_cues(ARTS["fin-10k-1"]["text"])}
    assert fin["Norrland Freight Inc."] == "organization" and fin["$412.6 million"] == "figure"
    assert fin["fiscal 2023"] == "period" and fin["9.3%"] == "figure"
    sci = [c["text"] for c in rule_cues(ARTS["sci-rw-1"]["text"])]
    assert "Okafor and Brandt (2019)" in sci and "Lindqvist et al. (2021)" in sci
    index = CorpusEnv(path=CORPUS).index
    own = {"sci-rw-1": {"okafor2019", "lindqvist2021", "marchetti2022", "haddad2023"},
           "sci-rw-2": {"adeyemi2020", "sato2022", "brennan2023", "probes-survey"},
           "fin-10k-1": {"norrland-mdna-2023", "norrland-costs-2023", "norrland-risk-2023",
                         "shipping-rates"},
           "fin-10k-2": {"calder-cash-2023", "calder-loan-2023", "calder-runway-2023"},
           "legal-judg-1": {"osha-11c", "dunmore-alder", "preemption-note"},
           "legal-judg-2": {"article-14", "rule-41b-amendment", "pruett-lanark"}}
    for rid, art in ARTS.items():
        got = {e["id"] for e in retrieve(index, art, rule_cues(art["text"]), 3, 8)}
        assert got <= own[rid] and len(got) >= 2, (rid, got)  # no stray document of another


def test_leak_rules_fire_and_are_retried(tmp_path):
    art = ARTS["sci-rw-1"]
    cues = rule_cues(art["text"])
    kw = dict(ngram=8, max_chars=600, max_ratio=0.5)
    assert "citation 'Okafor and Brandt (2019)'" in leak("Summarize Okafor and Brandt (2019).",
                                                         art["text"], cues, **kw)
    assert "8 consecutive words" in leak("Explain why " + " ".join(art["text"].split()[:9]),
                                         art["text"], cues, **kw)
    assert "characters, more than" in leak("word " * 300, art["text"], cues, **kw)
    assert leak("Survey prior work on retrieval for code completion.", art["text"], cues, **kw) is None
    leaky = {"task": lambda b: json.dumps({**good_task("x"), "task": "Summarize what "
                                           "Lindqvist et al. (2021) found."})
             if artifact_of(b) == "sci-rw-1" else None}
    once = {"n": 0}

    def leak_once(b):
        if artifact_of(b) != "sci-rw-2" or once["n"]:
            return None
        once["n"] += 1
        return json.dumps({**good_task("x"), "task": "Write: " + " ".join(
            ARTS["sci-rw-2"]["text"].split()[:10])})

    with serve({**leaky}) as srv:
        rep = rc_run.run(config(srv.url, tmp_path, answer_retries=1), str(tmp_path / "a"))
    adds_up(rep)
    assert rep["reasons"]["withheld"] == {"task_leak": 1}
    w = lines(tmp_path / "a" / "withheld.jsonl")[0]
    assert w["id"] == "sci-rw-1" and "citation 'Lindqvist et al. (2021)'" in w["detail"]
    asks = srv.bodies("sci-rw-1", "task")
    assert len(asks) == 2 and "leaks the artifact" in asks[1]["messages"][-1]["content"]
    with serve({"task": leak_once}) as srv:
        rep = rc_run.run(config(srv.url, tmp_path), str(tmp_path / "b"))
    assert rep["buckets"]["kept"] == 6
    rec = next(r for r in lines(tmp_path / "b" / "trajectories.jsonl") if r["id"] == "sci-rw-2")
    assert rec["leak_retries"] == 1 and "Research the sources" in rec["task"]


def test_malformed_answers_and_artifacts_are_invalid_naming_artifact_and_field(tmp_path):
    bad = tmp_path / "arts.jsonl"
    rows = [ARTS["sci-rw-1"], ARTS["fin-10k-1"], ARTS["legal-judg-1"], ARTS["sci-rw-2"],
            ARTS["fin-10k-2"]]
    body = "\n".join(json.dumps(r) for r in rows)
    body += "\n{not json\n" + json.dumps({"id": "short", "domain": "legal", "text": "too short"})
    body += "\n" + json.dumps(ARTS["sci-rw-1"]) + "\n"  # a repeated id
    bad.write_text(body)
    over = {
        "rubric": lambda b: (json.dumps({"rubric": [
            {"criterion": "a", "aspect": "coverage"}, {"criterion": "b"},
            {"criterion": "c", "aspect": "style"}]}) if artifact_of(b) == "sci-rw-1" else None),
        "plan": lambda b: "I will search first." if artifact_of(b) == "fin-10k-1" else None,
        "verify_rubric": lambda b: (json.dumps({"verdicts": [{"criterion": 1, "verdict": "yes"}]})
                                    if artifact_of(b) == "legal-judg-1" else None),
        "step": lambda b: (json.dumps({"note": "", "action": "open", "arguments": {"id": "nope"}})
                           if artifact_of(b) == "sci-rw-2" else
                           json.dumps({"note": "", "action": "search",
                                       "arguments": {"query": "the of and"}})
                           if artifact_of(b) == "fin-10k-2" else None),
    }
    with serve(over) as srv:
        rep = rc_run.run(config(srv.url, tmp_path, input=str(bad), answer_retries=1),
                         str(tmp_path / "rc"))
    adds_up(rep)
    assert rep["input_rows"] == 8 and rep["buckets"]["kept"] == 0
    inv = {(r["row"], r["reason"]): r["detail"] for r in lines(tmp_path / "rc" / "invalid.jsonl")}
    assert "arts.jsonl row 1 (artifact sci-rw-1): rubric answer: rubric.rubric[1].aspect must be " \
           "a non-empty string" in inv[(1, "model_malformed")]
    assert "(artifact fin-10k-1): plan answer: the answer is not one JSON object" in \
        inv[(2, "model_unparseable")]
    assert "verify_rubric.verdicts must hold 3 to 3 items" in inv[(3, "model_malformed")]
    assert inv[(6, "invalid_artifact")].startswith("arts.jsonl row 6")
    assert "text must be a string of 200 to 20000 characters" in inv[(7, "invalid_artifact")]
    assert "id 'sci-rw-1' repeats an earlier row" in inv[(8, "duplicate_id")]
    wh = {r["row"]: r for r in lines(tmp_path / "rc" / "withheld.jsonl")}
    assert wh[4]["reason"] == "malformed_tool_call" and "no document with id 'nope'" in wh[4]["detail"]
    assert wh[5]["reason"] == "failed_retrieval" and "'no match'" in wh[5]["detail"]
    assert len(srv.bodies("sci-rw-1", "rubric")) == 2  # asked again once, the check quoted
    assert rep["stages"]["rubric"]["failed_checks"] == {"reviewer_malformed": 2}


def test_resume_asks_nothing_twice_and_lists_each_artifact_once(tmp_path):
    down = {"plan": lambda b: (500, {"error": {"message": "overloaded"}})
            if artifact_of(b) == "legal-judg-2" else None}
    with serve(down) as srv:
        rep = rc_run.run(config(srv.url, tmp_path), str(tmp_path / "rc"))
    adds_up(rep)
    assert rep["buckets"]["kept"] == 5 and rep["reasons"]["withheld"] == {"endpoint_error": 1}
    with serve() as srv:
        rep = rc_run.run(config(srv.url, tmp_path), str(tmp_path / "rc"))
        asked = {artifact_of(b) for b in srv.answered}
        stages = [stage_of(b) for b in srv.answered]
    adds_up(rep)
    assert rep["resumed"] == 5 and rep["asked"] == 1 and rep["buckets"]["kept"] == 6
    assert asked == {"legal-judg-2"} and "cues" not in stages and "task" not in stages  # cached
    ids = [r["id"] for r in lines(tmp_path / "rc" / "trajectories.jsonl")]
    assert ids == list(ARTS)  # input order, once each
    assert lines(tmp_path / "rc" / "withheld.jsonl") == []
    assert len(lines(tmp_path / "rc" / "transcripts.jsonl")) == 6
    with serve() as srv:  # a third run asks nothing
        again = rc_run.run(config(srv.url, tmp_path), str(tmp_path / "rc"))
        assert srv.requests == []
    assert again["resumed"] == 6 and lines(tmp_path / "rc" / "trajectories.jsonl")[0]["id"] == ids[0]
    with serve() as srv:  # other settings: the journal is not reused
        other = rc_run.run(config(srv.url, tmp_path, seed=1), str(tmp_path / "rc"))
    assert other["resumed"] == 0 and other["buckets"]["kept"] == 6
    corpus = tmp_path / "corpus.jsonl"  # another corpus: the tools answer otherwise
    corpus.write_text(open(CORPUS).read() + json.dumps({"id": "new", "text": "more"}) + "\n")
    with serve() as srv:
        moved = rc_run.run(config(srv.url, tmp_path, seed=1, corpus=str(corpus)),
                           str(tmp_path / "rc"))
    assert moved["resumed"] == 0 and moved["buckets"]["kept"] == 6


def test_a_killed_run_resumes_from_its_journal_and_cache(tmp_path):
    """SIGKILL of `rossjax reconstruct` in the middle of an artifact: the rerun settles the
    journaled artifacts without asking, replays the cut-off artifact's answered requests from
    the cache, asks only the rest, and lists every artifact once."""
    import signal

    box, first = {}, 25

    def kill_at(n, body):
        if n == first and "proc" in box and box["proc"].poll() is None:
            os.kill(box["proc"].pid, signal.SIGKILL)  # the process this test started
            return False
        return True

    argv = [sys.executable, "-m", "rossjax.cli", "reconstruct", f"--workdir={tmp_path / 'w'}",
            "--config.endpoint.model=scripted", "--config.endpoint.concurrency=1",
            "--config.endpoint.max_retries=0", "--config.progress=False"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    with serve(on_request=kill_at) as srv:
        box["proc"] = subprocess.Popen([*argv, f"--config.endpoint.base_url={srv.url}"],
                                       cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
        box["proc"].communicate(timeout=120)
        assert box["proc"].returncode == -signal.SIGKILL
        total_first = len(srv.requests)
    assert total_first == first and not os.path.exists(tmp_path / "w" / "report.json")
    journal = lines(tmp_path / "w" / "journal.jsonl")
    assert [e["id"] for e in journal[1:]] == ["sci-rw-1"]  # 14 requests an artifact
    with serve() as srv:
        r = subprocess.run([*argv, f"--config.endpoint.base_url={srv.url}"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        asked = len(srv.requests)
    assert "kept 6, withheld 0, invalid 0 (none) -> " in r.stdout
    assert f"next: rossjax retrogen --config.input={tmp_path / 'w' / 'trajectories.jsonl'}" in r.stdout
    rep = json.load(open(tmp_path / "w" / "report.json"))
    adds_up(rep)
    assert rep["resumed"] == 1 and rep["buckets"]["kept"] == 6
    assert rep["requests"]["cache_hits"] == first - 14  # the cut-off artifact's answers
    assert asked == rep["requests"]["requests"] == 6 * 14 - first
    assert [x["id"] for x in lines(tmp_path / "w" / "trajectories.jsonl")] == list(ARTS)


def test_the_command_never_imports_jax():
    code = ("import importlib.abc, sys\n"
            "class B(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('jax', 'jaxlib', 'flax', 'optax', 'orbax'):\n"
            "            raise ImportError(name)\n"
            "sys.meta_path.insert(0, B())\n"
            "import rossjax.reconstruct.run, rossjax.reconstruct.local, rossjax.cli.reconstruct\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_endpoint_refusals_and_a_dead_endpoint(tmp_path, capsys):
    from rossjax import cli
    from rossjax.errors import InputError

    refuse = {"plan": lambda b: (400, {"error": {"message": "prompt longer than the context"}})
              if artifact_of(b) == "fin-10k-2" else None}
    with serve(refuse) as srv:
        rep = rc_run.run(config(srv.url, tmp_path), str(tmp_path / "rc"))
    adds_up(rep)
    assert rep["reasons"]["withheld"] == {"endpoint_refused": 1}
    assert rep["stages"]["plan"]["ended"] == {"withheld:endpoint_refused": 1}
    w = lines(tmp_path / "rc" / "withheld.jsonl")[0]
    assert w["id"] == "fin-10k-2" and "HTTP 400: prompt longer than the context" in w["detail"]
    with serve(on_request=lambda n, b: False) as srv:  # every request dropped: the setup
        with pytest.raises(InputError, match="no artifact got an answer from"):
            rc_run.run(config(srv.url, tmp_path), str(tmp_path / "dead"))
    with serve({"cues": lambda b: (401, {"error": {"message": "bad key"}})}) as srv:
        assert cli.main(["reconstruct", f"--workdir={tmp_path / 'auth'}",
                         f"--config.endpoint.base_url={srv.url}", "--config.endpoint.model=m",
                         "--config.endpoint.max_retries=0"]) == 2
    err = capsys.readouterr().err
    assert "HTTP 401: bad key" in err and "Traceback" not in err


def test_baselines(tmp_path):
    cache = str(tmp_path / "cache")
    with serve() as srv:
        fw = rc_run.run(config(srv.url, tmp_path, method="forwardgen", cache_dir=cache),
                        str(tmp_path / "fw"))
        steps = srv.bodies(stage="step") + srv.bodies(stage="plan")
    assert fw["buckets"]["kept"] == 6 and all("EXPERT ARTIFACT" not in user(b) for b in steps)
    assert all(r["id"].endswith("@forwardgen") for r in lines(tmp_path / "fw" / "trajectories.jsonl"))
    with serve() as srv:
        rg = rc_run.run(config(srv.url, tmp_path, cache_dir=cache), str(tmp_path / "rg"))
        assert not srv.bodies(stage="task")  # the anchor is replayed from the shared cache
    with serve() as srv:
        ao = rc_run.run(config(srv.url, tmp_path, method="artifact_only", cache_dir=cache),
                        str(tmp_path / "ao"))
        assert not srv.bodies()  # the same reconstruction as retrogen's: all replayed
    recs = lines(tmp_path / "ao" / "trajectories.jsonl")
    full = {r["id"]: r for r in lines(tmp_path / "rg" / "trajectories.jsonl")}
    assert rg["buckets"]["kept"] == ao["buckets"]["kept"] == 6
    assert all(r["trace"] == [] and r["artifact_only"] for r in recs)
    for r in recs:  # same draft, same scores: only the trajectory differs
        twin = full[r["task_id"]]
        assert twin["trace"] and r["draft"] == twin["draft"] and r["scores"] == twin["scores"]
    assert all(retrogen.gate(r) is None for r in recs)  # the gate takes the baseline's records
    assert retrogen.gate({**recs[0], "artifact_only": False})[0] == "no_tool_calls"


def test_json_object_response_format_reaches_every_request(tmp_path):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(ARTS["legal-judg-1"]) + "\n")
    with serve() as srv:
        rep = rc_run.run(config(srv.url, tmp_path, input=str(one),
                                **{"endpoint.response_format": "json_object"}), str(tmp_path / "w"))
        bodies = srv.bodies()
    assert rep["buckets"]["kept"] == 1 and len(bodies) == 14
    assert all(b["response_format"] == {"type": "json_object"} for b in bodies)
    from rossjax.errors import ConfigError
    with pytest.raises(ConfigError, match="response_format 'json_schema' must be none or"):
        rc_run.run(config("http://127.0.0.1:9/v1", tmp_path,
                          **{"endpoint.response_format": "json_schema"}), str(tmp_path / "x"))


def test_cli_needs_a_model_or_a_checkpoint(tmp_path, capsys):
    from rossjax import cli

    assert cli.main(["reconstruct", f"--workdir={tmp_path / 'w'}"]) == 2
    assert "config.endpoint.model is empty" in capsys.readouterr().err


@pytest.mark.slow
def test_a_served_tiny_model_is_accounted_for_artifact_by_artifact(tmp_path):
    """--config.serve.model=tiny: `rossjax serve` on a random tiny model, started and stopped by
    the run; its answers are noise, yet every artifact lands in a bucket, and a rerun, all
    journaled, serves nothing."""
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    env.pop("OPENAI_BASE_URL", None)
    r = subprocess.run([sys.executable, "-m", "rossjax.cli", "reconstruct",
                        "--config=configs/reconstruct.py:runlocal", "--config.serve.model=tiny",
                        "--config.endpoint.max_tokens=32", f"--workdir={tmp_path / 'w'}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(tmp_path / "w" / "report.json"))
    adds_up(rep)
    assert rep["input_rows"] == 6 and rep["requests"]["requests"] >= 6
    assert rep["model"]["model"] == "local" and "standin" not in rep["model"]
    again = subprocess.run(r.args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    rep2 = json.load(open(tmp_path / "w" / "report.json"))  # all journaled: nothing served
    assert rep2["resumed"] == 6 and rep2["requests"]["requests"] == 0
    assert rep2["buckets"] == rep["buckets"] and rep2["reasons"] == rep["reasons"]


@pytest.mark.slow
def test_retrogen_sft_trains_on_the_serialized_rows_with_left_truncation(tmp_path, capsys):
    """reconstruct -> retrogen -> curate (recipe positive_sft) -> train with
    configs/retrogen_sft.py:runlocal: rows longer than seq_len keep their last tokens and every
    kept token is supervised (loss over the sequence)."""
    from rossjax import cli

    with serve() as srv:
        rc_run.run(config(srv.url, tmp_path), str(tmp_path / "rc"))
    g = rg_config.get_config()
    g.input, g.output = str(tmp_path / "rc" / "trajectories.jsonl"), str(tmp_path / "rg")
    assert len(retrogen.run(g).kept) == 6
    tok = write_ascii_tokenizer(str(tmp_path / "tok"))
    assert cli.main(["curate", f"--config.input={tmp_path / 'rg' / 'retrogen.jsonl'}",
                     "--config.recipe=positive_sft", f"--config.tokenizer={tok}",
                     f"--config.output={tmp_path / 'cur'}", "--config.progress=False"]) == 0
    cur = json.load(open(tmp_path / "cur" / "report.json"))
    assert cur["buckets"]["kept"] == 6
    assert cur["tokens"]["kept_supervised"] == cur["tokens"]["kept_total"]
    capsys.readouterr()
    assert cli.main(["train", "--config=configs/retrogen_sft.py:runlocal",
                     f"--config.data.train={tmp_path / 'cur'}", "--config.train.num_steps=2",
                     f"--workdir={tmp_path / 'w'}"]) == 0
    err = capsys.readouterr().err
    assert "6 of 6 rows longer than data.seq_len=256" in err and "truncated" in err
    rows = [json.loads(x) for x in open(tmp_path / "w" / "too_long.jsonl")]
    assert len(rows) == 6 and {r["result"] for r in rows} == {"truncated"}


def test_a_served_run_passes_what_it_derives_and_never_writes_the_config(tmp_path, monkeypatch):
    """config.serve.model: the run serves it (here a stand-in LocalServer on the scripted
    endpoint) and passes the served URL and id to its client, fingerprint and report as
    arguments; the config is as it was given, and a rerun, all journaled, serves nothing."""
    from rossjax.reconstruct import local

    started = []
    with serve() as srv:
        class Fake:
            def __init__(self, model, log, **kw):
                started.append(model)
                self.url, self.model_id = srv.url, kw["model_id"]

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        monkeypatch.setattr(local, "LocalServer", Fake)
        c = config("http://unused.invalid/v1", tmp_path, **{"serve.model": "/models/m",
                                                             "serve.model_id": "served"})
        before = c.to_dict()
        rep = rc_run.run(c, str(tmp_path / "w"))
        assert c.to_dict() == before and started == ["/models/m"]
        assert rep["buckets"]["kept"] == 6 and rep["model"]["model"] == "served"
        assert rep["config"]["endpoint"]["base_url"] == srv.url.rstrip("/")
        again = rc_run.run(c, str(tmp_path / "w"), serve_model="/models/m")
    assert c.to_dict() == before and started == ["/models/m"]  # all journaled: nothing served
    assert again["resumed"] == 6 and again["requests"]["requests"] == 0
