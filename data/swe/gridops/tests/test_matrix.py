import pytest
from gridops import determinant, identity, matmul, shape, trace, transpose


def test_shape():
    assert shape([[1, 2, 3], [4, 5, 6]]) == (2, 3)
    assert shape([]) == (0, 0)


def test_shape_rejects_ragged():
    with pytest.raises(ValueError):
        shape([[1, 2], [3]])


def test_identity():
    assert identity(3) == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert identity(0) == []


def test_transpose():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_matmul():
    assert matmul([[1, 2], [3, 4]], [[5, 6], [7, 8]]) == [[19, 22], [43, 50]]
    assert matmul([[1, 2, 3]], [[1], [0], [2]]) == [[7]]


def test_matmul_identity():
    m = [[2, -1], [0, 3]]
    assert matmul(m, identity(2)) == m


def test_matmul_rejects_mismatch():
    with pytest.raises(ValueError):
        matmul([[1, 2]], [[1, 2]])


def test_trace():
    assert trace([[1, 2], [3, 4]]) == 5


def test_determinant_small():
    assert determinant([[7]]) == 7
    assert determinant([[1, 2], [3, 4]]) == -2


def test_determinant_three():
    assert determinant([[2, 0, 1], [1, 3, 2], [1, 1, 2]]) == 6
    assert determinant(identity(3)) == 1


def test_determinant_rejects_non_square():
    with pytest.raises(ValueError):
        determinant([[1, 2, 3], [4, 5, 6]])
