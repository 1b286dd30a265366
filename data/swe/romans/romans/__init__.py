"""Roman numerals for 1..3999."""

from romans.numerals import from_roman, is_valid, to_roman

__all__ = ["from_roman", "is_valid", "to_roman"]
