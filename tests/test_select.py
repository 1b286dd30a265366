"""Selection: honesty ordering on known route families, quotas, k-center against a slow
reference, similar/topology/groups semantics, bad input."""

import numpy as np
import pytest

from rossjax.bench.select import family_routes, synth_traces
from rossjax.curate import select as exported_select
from rossjax.routes.fingerprint import fingerprint
from rossjax.routes.selection import Clustering, _largest_remainder, cluster_pool, select


@pytest.fixture(scope="module")
def pool():
    # 40 route families with skewed sizes: random picks follow the skew, diverse should not.
    w = 1.0 / np.arange(1, 41) ** 1.3
    texts, fam = synth_traces(1500, family_routes(40, seed=5), seed=6, weights=w / w.sum())
    fps, routes = fingerprint(texts, return_routes=True)
    return fps, fam, routes


def test_exported_from_package():
    assert exported_select is select


def test_diverse_covers_more_families_than_random_than_similar(pool):
    fps, fam, _ = pool
    for seed in (0, 1):
        cover = {m: len(np.unique(fam[select(fps, 40, m, seed=seed)]))
                 for m in ("diverse", "random", "similar")}
        assert cover["diverse"] > cover["random"] > cover["similar"], cover


def test_deterministic_and_sorted(pool):
    fps = pool[0]
    a = select(fps, 50, "diverse", seed=3)
    np.testing.assert_array_equal(a, select(fps, 50, "diverse", seed=3))
    assert a.dtype == np.int64 and len(np.unique(a)) == 50 and np.all(np.diff(a) > 0)


def test_largest_remainder_reference():
    sizes = np.array([7, 1, 0, 12, 5])
    for budget in range(0, 26):
        share = _largest_remainder(sizes, budget)
        assert share.sum() == budget and np.all(share <= sizes)
        exact = budget * sizes / sizes.sum()
        assert np.all(np.abs(share - exact) < 1)


def slow_kcenter(x, start, q):
    chosen = [start]
    while len(chosen) < q:
        best, best_d = None, -1.0
        for i in range(len(x)):
            if i in chosen:
                continue
            d = min(float(((x[i] - x[c]) ** 2).sum()) for c in chosen)
            if d > best_d:
                best, best_d = i, d
        chosen.append(best)
    return sorted(chosen)


def test_diverse_matches_slow_reference_per_cluster():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 5)).astype(np.float32)
    labels = np.repeat([0, 1, 2], [30, 20, 10])
    centers = np.stack([x[labels == c].mean(0) for c in range(3)])
    dist = ((x - centers[labels]) ** 2).sum(1)
    cl = Clustering(centers, labels, dist)
    got = select(x, 12, "diverse", clustering=cl)
    quota = _largest_remainder(np.array([30, 20, 10]), 12)
    want = []
    for c in range(3):
        idx = np.flatnonzero(labels == c)
        start = int(np.argmin(dist[idx]))
        want += [int(idx[i]) for i in slow_kcenter(x[idx], start, int(quota[c]))]
    np.testing.assert_array_equal(got, sorted(want))


def test_similar_stays_in_largest_cluster_then_spills():
    rng = np.random.default_rng(1)
    blobs = [rng.normal(size=(n, 4)) * 0.1 + off for n, off in ((50, 0.0), (20, 3.0), (30, 10.0))]
    x = np.concatenate(blobs).astype(np.float32)
    cl = cluster_pool(x, 3, seed=0)
    big = cl.labels[0]
    s = select(x, 30, "similar", clustering=cl)
    assert np.all(cl.labels[s] == big)
    d = ((x - cl.centers[big]) ** 2).sum(1)
    inside = np.flatnonzero(cl.labels == big)
    assert set(s) == set(inside[np.argsort(d[inside])[:30]])
    s = select(x, 60, "similar", clustering=cl)
    assert set(s) >= set(range(50)) and set(s[s >= 50]) <= set(range(50, 70))  # spills to the near blob


def test_topology_one_per_route_first(pool):
    fps, fam, routes = pool
    n_routes = len(np.unique(routes))
    s = select(fps, n_routes, "topology", routes=routes, seed=2)
    assert len(np.unique(routes[s])) == n_routes
    s = select(fps, n_routes + 10, "topology", routes=routes)
    assert len(np.unique(routes[s])) == n_routes
    with pytest.raises(ValueError, match="needs routes"):
        select(fps, 10, "topology")


