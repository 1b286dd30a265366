"""`rossjax repro routes`'s lexical and embedding rows, without training: the pool's embedding
store from the frozen model, both baselines' selections and their table rows."""

import json

from rossjax import cli
from rossjax.demo import base_model
from rossjax.repro import families, routes, stages, warmup


def test_lexical_and_embedding_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "COMMAND", cli.main)
    assert {"lexical", "embedding"} <= set(routes.SIZES["full"]["methods"])
    assert set(routes.SIZES["quick"]["select_only"]) == {"lexical", "embedding"}
    pool = str(tmp_path / "pool.jsonl")
    stages.write_jsonl_rows(pool, families.pool(warmup.problems()[1][:60], 1, routes.SHARES, 0))
    hf = str(tmp_path / "hf")
    base_model(hf, 256)
    tok_path, _ = stages.ascii_tokenizer(str(tmp_path / "tok"))
    emb = routes.extract_pool(pool, hf, tok_path, str(tmp_path / "emb"))
    assert emb["layer"] == 2   # tiny_qwen2: after the final norm
    got = {}
    for m in ("lexical", "embedding"):
        sel = routes.select(pool, str(tmp_path / m), m, 12, 0, emb["store"])
        assert sum(sel["families"].values()) == 12 and sel["report"]["rows"] == 12
        got[m] = [sel["families"]]
    res = {"size": {"samples": 8}, "warmup": {"eval": {"coverage": 0, "families_produced": 0,
                                                        "pass1": 0, "passk": 0}},
           "summary": {}, "selection_only": routes.summarize_selections(got)}
    _, rows = routes.table(res)
    assert [r[0] for r in rows[1:]] == ["lexical (selection only)", "embedding (selection only)"]
    assert all(r[3:] == ["-"] * 4 for r in rows[1:])
    json.dumps(res)  # results.json holds it
