"""Matrices given as lists of equal-length rows of numbers."""

from gridops.matrix import determinant, identity, matmul, shape, trace, transpose

__all__ = ["determinant", "identity", "matmul", "shape", "trace", "transpose"]
