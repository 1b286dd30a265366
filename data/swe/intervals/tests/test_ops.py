import pytest
from intervals import contains, merge, overlaps, total_length


def test_merge_overlapping():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]


def test_merge_touching_and_unsorted():
    assert merge([(5, 7), (1, 5)]) == [(1, 7)]


def test_merge_nested():
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]


def test_merge_empty():
    assert merge([]) == []


def test_merge_rejects_reversed():
    with pytest.raises(ValueError):
        merge([(3, 1)])


def test_overlaps():
    assert overlaps((1, 5), (5, 9))
    assert not overlaps((1, 4), (5, 9))


def test_total_length():
    assert total_length([(0, 2), (1, 4), (10, 11)]) == 5


def test_contains():
    assert contains([(1, 3), (7, 9)], 3)
    assert not contains([(1, 3), (7, 9)], 5)
