"""Packed loader: token conservation, segment ids/positions, too_long, sharding, exact resume."""

import itertools

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter

from rossjax.curate.compiled import encode_example
from rossjax.curate.packing import make_loader

SEQ = 64


def _docs(n=40, seed=0, max_len=90):
    rng = np.random.default_rng(seed)
    docs = []
    for k in range(n):
        length = int(rng.integers(1, max_len))
        ids = (1000 * (k + 1) + np.arange(length)).astype(np.int32)  # unique per doc and position
        loss = (rng.random(length) < 0.6).astype(np.uint8)
        loss[-1] = 1  # every compiled example has a supervised token
        docs.append({"id": f"d{k}", "input_ids": ids, "loss_mask": loss,
                     "eligible_mask": np.ones(length, np.uint8), "provenance": {}, "turn_spans": []})
    return docs


@pytest.fixture
def shards(tmp_path):
    docs = _docs()
    for s in range(2):  # two shards, like a real curated dir
        w = ArrayRecordWriter(str(tmp_path / f"compiled-{s:05d}.array_record"), "group_size:1")
        for d in docs[s::2]:
            w.write(encode_example(d))
        w.close()
    return str(tmp_path), docs


def _unpack(batches):
    """Documents (ids tuple, loss tuple) recovered from packed rows, checking the row layout."""
    out = []
    for b in batches:
        assert set(b) == {"input_ids", "loss_mask", "eligible_mask", "segment_ids", "positions"}
        # every supervised token is eligible; padding is neither
        assert not (b["loss_mask"] & (1 - b["eligible_mask"])).any()
        assert not b["eligible_mask"][b["segment_ids"] == 0].any()
        for k, v in b.items():
            assert v.dtype == np.int32 and v.shape[1] == SEQ, k
        for ids, loss, seg, pos in zip(b["input_ids"], b["loss_mask"], b["segment_ids"], b["positions"]):
            pad = seg == 0
            assert not ids[pad].any() and not loss[pad].any() and not pos[pad].any()
            used = seg[~pad]
            # Documents are numbered 1, 2, ... left to right, padding only at the end.
            assert (np.diff(used) >= 0).all() and (not len(used) or used[0] == 1)
            assert (np.unique(used) == np.arange(1, len(np.unique(used)) + 1)).all()
            assert not pad[:len(used)].any()
            for s in np.unique(used):
                sel = seg == s
                assert (pos[sel] == np.arange(sel.sum())).all()  # positions restart per document
                out.append((tuple(ids[sel]), tuple(loss[sel])))
    return out


@pytest.mark.parametrize("strategy", ["first_fit", "best_fit"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_packing_conserves_every_supervised_token(shards, strategy, shuffle):
    path, docs = shards
    loader = make_loader([path], SEQ, 4, seed=3, shuffle=shuffle, strategy=strategy)
    got = _unpack(list(loader))
    fit = [d for d in docs if len(d["input_ids"]) <= SEQ]
    want = [(tuple(d["input_ids"]), tuple(d["loss_mask"].astype(np.int32))) for d in fit]
    assert sorted(got) == sorted(want)  # every fitting document exactly once, masks intact
    assert sum(sum(loss) for _, loss in got) == sum(int(d["loss_mask"].sum()) for d in fit)
    assert loader.stats["too_long"] == len(docs) - len(fit) > 0


def test_left_truncation_keeps_the_end(shards):
    path, docs = shards
    loader = make_loader([path], SEQ, 4, shuffle=False, truncate="left")
    got = dict((ids[0], (ids, loss)) for ids, loss in _unpack(list(loader)))
    for d in docs:
        tail_ids, tail_loss = d["input_ids"][-SEQ:], d["loss_mask"][-SEQ:]
        ids, loss = got[int(tail_ids[0])]
        assert ids == tuple(tail_ids) and loss == tuple(tail_loss.astype(np.int32))
    assert "too_long" not in loader.stats


def test_shards_partition_the_data_across_hosts(shards):
    path, docs = shards
    seen = []
    for i in range(3):
        seen.append({ids[0] // 1000 for ids, _ in _unpack(make_loader(
            [path], SEQ, 2, seed=1, shard_index=i, shard_count=3, truncate="left"))})
    assert all(not (a & b) for a, b in itertools.combinations(seen, 2))
    assert set().union(*seen) == set(range(1, len(docs) + 1))


