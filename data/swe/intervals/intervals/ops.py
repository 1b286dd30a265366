def _check(interval):
    start, end = interval
    if start > end:
        raise ValueError(f"interval {interval!r} ends before it starts")
    return start, end


def merge(intervals):
    """The union of `intervals` as sorted, disjoint intervals; touching ones are joined."""
    out = []
    for start, end in sorted(_check(i) for i in intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def overlaps(a, b):
    """True when the closed intervals `a` and `b` share at least one point."""
    (a0, a1), (b0, b1) = _check(a), _check(b)
    return a0 <= b1 and b0 <= a1


def total_length(intervals):
    """The length of the union of `intervals` (overlaps counted once)."""
    return sum(end - start for start, end in merge(intervals))


def contains(intervals, point):
    """True when `point` lies in one of `intervals`."""
    return any(start <= point <= end for start, end in merge(intervals))
