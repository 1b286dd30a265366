"""`rossjax repro retrogen` (issue 38 item 6): the world's held-out questions rest on documents no
artifact cites; the agent evaluation scores a scripted model that searches, opens and answers
as 1 on every metric and one that answers at once as 0; the claims say shown / NOT shown from
the numbers, and an arm without rows is NOT shown with that reason; the quick run (slow) goes
through every stage, trains all four arms and writes the report."""

import json
import os
import re

import pytest
from repro_quick import run_quick

from rossjax.repro import retrogen as rr, stages


def test_the_world_holds_out_what_no_artifact_cites():
    w = rr.world(4, 6)
    ids = {d["id"] for d in w["docs"]}
    cited = {c for a in w["artifacts"] for c in re.findall(r"\[([^\]]+)\]", a["text"])}
    assert len(w["artifacts"]) == 4 and len(w["tests"]) == 6 and cited <= ids
    assert all(len(a["text"]) >= 200 for a in w["artifacts"])
    assert not {t["doc"] for t in w["tests"]} & cited
    for t in w["tests"]:  # the answer is in its document and not in the question
        doc = next(d for d in w["docs"] if d["id"] == t["doc"])
        assert t["value"] in doc["text"] and t["value"] not in t["prompt"]
        # the stand-in's induced task of a brief on the material: names it, cites nothing
        assert t["prompt"].startswith("Research the corpus's sources on " + t["material"].lower())
        assert t["material"].lower() + "-trade" in ids and "-note" not in t["prompt"]
        assert not any(t["material"] in a["text"] for a in w["artifacts"])
    assert rr.world(4, 6) == w  # seeded


