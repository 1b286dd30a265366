"""Counting over sequences of hashable items."""

from tally.counts import frequencies, histogram, most_common, rle_decode, rle_encode

__all__ = ["frequencies", "histogram", "most_common", "rle_decode", "rle_encode"]
