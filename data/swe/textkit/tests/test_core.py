import pytest
from textkit import slugify, title_case, truncate, word_count


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_accents_and_separator():
    assert slugify("Crème Brûlée  recipe", sep="_") == "creme_brulee_recipe"


def test_slugify_empty():
    assert slugify("!!!") == ""


def test_truncate_short_text_unchanged():
    assert truncate("hello", 10) == "hello"


def test_truncate_cuts_with_suffix():
    assert truncate("hello world", 8) == "hello..."
    assert len(truncate("abcdefghij", 5)) == 5


def test_truncate_exact_width():
    assert truncate("hello", 5) == "hello"


def test_truncate_rejects_tiny_width():
    with pytest.raises(ValueError):
        truncate("hello", 2)


def test_word_count():
    assert word_count("The cat and the hat. Don't!") == {"the": 2, "cat": 1, "and": 1,
                                                        "hat": 1, "don't": 1}


def test_title_case_small_words():
    assert title_case("the lord of the rings") == "The Lord of the Rings"


def test_title_case_last_word_capitalized():
    assert title_case("what are you looking at") == "What Are You Looking At"
