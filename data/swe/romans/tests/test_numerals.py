import pytest
from romans import from_roman, is_valid, to_roman


@pytest.mark.parametrize("n, numeral", [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"),
                                        (40, "XL"), (90, "XC"), (400, "CD"), (1994, "MCMXCIV"),
                                        (3999, "MMMCMXCIX")])
def test_to_roman(n, numeral):
    assert to_roman(n) == numeral


def test_round_trip():
    assert all(from_roman(to_roman(n)) == n for n in range(1, 4000))


def test_lowercase_accepted():
    assert from_roman("xlii") == 42


def test_to_roman_range():
    with pytest.raises(ValueError):
        to_roman(0)
    with pytest.raises(ValueError):
        to_roman(4000)


def test_to_roman_type():
    with pytest.raises(TypeError):
        to_roman(True)


@pytest.mark.parametrize("bad", ["IIII", "VV", "IC", "", "ABC"])
def test_invalid(bad):
    assert not is_valid(bad)
