"""Common Log Format and combined lines: the compiled (numba) scan of a block of bytes
into field spans, times and verdicts, and a line's fields as text."""

from __future__ import annotations

import re

import numpy as np
from numba import njit

from .blocks import MAX_LINE_BYTES, _Block
from .problems import _BAD_TIME, _BLANK, _MALFORMED, _NO_NS, _OK, _PARTIAL, _TOO_LONG

# Span columns: [start, end) byte offsets of each field in the block; referer and agent
# are (-1, -1) in a clf line, extras (-1, -1) when nothing follows.
_HOST, _IDENT, _USER, _TIME, _REQUEST, _STATUS, _BYTES, _REFERER, _AGENT, _EXTRA = range(10)
_SPANS = 10
_CLF_SPAN = {
    "host": _HOST,
    "ident": _IDENT,
    "user": _USER,
    "time": _TIME,
    "request": _REQUEST,
    "status": _STATUS,
    "bytes": _BYTES,
    "referer": _REFERER,
    "agent": _AGENT,
}
_MONTHS = np.array(
    [(ord(m[0]) << 16) | (ord(m[1]) << 8) | ord(m[2]) for m in
     ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")],
    dtype=np.int64,
)  # fmt: skip
_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


@njit(cache=True, nogil=True)
def _number(buf, p, count):
    """The `count` decimal digits at `p` as an int, or -1."""
    value = 0
    for k in range(count):
        c = buf[p + k]
        if c < 48 or c > 57:
            return -1
        value = value * 10 + (c - 48)
    return value


@njit(cache=True, nogil=True)
def _days_from_civil(y, m, d):
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


@njit(cache=True, nogil=True)
def _clf_ns(buf, p, q):
    """Epoch ns of the CLF time 'dd/Mon/yyyy:HH:MM:SS[.fraction] +hhmm' in [p, q), or _NO_NS."""
    if q - p < 26:
        return _NO_NS
    day, year = _number(buf, p, 2), _number(buf, p + 7, 4)
    hour, minute, second = _number(buf, p + 12, 2), _number(buf, p + 15, 2), _number(buf, p + 18, 2)
    if min(day, year, hour, minute, second) < 0:
        return _NO_NS
    if not (buf[p + 2] == 47 and buf[p + 6] == 47 and buf[p + 11] == 58):  # / / :
        return _NO_NS
    if not (buf[p + 14] == 58 and buf[p + 17] == 58):
        return _NO_NS
    code = (np.int64(buf[p + 3]) << 16) | (np.int64(buf[p + 4]) << 8) | np.int64(buf[p + 5])
    month = 0
    for k in range(12):
        if _MONTHS[k] == code:
            month = k + 1
    if month == 0 or hour > 23 or minute > 59 or second > 59 or day < 1:
        return _NO_NS
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if day > _MONTH_DAYS[month - 1] + (1 if month == 2 and leap else 0):
        return _NO_NS
    r = p + 20
    fraction = 0
    if buf[r] == 46:  # '.': a fraction of a second, up to ns
        r += 1
        digits = 0
        while r < q and 48 <= buf[r] <= 57:
            if digits == 9:
                return _NO_NS
            fraction = fraction * 10 + (buf[r] - 48)
            digits += 1
            r += 1
        if digits == 0:
            return _NO_NS
        for _ in range(9 - digits):
            fraction *= 10
    if q - r != 6 or buf[r] != 32 or not (buf[r + 1] == 43 or buf[r + 1] == 45):
        return _NO_NS
    off_h, off_m = _number(buf, r + 2, 2), _number(buf, r + 4, 2)
    if off_h < 0 or off_m < 0 or off_h > 23 or off_m > 59:
        return _NO_NS
    offset = (off_h * 3600 + off_m * 60) * (1 if buf[r + 1] == 43 else -1)
    days = _days_from_civil(np.int64(year), np.int64(month), np.int64(day))
    seconds = days * 86400 + hour * 3600 + minute * 60 + second - offset
    if seconds <= -9_000_000_000 or seconds >= 9_000_000_000:  # int64 ns: 1685..2255
        return _NO_NS
    return seconds * 1_000_000_000 + fraction


@njit(cache=True, nogil=True)
def _until(buf, p, e, stop):
    """The first byte `stop` from `p` on (or the line end `e`); -1 on a control byte."""
    while p < e and buf[p] != stop:
        if buf[p] < 32:
            return -1
        p += 1
    return p


@njit(cache=True, nogil=True)
def _token(buf, p, e):
    """End of the token at `p` (up to a space or the line end); -1 on a control byte."""
    return _until(buf, p, e, 32)


@njit(cache=True, nogil=True)
def _quoted(buf, p, e):
    """End of the quoted text that starts after the quote at p - 1 (backslash escapes);
    -1 when it is not closed or holds a control byte: `_quoted_stepwise`'s answer, with
    text free of backslashes (the usual case) checked without a branch a byte."""
    q = p
    while q < e and buf[q] != 34 and buf[q] != 92:
        q += 1
    if q < e and buf[q] == 34:
        bad = False
        for k in range(p, q):
            bad |= buf[k] < 32
        return -1 if bad else q
    return _quoted_stepwise(buf, p, e)


@njit(cache=True, nogil=True)
def _quoted_stepwise(buf, p, e):
    """`_quoted`, a byte at a time."""
    while p < e:
        c = buf[p]
        if c == 34:
            return p
        if c < 32:
            return -1
        p += 2 if c == 92 else 1
    return -1


@njit(cache=True, nogil=True)
def _bracketed(buf, p, e):
    """Where the bracketed time that starts after the '[' at p - 1 ends (its ']'), or
    -1 on a control byte or no ']': `_bracketed_stepwise`'s answer, with the usual
    26-byte time checked without a branch a byte."""
    q = p + 26
    if q < e and buf[q] == 93:
        bad = False
        for k in range(p, q):
            bad |= (buf[k] < 32) | (buf[k] == 93)
        if not bad:
            return q
    return _bracketed_stepwise(buf, p, e)


@njit(cache=True, nogil=True)
def _bracketed_stepwise(buf, p, e):
    """`_bracketed`, a byte at a time."""
    q = _until(buf, p, e, 93)
    return q if q < e else -1


@njit(cache=True, nogil=True)
def _same(buf, p, q, r):
    """Whether buf[p:q] equals buf[r:r + q - p]."""
    for k in range(q - p):
        if buf[p + k] != buf[r + k]:
            return False
    return True


@njit(cache=True, nogil=True)
def _scan_line(buf, s, e, spans):
    """Fill one line's spans; its verdict (_OK, _BLANK, ...). Once the client, time and
    request are read, a field after them that cannot be read makes the line _PARTIAL,
    with that field and those after it (-1, -1)."""
    blank = True
    for p in range(s, e):
        if buf[p] != 32 and buf[p] != 9:
            blank = False
            break
    if blank:
        return _BLANK
    if e - s > MAX_LINE_BYTES:
        return _TOO_LONG
    p = s
    for f in range(3):  # host ident user
        q = _token(buf, p, e)
        if q <= p or q >= e:
            return _MALFORMED
        spans[f, 0], spans[f, 1] = p, q
        p = q + 1
    if buf[p] != 91:  # '['
        return _MALFORMED
    q = _bracketed(buf, p + 1, e)
    if q < 0 or q + 2 >= e or buf[q + 1] != 32 or buf[q + 2] != 34:
        return _MALFORMED
    spans[_TIME, 0], spans[_TIME, 1] = p + 1, q
    p = q + 3
    q = _quoted(buf, p, e)
    if q < 0 or q + 1 >= e or buf[q + 1] != 32:
        return _MALFORMED
    spans[_REQUEST, 0], spans[_REQUEST, 1] = p, q
    for f in range(_STATUS, _SPANS):
        spans[f, 0] = spans[f, 1] = -1
    p = q + 2
    q = _token(buf, p, e)
    if q - p != 3 or _number(buf, p, 3) < 0:
        return _PARTIAL
    spans[_STATUS, 0], spans[_STATUS, 1] = p, q
    if q >= e:
        return _PARTIAL
    p = q + 1
    q = _token(buf, p, e)
    if q < 0:
        return _PARTIAL
    if q <= p or not (q - p == 1 and buf[p] == 45):  # '-' or digits
        for k in range(p, q if q > p else p + 1):
            if k >= e or buf[k] < 48 or buf[k] > 57:
                return _PARTIAL
    spans[_BYTES, 0], spans[_BYTES, 1] = p, q
    p = q
    if p < e and p + 1 < e and buf[p + 1] == 34:  # ' "referer" "agent"'
        q = _quoted(buf, p + 2, e)
        if q >= 0 and q + 2 < e and buf[q + 1] == 32 and buf[q + 2] == 34:
            spans[_REFERER, 0], spans[_REFERER, 1] = p + 2, q
            r = _quoted(buf, q + 3, e)
            if r < 0:
                return _PARTIAL
            spans[_AGENT, 0], spans[_AGENT, 1] = q + 3, r
            p = r + 1
    if p < e:  # more fields: a custom format's extras
        if buf[p] != 32 or p + 1 >= e:
            return _PARTIAL
        quoted = False  # quotes must pair up, as in the fields before
        k = p + 1
        while k < e:
            c = buf[k]
            if c < 32 and c != 9:
                return _PARTIAL
            if c == 34:
                quoted = not quoted
            k += 2 if c == 92 and quoted else 1
        if quoted:
            return _PARTIAL
        spans[_EXTRA, 0], spans[_EXTRA, 1] = p + 1, e
    return _OK


@njit(cache=True, nogil=True)
def _scan_clf(buf, starts, ends, spans, times, verdicts):
    """Scan every line [starts[i], ends[i]) of `buf`: spans, epoch ns, verdicts."""
    last_lo, last_hi, last_ns = 0, -1, _NO_NS  # the last time read: lines share seconds
    for i in range(starts.size):
        verdict = _scan_line(buf, starts[i], ends[i], spans[i])
        times[i] = _NO_NS
        if verdict == _OK or verdict == _PARTIAL:
            lo, hi = spans[i, _TIME, 0], spans[i, _TIME, 1]
            if hi - lo == last_hi - last_lo and _same(buf, lo, hi, last_lo):
                times[i] = last_ns
            else:
                times[i] = _clf_ns(buf, lo, hi)
                last_lo, last_hi, last_ns = lo, hi, times[i]
            if times[i] == _NO_NS:
                verdict = _BAD_TIME
        verdicts[i] = verdict


@njit(cache=True, nogil=True)
def _span_ints(buf, lo, hi, out):
    """Each span as a decimal integer 1..10**18 - 1, or 0 where it is not one."""
    for i in range(lo.size):
        n = hi[i] - lo[i]
        value = _number(buf, lo[i], n) if 0 < n <= 18 else 0
        out[i] = value if value > 0 else 0


@njit(cache=True, nogil=True)
def _request_parts(buf, lo, hi, out):
    """out[i]: the [start, end) spans of request i's method, path and protocol, or
    empty spans unless the request is three parts parted by single spaces."""
    for i in range(lo.size):
        first = second = -1
        count = 0
        for p in range(lo[i], hi[i]):
            if buf[p] == 32:
                count += 1
                if count == 1:
                    first = p
                elif count == 2:
                    second = p
        if count == 2:
            out[i, 0, 0], out[i, 0, 1] = lo[i], first
            out[i, 1, 0], out[i, 1, 1] = first + 1, second
            out[i, 2, 0], out[i, 2, 1] = second + 1, hi[i]
        else:
            out[i, :, :] = -1


def _scan(block: _Block) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(block.starts)
    spans = np.empty((n, _SPANS, 2), dtype=np.int64)
    times = np.empty(n, dtype=np.int64)
    verdicts = np.empty(n, dtype=np.int8)
    buf = np.frombuffer(block.data, dtype=np.uint8)
    if n:
        _scan_clf(buf, block.starts, block.ends, spans, times, verdicts)
    return spans, times, verdicts


_EXTRA_TOKEN = re.compile(r'(?:([A-Za-z_][\w.-]*)=)?("(?:[^"\\]|\\.)*"|\S+)')


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _extras(text: str) -> dict[str, str]:
    """The fields after a clf or combined line's own: extra1, extra2, ..., and name=value."""
    out: dict[str, str] = {}
    for number, match in enumerate(_EXTRA_TOKEN.finditer(text), 1):
        value = _unquote(match[2])
        out[f"extra{number}"] = value
        if match[1]:
            out[match[1]] = value
    return out


def _texts(data: bytes, lo: np.ndarray, hi: np.ndarray) -> list[str]:
    """The spans `data[lo[i]:hi[i]]` as text ("" where lo is -1)."""
    return [
        data[a:b].decode("utf-8", "backslashreplace") if a >= 0 else ""
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True)
    ]


