"""Selection baselines (lexical TF-IDF, embedding and gradient stores): their spaces, the same
budget and quota rules as the route methods, the store lookup by id, and bad input."""

import json

import numpy as np
import pytest
from sklearn.feature_extraction.text import TfidfVectorizer

from rossjax import cli
from rossjax.curate.subset import run
from rossjax.resources import config_path
from rossjax.routes.baselines import features_by_id, lexical_features, unit_rows

WORDS = {d: [f"{d}{k}" for k in range(12)] for d in ("alpha", "beta", "gamma", "delta")}


def _cfg(**kw):
    cfg = cli.parse_config([f"--config={config_path('select_routes.py')}"])[0]
    cfg.update(dict(plot=False, progress=False, compare="", per_group=None), **kw)
    return cfg


def _pool(path, n_per=15, seed=0):
    """Rows in four wording dialects (disjoint vocabularies), every row the same route shape."""
    rng = np.random.default_rng(seed)
    rows, dialect = [], []
    for d, words in WORDS.items():
        for k in range(n_per):
            text = "\n\n".join(" ".join(rng.choice(words, 6)) + "." for _ in range(4))
            rows.append({"id": f"{d}-{k}", "task": {"id": f"p{k}"}, "verifier": {"passed": True},
                         "messages": [{"role": "user", "content": "q"},
                                      {"role": "assistant", "content": text}]})
            dialect.append(d)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return rows, np.array(dialect)


def test_lexical_space_is_tfidf_cosine_exactly_when_small_and_close_when_projected():
    rng = np.random.default_rng(1)
    vocab = [f"w{k}" for k in range(40)]
    texts = [" ".join(rng.choice(vocab, 20)) for _ in range(30)]
    f = lexical_features(texts, ngram_max=1, dim=256)
    t = TfidfVectorizer(sublinear_tf=True, token_pattern=r"(?u)\b\w+\b|[^\w\s]").fit_transform(texts)
    np.testing.assert_allclose(f @ f.T, (t @ t.T).toarray(), atol=1e-6)  # float32 dot products
    g = lexical_features(texts, ngram_max=3, dim=256, seed=0)   # > 256 terms: projected
    assert g.shape == (30, 256)
    np.testing.assert_allclose(np.linalg.norm(g, axis=1), 1.0, atol=1e-6)
    exact = lexical_features(texts, ngram_max=3, dim=10**6)
    # Johnson-Lindenstrauss at 256 dims: inner-product error ~ 1/sqrt(256) = 0.0625 per pair
    assert np.abs(g @ g.T - exact @ exact.T).mean() < 0.0625
    np.testing.assert_array_equal(g, lexical_features(texts, ngram_max=3, dim=256, seed=0))
    with pytest.raises(ValueError, match="hold no words"):
        lexical_features(["", " "])


def test_lexical_select_covers_every_dialect_under_the_group_quota(tmp_path):
    src = tmp_path / "pool.jsonl"
    _, dialect = _pool(src)
    for seed in (0, 1):
        rep = run(_cfg(input=str(src), output=str(tmp_path / f"o{seed}"), method="lexical",
                       compare="random", budget=8, seed=seed, per_group=1))
        got = rep["selected_ids"]
        assert len(got) == 8 and len(set(got)) == 8
        assert {i.split("-")[0] for i in got} == set(WORDS)          # all four dialects
        assert rep["methods"]["lexical"]["rows_per_problem"]["max"] == 1   # same quota rule
        assert set(rep["methods"]) == {"lexical", "random"}
        with open(tmp_path / f"o{seed}" / "selected.jsonl") as f:
            assert sorted(json.loads(line)["id"] for line in f) == sorted(got)


def test_embedding_and_gradient_stores_are_read_by_id(tmp_path):
    src = tmp_path / "pool.jsonl"
    rows, dialect = _pool(src)
    ids = [r["id"] for r in rows]
    rng = np.random.default_rng(2)
    # the store's geometry: 6 tight directions unrelated to the wording; stored in another order
    direction = rng.integers(0, 6, len(ids))
    vec = np.eye(6, 16)[direction] * 3.0 + rng.normal(size=(len(ids), 16)) * 0.01
    order = rng.permutation(len(ids))
    store = ([ids[i] for i in order], vec[order])
    seen = []

    def read_store(path, layer):
        seen.append((path, layer))
        return store[0], lambda want: store[1][want]

    for method, field in (("embedding", "embedding_store"), ("gradient", "gradient_store")):
        rep = run(_cfg(input=str(src), output=str(tmp_path / method), method=method, budget=6,
                       **{field: "STORE"}), read_store=read_store)
        picked = direction[[ids.index(i) for i in rep["selected_ids"]]]
        assert sorted(picked) == list(range(6)), picked      # one per stored direction
    assert seen == [("STORE", None), ("STORE", None)]
    with pytest.raises(ValueError, match="needs --config.embedding_store=DIR"):
        run(_cfg(input=str(src), output=str(tmp_path / "x"), method="embedding", budget=6),
            read_store=read_store)
    short = (store[0][1:], lambda want: store[1][1:][want])
    with pytest.raises(ValueError, match=rf"no stored row for id '{store[0][0]}' \(1 of the 60"):
        run(_cfg(input=str(src), output=str(tmp_path / "x"), method="embedding", budget=6,
                 embedding_store="S"), read_store=lambda p, layer: short)


def test_features_by_id_bad_rows():
    read = lambda rows: np.array([[1.0, np.nan], [0.0, 2.0]])[rows]  # noqa: E731
    with pytest.raises(ValueError, match="the row of id 'a' has a non-finite value"):
        features_by_id(["a", "b"], read, ["b", "a"], "store S")
    np.testing.assert_array_equal(features_by_id(["a", "b"], read, ["b", "b"], "S"), [[0, 1], [0, 1]])
    assert np.array_equal(unit_rows(np.zeros((1, 3))), np.zeros((1, 3)))


def test_select_cli_embedding_over_an_extract_store(tmp_path, capsys):
    """The whole path: `rossjax extract` of the pool's rows, then `rossjax select
    --config.method=embedding` reading that store (checksums verified) by id."""
    src = tmp_path / "pool.jsonl"
    rows, _ = _pool(src, n_per=4)
    acts_in = tmp_path / "acts_in.jsonl"
    with open(acts_in, "w") as f:
        for r in rows:
            ids = [ord(ch) % 250 + 1 for ch in r["messages"][1]["content"]][:64]
            f.write(json.dumps({"id": r["id"], "input_ids": ids}) + "\n")
    store = tmp_path / "acts"
    assert cli.main(["extract", f"--config={config_path('extract.py')}", f"--config.input={acts_in}",
                     f"--config.output={store}",
                     "--config.layers=(1,2)"]) == 0
    out = tmp_path / "sel"
    base = ["select", f"--config={config_path('select_routes.py')}", f"--config.input={src}",
            f"--config.output={out}", "--config.budget=5", "--config.method=embedding",
            "--config.compare=diverse", "--config.plot=False", "--config.progress=False",
            f"--config.embedding_store={store}"]
    assert cli.main(base) == 0
    rep = json.load(open(out / "report.json"))
    assert rep["method"] == "embedding" and len(rep["selected_ids"]) == 5
    assert cli.main(base + ["--config.embedding_layer=1"]) == 0
    capsys.readouterr()
    assert cli.main(base + ["--config.embedding_layer=7"]) == 2
    assert "layer 7 is not in the store" in capsys.readouterr().err