def test_same_seed_same_batches_and_seed_matters(shards):
    path, _ = shards

    def first(seed):
        return [b["input_ids"] for b in itertools.islice(make_loader([path], SEQ, 4, seed=seed), 3)]

    a, b, c = first(7), first(7), first(8)
    assert all((x == y).all() for x, y in zip(a, b))
    assert any((x != y).any() for x, y in zip(a, c))


@pytest.mark.parametrize("strategy", ["first_fit", "best_fit"])
def test_iterator_state_restores_exactly(shards, strategy):
    path, _ = shards
    kw = dict(seed=5, num_epochs=None, strategy=strategy, truncate="left")
    it = iter(make_loader([path], SEQ, 4, **kw))
    for _ in range(5):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(5)]
    unrestored = next(iter(make_loader([path], SEQ, 4, **kw)))
    assert (unrestored["input_ids"] != expected[0]["input_ids"]).any()  # the check can fail
    fresh = iter(make_loader([path], SEQ, 4, **kw))
    fresh.set_state(state)
    for want in expected:
        got = next(fresh)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.slow
def test_iterator_state_restores_exactly_with_worker_processes(shards):
    """With grain worker processes (mp_prefetch) each worker packs its own slice, so batches
    differ from the in-process loader; but a saved state must still resume to exactly the
    batches the uninterrupted worker loader would have produced next."""
    path, docs = shards
    kw = dict(seed=5, num_epochs=None, strategy="first_fit", truncate="left", worker_count=2)
    it = iter(make_loader([path], SEQ, 4, **kw))
    for _ in range(3):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(4)]
    del it
    seen = {int(i) // 1000 for b in expected for i in b["input_ids"][b["segment_ids"] > 0]}
    assert len(seen) > 4  # real documents, from more than one worker's slice
    fresh = iter(make_loader([path], SEQ, 4, **kw))
    assert (next(fresh)["input_ids"] != expected[0]["input_ids"]).any()  # the check can fail
    fresh = iter(make_loader([path], SEQ, 4, **kw))
    fresh.set_state(state)
    for want in expected:
        got = next(fresh)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_bad_arguments_name_the_problem(shards, tmp_path):
    path, _ = shards
    with pytest.raises(ValueError, match="strategy"):
        make_loader([path], SEQ, 2, strategy="next_fit")
    with pytest.raises(ValueError, match="shard_index"):
        make_loader([path], SEQ, 2, shard_index=2, shard_count=2)
    with pytest.raises(FileNotFoundError):
        make_loader([str(tmp_path / "nope")], SEQ, 2)


def test_length_census_counts_what_the_loader_would_drop(shards):
    """The census the trainer's data.too_long policy reads agrees with the loader's own counts:
    too-long rows, and those whose last SEQ tokens hold nothing supervised."""
    from rossjax.curate.packing import length_census

    path, docs = shards
    c = length_census(path, SEQ)
    long = [d for d in docs if len(d["input_ids"]) > SEQ]
    assert c["rows"] == len(docs) and c["too_long"] == len(long) > 0
    assert c["longest"] == max(len(d["input_ids"]) for d in docs)
    assert sorted(r["id"] for r in c["long_rows"]) == sorted(d["id"] for d in long)
    loader = make_loader([path], SEQ, 4, shuffle=False)
    list(loader)
    assert loader.stats.get("too_long", 0) == c["too_long"]
    halves = [length_census(path, SEQ, shard_index=i, shard_count=2)["too_long"] for i in (0, 1)]
    assert sum(halves) == c["too_long"]
