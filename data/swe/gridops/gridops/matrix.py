def shape(m):
    """(rows, columns) of `m`; every row must have the same length."""
    if not m:
        return (0, 0)
    width = len(m[0])
    for row in m:
        if len(row) != width:
            raise ValueError("rows differ in length")
    return (len(m), width)


def identity(n):
    """The n x n identity matrix."""
    if n < 0:
        raise ValueError("size must be non-negative")
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]


def transpose(m):
    """Rows become columns."""
    rows, cols = shape(m)
    return [[m[i][j] for i in range(rows)] for j in range(cols)]


def matmul(a, b):
    """The product a @ b; the inner sizes must agree."""
    ar, ac = shape(a)
    br, bc = shape(b)
    if ac != br:
        raise ValueError(f"cannot multiply {ar}x{ac} by {br}x{bc}")
    return [[sum(a[i][k] * b[k][j] for k in range(ac)) for j in range(bc)] for i in range(ar)]


def trace(m):
    """The sum of the diagonal of a square matrix."""
    rows, cols = shape(m)
    if rows != cols:
        raise ValueError("trace needs a square matrix")
    return sum(m[i][i] for i in range(rows))


def determinant(m):
    """The determinant of a square matrix, by cofactor expansion along the first row."""
    rows, cols = shape(m)
    if rows != cols:
        raise ValueError("determinant needs a square matrix")
    if rows == 0:
        return 1
    if rows == 1:
        return m[0][0]
    total = 0
    for j in range(cols):
        minor = [row[:j] + row[j + 1:] for row in m[1:]]
        sign = -1 if j % 2 else 1
        total += sign * m[0][j] * determinant(minor)
    return total