_PARTS = ("method", "path", "protocol")


def _columns(data: bytes, spans: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """The named fields of the lines whose spans are given, as text: an object array
    (lines, names). Only the asked spans are decoded."""
    out = np.empty((len(spans), len(names)), dtype=object)
    parts = None
    extras: list[dict[str, str]] | None = None
    for k, name in enumerate(names):
        if name in _CLF_SPAN:
            f = _CLF_SPAN[name]
            out[:, k] = _texts(data, spans[:, f, 0], spans[:, f, 1])
        elif name in _PARTS:
            if parts is None:
                parts = np.empty((len(spans), 3, 2), dtype=np.int64)
                buf = np.frombuffer(data, dtype=np.uint8)
                _request_parts(buf, spans[:, _REQUEST, 0], spans[:, _REQUEST, 1], parts)
            j = _PARTS.index(name)
            out[:, k] = _texts(data, parts[:, j, 0], parts[:, j, 1])
        else:
            if extras is None:
                lo, hi = spans[:, _EXTRA, 0], spans[:, _EXTRA, 1]
                extras = [_extras(text) if text else {} for text in _texts(data, lo, hi)]
            out[:, k] = [fields.get(name, "") for fields in extras]
    return out


def _clf_fields(data: bytes, spans: np.ndarray) -> dict[str, str]:
    """One clf or combined line's fields as text (referer and agent "" when absent)."""

    def text(f: int) -> str:
        lo, hi = spans[f]
        return data[lo:hi].decode("utf-8", "backslashreplace") if lo >= 0 else ""

    fields = {name: text(f) for name, f in _CLF_SPAN.items()}
    parts = fields["request"].split(" ")
    method, path, protocol = parts if len(parts) == 3 else ("", "", "")
    fields.update(method=method, path=path, protocol=protocol)
    if spans[_EXTRA, 0] >= 0:
        for name, value in _extras(text(_EXTRA)).items():
            fields.setdefault(name, value)
    return fields