class Scripted:
    """sample.generate's stand-in: each call answers every prompt with its next scripted turn."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls = tok, turns, 0

    def __call__(self, cfg, params, prompts, max_new, **kw):
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        tok = self.tok

        class Out:
            def sequences(self):
                return [tok.encode(text) for _ in prompts]

        return Out()


def _eval(tmp_path, monkeypatch, turns):
    from rossjax import sample

    w = rr.world(1, 1)
    corpus = stages.write_jsonl(str(tmp_path / "corpus.jsonl"), w["docs"])
    _, tok = stages.ascii_tokenizer(str(tmp_path / "tok"))
    t = w["tests"][0]
    turns = [x.format(doc=t["doc"], material=t["material"], value=t["value"]) for x in turns]
    monkeypatch.setattr(stages, "load_model", lambda hf: (None, None))
    monkeypatch.setattr(sample, "generate", Scripted(tok, turns))
    return rr.agent_eval("unused", tok, corpus, w["tests"])


def test_the_agent_eval_scores_an_agent_that_finds_the_evidence(tmp_path, monkeypatch):
    got = _eval(tmp_path, monkeypatch, [
        '<tool_call>\n{{"name": "search", "arguments": {{"query": "{material} measurements"}}}}'
        '\n</tool_call>',
        '<tool_call>\n{{"name": "open", "arguments": {{"id": "{doc}"}}}}\n</tool_call>',
        "{material} melts at {value} kelvin [{doc}]."])
    assert got["evidence"] == 1.0 and got["right"] == 1.0
    assert got["steps"] == 2.0 and got["valid_calls"] == 2.0


def test_the_agent_eval_gives_nothing_for_an_answer_without_evidence(tmp_path, monkeypatch):
    got = _eval(tmp_path, monkeypatch, [
        '<tool_call>\n{{"name": "open", "arguments": {{"id": "no-such-doc"}}}}\n</tool_call>',
        "It melts at 1 kelvin."])
    assert got == {**got, "evidence": 0.0, "right": 0.0, "steps": 1.0, "valid_calls": 0.0}


def test_claims_follow_the_numbers_and_name_an_untrained_arm():
    m = lambda v: {"mean": v, "std": 0.0, "n": 1}  # noqa: E731
    s = {"retrogen": {"evidence": m(0.5), "right": m(0.3)},
         "forwardgen": {"evidence": m(0.2), "right": m(0.1)},
         "artifact_only": {"evidence": m(0.5), "right": m(0.4)}}
    c = rr.claims({"summary": s})
    assert [x["holds"] for x in c] == [True, False, False]
    assert "retrogen 0.500, forwardgen 0.200" in c[0]["evidence"]
    # a gap inside the seeds' spread is not shown
    noisy = {**s, "forwardgen": {"evidence": {"mean": 0.2, "std": 0.4, "n": 3}}}
    assert not rr.claims({"summary": noisy})[0]["holds"]
    assert c[2]["evidence"] == "next_n_replace had no rows to train on"


def test_the_base_episodes_are_the_arms_format_on_another_task(tmp_path):
    """retrogen_base: the stand-in instruct model's episodes parse and run as the arms' calls
    do, on materials the experiment never names, and never touch a melting point."""
    from rossjax.agents.corpus import CorpusEnv
    from rossjax.agents.parse import parse_tool_calls
    from rossjax.reconstruct.trace import Tools
    from rossjax.repro import retrogen_base as rb

    w = rr.world(6, 4)
    avoid = set(w["materials"])
    c = rb.corpus(30, 5, avoid)
    assert len(c["specs"]) == 35 and sum(s["test"] for s in c["specs"]) == 5
    assert not {s["material"] for s in c["specs"]} & avoid
    path = stages.write_jsonl(str(tmp_path / "base.jsonl"), c["docs"])
    tools = Tools(CorpusEnv(path=path, k=3))
    rows = rb.rows([rb.episode(s, tools) for s in c["specs"] if not s["test"]])
    assert len(rows) == 30
    for r in rows:
        text = json.dumps(r)
        assert "melt" not in text and "kelvin" not in text and "-note" not in text
        calls = [parse_tool_calls(m["content"], "hermes")[0] for m in r["messages"]
                 if m["role"] == "assistant"]
        assert [len(x) for x in calls] == [1, 1, 0]  # search, open, the answer
        target = calls[1][0].arguments["id"]
        obs = [m["content"] for m in r["messages"] if m["role"] == "user"][1:]
        assert target in obs[0] and not obs[1].startswith("<tool_response>\nerror")
        assert r["messages"][-1]["content"].endswith(f"[{target}]")
    # a held-out base test's answer is in its document and not in its question
    tests = rb.held_out(c)
    assert len(tests) == 5
    for t in tests:
        doc = next(d for d in c["docs"] if d["id"] == t["doc"])
        assert t["value"] in doc["text"] and t["value"] not in t["prompt"]
        assert t["value"].isdigit() or t["value"] in rb.SITES


@pytest.mark.slow
def test_repro_retrogen_quick_runs_every_stage_and_states_its_claims(tmp_path):
    res, out = run_quick("retrogen", tmp_path, timeout=1800)
    # Eq. 4 >= 0.6 keeps the traces without a slip; next-N replace as many (or fewer) below
    assert set(res["rows"]) == set(rr.ARMS) and res["rows"]["retrogen"][0] >= 3
    assert res["rows"]["artifact_only"] == res["rows"]["retrogen"]
    assert 0 < res["rows"]["next_n_replace"][0] <= res["rows"]["retrogen"][0]
    for arm in rr.ARMS:  # trained and evaluated
        r = res["runs"][arm][0]
        assert 0 <= r["evidence"] <= 1 and 0 <= r["right"] <= 1 and r["loss"] > 0
        assert os.path.isfile(tmp_path / "retrogen" / "runs" / f"{arm}-s0" / "hf" / "config.json")
    md = open(tmp_path / "retrogen" / "report.md").read()
    assert md.count("shown**: ") == 3 and "NOT a model" in md
    assert "| retrogen |" in md and "shown: reconstructed trajectories beat ForwardGen" in out
