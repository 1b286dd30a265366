def frequencies(items):
    """{item: how many times it occurs}, in order of first occurrence."""
    out = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def most_common(items, k):
    """The `k` most frequent items as (item, count) pairs; ties keep first-occurrence order."""
    if k < 0:
        raise ValueError("k must be non-negative")
    ranked = sorted(frequencies(items).items(), key=lambda kv: -kv[1])
    return ranked[:k]


def rle_encode(items):
    """Runs of equal neighbours as [item, length] pairs: "aab" -> [["a", 2], ["b", 1]]."""
    out = []
    for x in items:
        if out and out[-1][0] == x:
            out[-1][1] += 1
        else:
            out.append([x, 1])
    return out


def rle_decode(runs):
    """The inverse of rle_encode, as a list."""
    out = []
    for x, n in runs:
        if n < 1:
            raise ValueError(f"run length {n} is not positive")
        out.extend([x] * n)
    return out


def histogram(values, width):
    """{bucket start: count} of numbers in buckets [start, start + width), sorted by start."""
    if width <= 0:
        raise ValueError("width must be positive")
    out = {}
    for v in values:
        start = (v // width) * width
        out[start] = out.get(start, 0) + 1
    return dict(sorted(out.items()))
