_TABLE = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
          (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def to_roman(n):
    """The numeral of `n`, 1 <= n <= 3999."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError("to_roman takes an int")
    if not 1 <= n <= 3999:
        raise ValueError(f"{n} is outside 1..3999")
    out = []
    for value, numeral in _TABLE:
        count, n = divmod(n, value)
        out.append(numeral * count)
    return "".join(out)


def from_roman(numeral):
    """The value of a canonical numeral ("XIV" -> 14); a non-canonical one is refused."""
    numeral = numeral.upper()
    total, i = 0, 0
    for value, symbol in _TABLE:
        while numeral.startswith(symbol, i):
            total += value
            i += len(symbol)
    if i != len(numeral) or not 1 <= total <= 3999 or to_roman(total) != numeral:
        raise ValueError(f"{numeral!r} is not a canonical roman numeral")
    return total


def is_valid(numeral):
    """True when `numeral` is a canonical numeral of 1..3999."""
    try:
        from_roman(numeral)
    except ValueError:
        return False
    return True
