import pytest
from tally import frequencies, histogram, most_common, rle_decode, rle_encode


def test_frequencies():
    assert frequencies("abca") == {"a": 2, "b": 1, "c": 1}
    assert frequencies([]) == {}


def test_most_common():
    assert most_common("abcabca", 2) == [("a", 3), ("b", 2)]


def test_most_common_ties_keep_first_seen():
    assert most_common("xyyx", 2) == [("x", 2), ("y", 2)]


def test_most_common_rejects_negative():
    with pytest.raises(ValueError):
        most_common("ab", -1)


def test_rle_encode():
    assert rle_encode("aaabcc") == [["a", 3], ["b", 1], ["c", 2]]
    assert rle_encode("") == []


def test_rle_round_trip():
    data = [1, 1, 2, 3, 3, 3, 1]
    assert rle_decode(rle_encode(data)) == data


def test_rle_decode_rejects_empty_run():
    with pytest.raises(ValueError):
        rle_decode([["a", 0]])


def test_histogram():
    assert histogram([0, 1, 4, 5, 9, 10], 5) == {0: 3, 5: 2, 10: 1}


def test_histogram_negative_values():
    assert histogram([-1, -5, 2], 5) == {-5: 2, 0: 1}


def test_histogram_rejects_bad_width():
    with pytest.raises(ValueError):
        histogram([1], 0)
