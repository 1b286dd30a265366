"""Closed intervals [start, end] given as (start, end) pairs."""

from intervals.ops import contains, merge, overlaps, total_length

__all__ = ["contains", "merge", "overlaps", "total_length"]
