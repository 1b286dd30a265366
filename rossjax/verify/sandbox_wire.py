"""The wire format between a sandboxed program and its checker: plain values only.

Text of this file runs inside the sandbox (it is prepended to the bootstrap, sandbox_boot.py),
so it imports nothing: `json` alone would cost ~20 ms per sandbox start (it pulls in `re`).

`wire_enc(value)` -> bytes accepts exact builtin types only: None, bool, int, float (nan, inf,
-0.0 exact), complex, str (lone surrogates kept), bytes, list, tuple, dict, set, frozenset,
nested at most `WIRE_DEPTH` deep. Anything else — a class of the program's own, a subclass of a
builtin, a generator — raises `WireRefused` naming its type. `wire_dec(bytes)` rebuilds the
value from builtins only and raises `WireError` on anything malformed. The checker decodes what
the program sends, so whatever the program does to its own copy of this code (monkeypatching,
writing raw bytes), the checker only ever compares plain builtin values, whose `__eq__` the
program cannot change. Messages are framed as a 4-byte big-endian length and the payload.
"""

WIRE_DEPTH = 100


class WireError(Exception):
    """Malformed bytes on the wire."""


class WireRefused(Exception):
    """A value of a type that cannot cross the wire (the program's own class, a subclass...)."""


def _wire_n(n):
    return n.to_bytes(4, "big")


def wire_enc(x, _d=0, _int=int, _float=float, _str=str, _bytes=bytes, _list=list,
             _tuple=tuple, _dict=dict, _set=set, _fset=frozenset, _complex=complex,
             _type=type, _bool=bool, _none=type(None)):
    # Builtins are bound as defaults: the program may rebind the names in builtins.
    if _d > WIRE_DEPTH:
        raise WireRefused(f"a value nested more than {WIRE_DEPTH} deep")
    t = _type(x)
    if t is _none:
        return b"N"
    if t is _bool:
        return b"T" if x else b"F"
    if t is _int:
        s = _int.__format__(x, "x").encode()
        return b"i" + _wire_n(len(s)) + s
    if t is _float:
        s = _float.hex(x).encode()
        return b"f" + _wire_n(len(s)) + s
    if t is _complex:
        return b"c" + wire_enc(x.real, _d + 1) + wire_enc(x.imag, _d + 1)
    if t is _str:
        s = _str.encode(x, "utf-8", "surrogatepass")
        return b"s" + _wire_n(len(s)) + s
    if t is _bytes:
        return b"b" + _wire_n(len(x)) + x
    if t is _list or t is _tuple or t is _set or t is _fset:
        tag = b"l" if t is _list else b"t" if t is _tuple else b"S" if t is _set else b"Z"
        items = _list(_tuple.__iter__(x) if t is _tuple else _list.__iter__(x) if t is _list
                      else _set.__iter__(x) if t is _set else _fset.__iter__(x))
        return tag + _wire_n(len(items)) + b"".join([wire_enc(v, _d + 1) for v in items])
    if t is _dict:
        items = _list(_dict.items(x))
        return b"d" + _wire_n(len(items)) + b"".join(
            [wire_enc(k, _d + 1) + wire_enc(v, _d + 1) for k, v in items])
    raise WireRefused(f"a value of type {t.__module__}.{t.__qualname__} (only exact builtin "
                      "types: None, bool, int, float, complex, str, bytes, list, tuple, dict, "
                      "set, frozenset)")


def wire_dec(data):
    """The value `data` encodes (exactly one, nothing left over)."""
    try:
        v, i = _wire_dec(memoryview(data), 0, 0)
    except (IndexError, ValueError, TypeError, UnicodeDecodeError, RecursionError,
            OverflowError) as e:
        raise WireError(f"malformed message ({type(e).__name__}: {e})") from None
    if i != len(data):
        raise WireError("malformed message (trailing bytes)")
    return v


def _wire_dec(m, i, d):
    if d > WIRE_DEPTH:
        raise ValueError("nested too deeply")
    tag = m[i]
    i += 1
    if tag == 78:  # N
        return None, i
    if tag == 84:  # T
        return True, i
    if tag == 70:  # F
        return False, i
    if tag == 99:  # c
        re, i = _wire_dec(m, i, d + 1)
        im, i = _wire_dec(m, i, d + 1)
        if type(re) is not float or type(im) is not float:
            raise ValueError("complex parts must be floats")
        return complex(re, im), i
    n = int.from_bytes(m[i:i + 4], "big")
    if len(m) < i + 4:
        raise ValueError("truncated length")
    i += 4
    if tag in (105, 102, 115, 98):  # i f s b
        raw = bytes(m[i:i + n])
        if len(raw) != n:
            raise ValueError("truncated payload")
        i += n
        if tag == 105:
            return int(raw.decode("ascii"), 16), i
        if tag == 102:
            return float.fromhex(raw.decode("ascii")), i
        if tag == 115:
            return raw.decode("utf-8", "surrogatepass"), i
        return raw, i
    if n > len(m) - i:  # every item takes at least one byte
        raise ValueError("item count larger than the message")
    if tag == 100:  # d
        out = {}
        for _ in range(n):
            k, i = _wire_dec(m, i, d + 1)
            v, i = _wire_dec(m, i, d + 1)
            out[k] = v
        return out, i
    items = []
    for _ in range(n):
        v, i = _wire_dec(m, i, d + 1)
        items.append(v)
    if tag == 108:  # l
        return items, i
    if tag == 116:  # t
        return tuple(items), i
    if tag == 83:  # S
        return set(items), i
    if tag == 90:  # Z
        return frozenset(items), i
    raise ValueError(f"unknown tag {tag}")


def wire_send(fd, payload, _write=None):
    import posix
    data = _wire_n(len(payload)) + payload
    write = _write or posix.write
    view = memoryview(data)
    while view:
        view = view[write(fd, view):]


def wire_recv(fd, cap):
    """One framed message from fd; None at EOF before a message; WireError if over `cap`."""
    import posix
    head = _wire_read(fd, 4, posix.read)
    if head is None:
        return None
    n = int.from_bytes(head, "big")
    if n > cap:
        raise WireError(f"message of {n} bytes is over the {cap}-byte limit")
    body = _wire_read(fd, n, posix.read)
    if body is None:
        raise WireError("the other side closed the channel mid-message")
    return body


def _wire_read(fd, n, read):
    parts, got = [], 0
    while got < n:
        chunk = read(fd, min(n - got, 1 << 20))
        if not chunk:
            if got:
                raise WireError("the other side closed the channel mid-message")
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