@pytest.mark.parametrize("method", ["diverse", "similar", "random"])
def test_per_group_quota(pool, method):
    fps = pool[0]
    groups = np.array([f"p{i % 100}" for i in range(len(fps))])
    s = select(fps, 150, method, groups=groups, per_group=2, seed=4)
    assert len(s) == 150
    assert np.bincount(np.unique(groups, return_inverse=True)[1][s]).max() <= 2
    with pytest.raises(ValueError, match="exceeds the 200 rows allowed by per_group=2"):
        select(fps, 201, method, groups=groups, per_group=2)


def test_bad_input(pool):
    fps = pool[0]
    with pytest.raises(ValueError, match="budget 1501 is larger than the pool of 1500 rows"):
        select(fps, 1501)
    with pytest.raises(ValueError, match="non-negative integer"):
        select(fps, -1)
    with pytest.raises(ValueError, match="clusters must be >= 1"):
        select(fps, 10, "diverse", clusters=0)
    with pytest.raises(ValueError, match="unknown selection method"):
        select(fps, 10, "best")
    bad = fps.copy()
    bad[7, 3] = np.nan
    with pytest.raises(ValueError, match="fingerprints row 7 has a non-finite value"):
        select(bad, 10)
    with pytest.raises(ValueError, match="2-D"):
        select(fps[0], 1)
    assert select(fps, 0).shape == (0,)
    # documented: more clusters than rows is clamped to the pool size
    assert len(select(fps[:5], 3, "diverse", clusters=50)) == 3
    # identical rows do not break k-means++ or k-center
    same = np.ones((20, 8), np.float32)
    assert len(select(same, 5, "diverse", clusters=3)) == 5


