"""Small text helpers."""

from textkit.core import slugify, title_case, truncate, word_count

__all__ = ["slugify", "title_case", "truncate", "word_count"]