def _cfg(arg=None, **kw):
    import importlib.util

    spec = importlib.util.spec_from_file_location("select_routes", "configs/select_routes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = mod.get_config(arg)
    cfg.update(kw)
    return cfg


def test_select_cli_writes_subset_report_and_png(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "sel"
    # through the real command line (parse_config reads the process's own argv)
    subprocess.run([sys.executable, "-m", "rossjax.cli", "select", "--config=configs/select_routes.py:runlocal",
                    f"--config.output={out}", "--config.only_passed=True"], check=True)
    report = json.loads((out / "report.json").read_text())
    lines = open("data/select/sample.jsonl").read().splitlines()
    chosen = (out / "selected.jsonl").read_text().splitlines()
    assert len(chosen) == 12 and set(chosen) <= set(lines)       # rows copied verbatim
    recs = [json.loads(c) for c in chosen]
    assert all(r["verifier"]["passed"] for r in recs)
    assert [r["id"] for r in recs] == report["selected_ids"]
    tasks = [r["task"]["id"] for r in recs]
    assert max(tasks.count(t) for t in tasks) <= 2                 # per_group=2 in :runlocal
    assert report["pool"]["skipped"] == {"not_passed": 4}
    assert report["rows"] == {"input_rows": len(lines), "skipped": {"not_passed": 4},
                              "selected": 12, "not_selected": len(lines) - 4 - 12}
    m = report["methods"]
    assert set(m) == {"diverse", "similar", "random", "topology"}
    for key in ("mean_pairwise_distance", "distinct_label_sequences", "clusters_covered",
                "rows_per_problem"):
        assert key in m["diverse"]
    assert m["diverse"]["mean_pairwise_distance"] > m["similar"]["mean_pairwise_distance"]
    assert (out / "selection.png").read_bytes()[:4] == b"\x89PNG"


def test_select_cli_parquet_and_errors(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rossjax.curate.subset import run

    recs = [json.loads(line) for line in open("data/select/sample.jsonl")][:20]
    for r in recs:
        r.pop("steps", None)
    src = tmp_path / "pool.parquet"
    pq.write_table(pa.Table.from_pylist(recs), src)
    out = tmp_path / "o"
    run(_cfg(input=str(src), output=str(out), budget=5, compare="random", plot=False))
    got = pq.read_table(out / "selected.parquet").to_pylist()
    assert len(got) == 5 and {g["id"] for g in got} <= {r["id"] for r in recs}
    with pytest.raises(ValueError, match="budget 50 is larger than the 18 usable records"):  # passed
        run(_cfg(input=str(src), output=str(out), budget=50))
    with pytest.raises(ValueError, match="unknown selection method 'best'"):
        run(_cfg(input=str(src), output=str(out), method="best"))


def test_bench_select_smoke(capsys):
    from rossjax.bench.select import main

    assert main(["--n=3000", "--budget=200", "--workers=1", "--chunk=1500", "--families=20"]) == 0
    out = capsys.readouterr().out
    for key in ("fingerprinting alone", "select diverse 200 of 3,000", "families covered", "peak RSS"):
        assert key in out


def test_select_cli_on_a_curated_dir(tmp_path):
    import json

    from array_record.python.array_record_module import ArrayRecordWriter

    from rossjax.curate.compiled import encode_example, read_compiled
    from rossjax.curate.masks import compile_rollout
    from rossjax.curate.subset import run
    from rossjax.tokenizers import load_tokenizer

    tok = load_tokenizer("qwen")
    src = tmp_path / "curated"
    src.mkdir()
    w = ArrayRecordWriter(str(src / "compiled-00000.array_record"), "group_size:1")
    recs = [r for r in map(json.loads, open("data/select/sample.jsonl")) if r["verifier"]["passed"]][:30]
    for r in recs:
        ex = compile_rollout(r, tok)
        assert ex.status == "kept"
        w.write(encode_example(ex))
    w.close()
    out = tmp_path / "out"
    rep = run(_cfg(input=str(src), output=str(out), tokenizer="qwen", budget=8, plot=False,
                   per_group=1))
    got = [ex["id"] for ex in read_compiled(str(out))]
    assert len(got) == 8 and set(got) == set(rep["selected_ids"]) <= {r["id"] for r in recs}
    assert rep["pool"]["rows"] == 30 and rep["pool"]["distinct_label_sequences"] >= 5
    assert rep["methods"]["diverse"]["rows_per_problem"]["max"] == 1
    with pytest.raises(ValueError, match="set --config.tokenizer"):
        run(_cfg(input=str(src), output=str(out), budget=8))


def test_fingerprint_many_equals_one_call_in_chunks_and_workers():
    """Chunked (and multi-process) fingerprinting gives the same bits as one call; bad rows are
    named by their index in the whole list, not in a chunk."""
    import json

    from rossjax.routes.fingerprint import fingerprint, fingerprint_many, trace_text

    texts = [trace_text(json.loads(line)) for line in open("data/select/sample.jsonl")]
    want, want_r = fingerprint(texts, "math", 32, 3, return_routes=True)
    for kw in ({"chunk": 7}, {"chunk": 11, "workers": 2}):
        for given in (texts, iter(texts)):  # a list, and a stream read chunk by chunk
            got, got_r = fingerprint_many(given, "math", 32, 3, **kw)
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(got_r, want_r)
    for given in (texts[:9] + ["  "], iter(texts[:9] + ["  "])):
        with pytest.raises(ValueError, match=r"texts\[9\] is empty"):
            fingerprint_many(given, chunk=4)
    assert fingerprint_many([], dim=8)[0].shape == (0, 8)


def test_default_pool_is_verifier_passed_rows_and_cluster_rule_matches(tmp_path):
    """Without any override the pool is the verifier-passed rows (the paper's), and the
    config's stated cluster-count rule is the one the code applies."""
    import re

    from rossjax.curate.subset import run
    from rossjax.routes.selection import default_clusters

    cfg = _cfg("runlocal", output=str(tmp_path / "o"), plot=False, compare="diverse",
               progress=False)
    assert cfg.only_passed is True
    report = run(cfg)
    assert report["pool"]["skipped"] == {"not_passed": 4}
    # the comment on config.clusters names the rule default_clusters implements
    with open("configs/select_routes.py", encoding="utf-8") as f:
        comment = re.search(r"c\.clusters = .*# (.*)", f.read()).group(1)
    assert "round(3 * sqrt(budget))" in comment
    for n, budget in ((10**6, 100), (10**6, 1000), (50, 1000), (5, 3)):
        assert default_clusters(n, budget) == max(1, min(n, budget, round(3 * budget ** 0.5)))
    assert report["clusters"] == default_clusters(56, cfg.budget) == 10


def test_selection_plot_draws_stacked_rows_once_with_their_count(tmp_path):
    """Rows with one route share a PCA point: one marker per point, sized by its row count."""
    from rossjax.curate.subset import plot_selection, stack_points

    xy = np.array([[0, 0], [0, 0], [0, 0], [1, 2], [1, 2], [3, 1]], np.float32)
    pts, n = stack_points(xy)
    assert pts.tolist() == [[0, 0], [1, 2], [3, 1]] and n.tolist() == [3, 2, 1]
    assert stack_points(xy[:0])[1].tolist() == []
    fps = np.repeat(np.eye(4, dtype=np.float32), [5, 3, 2, 1], axis=0)
    plot_selection(fps, {"diverse": [0, 5, 8, 10], "similar": [0, 1, 2]}, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
