"""Access logs in, trace chunks out: the requests of a real log as the replay reads them.

    reader = LogReader("access.log", identity="user")     # the format is detected
    for chunk in reader:                                    # trace frames, each sorted by time
        ...                                                 # time, identity, cost, replica
    print(reader.problems.summary())                        # complete once iteration ends

    trace, problems = read("access.log.gz")                 # a small log, all at once

Formats (`FORMATS`), named with `format=` or detected from the first non-blank lines:

- ``clf``: Common Log Format, ``host ident user [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1"
  200 2326``; fields ``host``, ``ident``, ``user``, ``time``, ``request`` (and its parts
  ``method``, ``path``, ``protocol``), ``status``, ``bytes``;
- ``combined``: the same plus ``"referer" "agent"`` (Apache and nginx). Tokens after these
  (a custom format's extra fields) are fields ``extra1``, ``extra2``, ..., and a token
  ``name=value`` or ``name="value"`` is also the field ``name``. The time may carry a
  fraction of a second (``13:55:36.123``);
- ``jsonl``: one JSON object per line; a dotted name (``headers.x-api-key``) reaches into
  nested objects. Numbers with a fraction are read as `decimal.Decimal`, so times stay exact;
- ``csv``: a header line naming the columns, then one record per line (a quoted field
  cannot hold a line break).

A gzip-compressed log is read as it is. A file that is not a log at all (empty, binary,
prose) raises one `LogFormatError` before any chunk is produced, and so does a named
identity, cost or time field that the log does not have.

Identity: the field named by ``identity``; by default the client address (``host``, or
for jsonl and csv the first present of `ADDRESS_FIELDS`). A value that is an IP address
counts as `ratelimit.keys.address_identity` says, exactly as the HTTP layer counts it:
IPv6 per /64 (``ipv6_prefix``), IPv4 as itself. A missing value (empty or ``-``) makes the
line a bad line. Cost: 1 by default; or the integer field named by ``cost``; or
``cost(fields)`` for a callable that takes the line's fields (a dict of their text, for
jsonl the decoded object) and returns an int. A cost that is not an integer >= 1 (or a
callable that raises ValueError, TypeError, KeyError, IndexError or ArithmeticError)
makes the line a bad line.

Time: any UTC offset; ISO 8601 (``Z``, ``+01:00``; without an offset: UTC), CLF times, and
for jsonl and csv Unix epoch numbers too, by magnitude: below 1e11 seconds, below 1e14
milliseconds, below 1e17 microseconds, else nanoseconds. ``time`` in the trace is Unix
epoch seconds, as a float whose ``floor(time * 1000)`` is the line's exact millisecond.

Bad lines are counted per reason (`Problems.counts`: "malformed", "truncated" (the last
line, cut off without its newline), "too long" (over `MAX_LINE_BYTES`), "bad time",
"no time", "no identity", "bad cost", "blank") with the first few line numbers and
excerpts, never dropped silently and never fatal: ``parsed + skipped == lines``.

Order: lines from several servers merged into one file are out of order. Lines are held
back until they are ``reorder_s`` seconds older than the newest line seen, then released
sorted by time (ties in file order), so a chunk is sorted and, while no line is later than
that, the chunks together are the whole log sorted. A line more than ``reorder_s`` older
than a line before it is *late*: it is not lost but released with the next chunk, behind
requests already released, so the replay decides it late, as a limiter would a request
whose log line arrived late; `Problems.late` counts such lines, with examples. Memory
stays bounded by one block of the file (`BLOCK_BYTES`), ``chunk_lines`` rows, the lines
within ``reorder_s`` of the newest, and one entry per distinct identity.

Speed: Common Log Format is parsed by one compiled (numba) scan per block of bytes, and
identities are told apart by a compiled hash table, about a million lines a second end
to end; jsonl and csv are parsed line by line in Python, several times slower.
"""

from __future__ import annotations

import csv
import decimal
import gzip
import json
import numbers
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd
from numba import njit

from ratelimit import keys, validation

from . import simulation
from .traffic import _floor_ms_exact

__all__ = [
    "FORMATS",
    "LogFormatError",
    "LogReader",
    "Problems",
    "detect_format",
    "read",
]

FORMATS = ("clf", "combined", "jsonl", "csv")
"""The log formats understood, as ``format=`` names them."""

CLF_FIELDS = (
    "host",
    "ident",
    "user",
    "time",
    "request",
    "method",
    "path",
    "protocol",
    "status",
    "bytes",
    "referer",
    "agent",
)
"""The fields of a clf or combined line (``referer`` and ``agent`` empty in clf)."""

ADDRESS_FIELDS = (
    "remote_addr",
    "client_ip",
    "clientip",
    "client_addr",
    "remote_ip",
    "ip",
    "c-ip",
    "remote_host",
    "host",
    "client",
    "address",
)
"""Where a jsonl or csv log keeps the client address: the default identity is the first."""

TIME_FIELDS = ("time", "timestamp", "@timestamp", "ts", "time_iso8601", "time_local", "datetime")
"""Where a jsonl or csv log keeps the time: the default is the first present."""

BLOCK_BYTES = 16 * 2**20
"""Bytes read and parsed at a time."""

MAX_LINE_BYTES = 2**20
"""Longer lines are bad lines ("too long"), skipped without being held in memory."""

SAMPLE_LINES = 20
"""Non-blank lines read to detect the format and the fields."""

DETECT_SHARE = 0.25
"""A format is detected when at least this share of the sample lines fit it (the rest
are bad lines)."""

EXAMPLES_PER_REASON = 5
"""Bad lines kept as examples, per reason (and late lines)."""

EXCERPT_CHARS = 120

PROGRESS_MIN_BYTES = 64 * 2**20
"""Reads of at least this many bytes show a progress bar (unless silenced)."""

MALFORMED = "malformed"
TRUNCATED = "truncated"
TOO_LONG = "too long"
BAD_TIME = "bad time"
NO_TIME = "no time"
NO_IDENTITY = "no identity"
BAD_COST = "bad cost"
BLANK = "blank"

_CALLABLE_ERRORS = (ValueError, TypeError, KeyError, IndexError, ArithmeticError)
_NS = 1_000_000_000


class LogFormatError(ValueError):
    """The file is not a log this module reads (empty, binary, unknown format), or it
    lacks a field that was named."""


# --- what went wrong -----------------------------------------------------------------


@dataclass
class Problems:
    """The lines that did not become requests, and the lines that came late.

    ``lines``: lines read (blank and bad ones included; a csv header is not counted);
    ``parsed``: lines that became requests; ``counts``: reason -> bad lines;
    ``examples``: (1-based line number, reason, excerpt), the first few per reason;
    ``late``: lines more than ``reorder_s`` older than a line before them (still
    requests, decided late); ``late_examples``: the first few, as examples are.
    """

    lines: int = 0
    parsed: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    examples: list[tuple[int, str, str]] = field(default_factory=list)
    late: int = 0
    late_examples: list[tuple[int, str, str]] = field(default_factory=list)
    reorder_s: float = 300.0

    @property
    def skipped(self) -> int:
        """Bad lines: ``lines - parsed``."""
        return sum(self.counts.values())

    def summary(self) -> str:
        """A few lines for people: what was skipped and why, the first examples, and
        how many lines came late."""
        if not self.skipped:
            out = [f"all {self.lines:,} lines parsed"]
        else:
            parts = []
            for reason, count in sorted(self.counts.items(), key=lambda kv: -kv[1]):
                where = [line for line, why, _ in self.examples if why == reason]
                more = ", ..." if count > len(where) else ""
                label = "line" if count == 1 else "lines"
                parts.append(f"{count:,} {reason} ({label} {', '.join(map(str, where))}{more})")
            out = [f"{self.skipped:,} of {self.lines:,} lines skipped: " + ", ".join(parts)]
            out += [f"  line {line} ({why}): {text}" for line, why, text in self.examples[:10]]
        if self.late:
            where = ", ".join(str(line) for line, _, _ in self.late_examples)
            more = ", ..." if self.late > len(self.late_examples) else ""
            out.append(
                f"{self.late:,} lines more than {self.reorder_s:g} s older than a line before "
                f"them (lines {where}{more}): decided late, not dropped"
            )
        return "\n".join(out)

    def _bad(self, reason: str, lines: np.ndarray, excerpt: Callable[[int], str]) -> None:
        """Count `lines` (1-based numbers, ascending) as bad for `reason`; `excerpt(i)`
        gives the text of the i-th of them."""
        if not len(lines):
            return
        kept = sum(1 for _, why, _ in self.examples if why == reason)
        self.counts[reason] = self.counts.get(reason, 0) + len(lines)
        for i in range(min(len(lines), EXAMPLES_PER_REASON - kept)):
            self.examples.append((int(lines[i]), reason, excerpt(i)))
        self.examples.sort(key=lambda example: example[0])


def _excerpt(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    return text[:EXCERPT_CHARS]


# --- the compiled scan of Common Log Format --------------------------------------------

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
# Line verdicts (the scan gives the first five), and the reasons they stand for.
_OK, _BLANK, _MALFORMED, _BAD_TIME, _TOO_LONG, _NO_TIME, _NO_IDENTITY, _BAD_COST = range(8)
_TRUNCATED = -1
_REASONS = {
    _BLANK: BLANK,
    _MALFORMED: MALFORMED,
    _BAD_TIME: BAD_TIME,
    _TOO_LONG: TOO_LONG,
    _NO_TIME: NO_TIME,
    _NO_IDENTITY: NO_IDENTITY,
    _BAD_COST: BAD_COST,
    _TRUNCATED: TRUNCATED,
}
_MONTHS = np.array(
    [(ord(m[0]) << 16) | (ord(m[1]) << 8) | ord(m[2]) for m in
     ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")],
    dtype=np.int64,
)  # fmt: skip
_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)
_NO_NS = np.iinfo(np.int64).min  # "not a time"
_HEADER = 99  # a csv header's verdict: neither a request nor a bad line


@njit(cache=True)
def _number(buf, p, count):
    """The `count` decimal digits at `p` as an int, or -1."""
    value = 0
    for k in range(count):
        c = buf[p + k]
        if c < 48 or c > 57:
            return -1
        value = value * 10 + (c - 48)
    return value


@njit(cache=True)
def _days_from_civil(y, m, d):
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


@njit(cache=True)
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


@njit(cache=True)
def _token(buf, p, e):
    """End of the token at `p` (up to a space or the line end); -1 on a control byte."""
    while p < e and buf[p] != 32:
        if buf[p] < 32:
            return -1
        p += 1
    return p


@njit(cache=True)
def _quoted(buf, p, e):
    """End of the quoted text that starts after the quote at p - 1 (backslash escapes);
    -1 when it is not closed or holds a control byte."""
    while p < e:
        c = buf[p]
        if c == 34:
            return p
        if c < 32:
            return -1
        p += 2 if c == 92 else 1
    return -1


@njit(cache=True)
def _scan_line(buf, s, e, spans):
    """Fill one line's spans; its verdict (_OK, _BLANK, ...)."""
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
    q = p + 1
    while q < e and buf[q] != 93:  # ']'
        if buf[q] < 32:
            return _MALFORMED
        q += 1
    if q + 2 >= e or buf[q + 1] != 32 or buf[q + 2] != 34:
        return _MALFORMED
    spans[_TIME, 0], spans[_TIME, 1] = p + 1, q
    p = q + 3
    q = _quoted(buf, p, e)
    if q < 0 or q + 1 >= e or buf[q + 1] != 32:
        return _MALFORMED
    spans[_REQUEST, 0], spans[_REQUEST, 1] = p, q
    p = q + 2
    q = _token(buf, p, e)
    if q - p != 3 or _number(buf, p, 3) < 0 or q >= e:
        return _MALFORMED
    spans[_STATUS, 0], spans[_STATUS, 1] = p, q
    p = q + 1
    q = _token(buf, p, e)
    if q <= p or not (q - p == 1 and buf[p] == 45):  # '-' or digits
        for k in range(p, q if q > p else p + 1):
            if buf[k] < 48 or buf[k] > 57:
                return _MALFORMED
    spans[_BYTES, 0], spans[_BYTES, 1] = p, q
    p = q
    spans[_REFERER, 0] = spans[_REFERER, 1] = spans[_AGENT, 0] = spans[_AGENT, 1] = -1
    spans[_EXTRA, 0] = spans[_EXTRA, 1] = -1
    if p < e and p + 1 < e and buf[p + 1] == 34:  # ' "referer" "agent"'
        q = _quoted(buf, p + 2, e)
        if q >= 0 and q + 2 < e and buf[q + 1] == 32 and buf[q + 2] == 34:
            r = _quoted(buf, q + 3, e)
            if r >= 0:
                spans[_REFERER, 0], spans[_REFERER, 1] = p + 2, q
                spans[_AGENT, 0], spans[_AGENT, 1] = q + 3, r
                p = r + 1
    if p < e:  # more fields: a custom format's extras
        if buf[p] != 32 or p + 1 >= e:
            return _MALFORMED
        quoted = False  # quotes must pair up, as in the fields before
        k = p + 1
        while k < e:
            c = buf[k]
            if c < 32 and c != 9:
                return _MALFORMED
            if c == 34:
                quoted = not quoted
            k += 2 if c == 92 and quoted else 1
        if quoted:
            return _MALFORMED
        spans[_EXTRA, 0], spans[_EXTRA, 1] = p + 1, e
    return _OK


@njit(cache=True)
def _scan_clf(buf, starts, ends, spans, times, verdicts):
    """Scan every line [starts[i], ends[i]) of `buf`: spans, epoch ns, verdicts."""
    for i in range(starts.size):
        verdict = _scan_line(buf, starts[i], ends[i], spans[i])
        times[i] = _NO_NS
        if verdict == _OK:
            times[i] = _clf_ns(buf, spans[i, _TIME, 0], spans[i, _TIME, 1])
            if times[i] == _NO_NS:
                verdict = _BAD_TIME
        verdicts[i] = verdict


@njit(cache=True)
def _fnv(buf, lo, hi):
    """64-bit FNV-1a of buf[lo:hi]."""
    h = np.uint64(14695981039346656037)
    for p in range(lo, hi):
        h = (h ^ np.uint64(buf[p])) * np.uint64(1099511628211)
    return h


@njit(cache=True)
def _span_hashes(buf, lo, hi, out):
    for i in range(lo.size):
        out[i] = _fnv(buf, lo[i], hi[i])


@njit(cache=True)
def _find(buf, lo, hi, keys, table, pool, start, length, out):
    """out[i]: the slot whose bytes equal buf[lo[i]:hi[i]], or -1. `table` is an open-
    addressing hash table (linear probing) of slots by hash; equal hashes are told
    apart by their bytes, so a collision costs a probe, never a wrong slot."""
    mask = np.uint64(table.size - 1)
    for i in range(lo.size):
        h = _fnv(buf, lo[i], hi[i])
        j = np.int64(h & mask)
        out[i] = -1
        while table[j] >= 0:
            s = table[j]
            if keys[j] == h and length[s] == hi[i] - lo[i]:
                k = 0
                while k < length[s] and buf[lo[i] + k] == pool[start[s] + k]:
                    k += 1
                if k == length[s]:
                    out[i] = s
                    break
            j = np.int64((j + 1) & (table.size - 1))


@njit(cache=True)
def _insert(keys, table, hashes, slots):
    """Put `slots` into the table under their `hashes`."""
    mask = np.uint64(table.size - 1)
    for i in range(slots.size):
        j = np.int64(hashes[i] & mask)
        while table[j] >= 0:
            j = np.int64((j + 1) & (table.size - 1))
        keys[j] = hashes[i]
        table[j] = slots[i]


@njit(cache=True)
def _span_ints(buf, lo, hi, out):
    """Each span as a decimal integer 1..10**18 - 1, or 0 where it is not one."""
    for i in range(lo.size):
        n = hi[i] - lo[i]
        value = _number(buf, lo[i], n) if 0 < n <= 18 else 0
        out[i] = value if value > 0 else 0


# --- identities -----------------------------------------------------------------------

_MAYBE_IP = re.compile(r"[0-9A-Fa-f:.]+(%[^\s%]+)?")


class _Identities:
    """Dense codes for identities, shared by all chunks: raw text -> identity -> code.

    A raw value that is an IP address counts as its `keys.address_identity`, so the
    addresses of one IPv6 /64 share one code."""

    def __init__(self, ipv6_prefix: int) -> None:
        self.ipv6_prefix = ipv6_prefix
        self.by_raw: dict[str, int] = {}
        self.by_name: dict[str, int] = {}
        self.names: list[str] = []
        self._array = np.empty(0, dtype=object)
        # Raws met so far, by slot: their bytes (in one pool), hashes and codes, and a
        # hash table of slots.
        self._pool = np.empty(0, dtype=np.uint8)
        self._start = np.empty(0, dtype=np.int64)
        self._length = np.empty(0, dtype=np.int64)
        self._slot_hash = np.empty(0, dtype=np.uint64)
        self._slot_code = np.empty(0, dtype=np.int64)
        self._keys = np.zeros(1024, dtype=np.uint64)
        self._table = np.full(1024, -1, dtype=np.int64)

    def name(self, raw: str) -> str:
        if len(raw) <= 64 and _MAYBE_IP.fullmatch(raw):
            try:
                return keys.address_identity(raw, self.ipv6_prefix)
            except ValueError:
                pass
        return raw

    def codes(self, raws: list[str]) -> np.ndarray:
        out = np.empty(len(raws), dtype=np.int64)
        for i, raw in enumerate(raws):
            code = self.by_raw.get(raw)
            if code is None:
                name = self.name(raw)
                code = self.by_name.setdefault(name, len(self.names))
                if code == len(self.names):
                    self.names.append(name)
                self.by_raw[raw] = code
            out[i] = code
        return out

    def span_codes(self, buf: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Codes of the raw identities `buf[lo[i]:hi[i]]`, found in the hash table of
        the raws seen so far (compiled); only raws never seen go through `codes`."""
        slots = np.empty(len(lo), dtype=np.int64)
        self._find(buf, lo, hi, slots)
        missing = np.flatnonzero(slots < 0)
        if len(missing):
            new: dict[bytes, int] = {}
            for i in missing.tolist():
                new.setdefault(buf[lo[i] : hi[i]].tobytes(), i)
            self._add(buf, np.fromiter(new.values(), np.int64, len(new)), lo, hi)
            found = np.empty(len(missing), dtype=np.int64)
            self._find(buf, lo[missing], hi[missing], found)
            slots[missing] = found
        return self._slot_code[slots]

    def _find(self, buf: np.ndarray, lo: np.ndarray, hi: np.ndarray, out: np.ndarray) -> None:
        _find(buf, lo, hi, self._keys, self._table, self._pool, self._start, self._length, out)

    def _add(self, buf: np.ndarray, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """New slots for the raws at `rows`: their bytes, hashes and codes."""
        pieces = [buf[lo[i] : hi[i]] for i in rows]
        texts = [p.tobytes().decode("utf-8", "backslashreplace") for p in pieces]
        lengths = (hi[rows] - lo[rows]).astype(np.int64)
        hashes = np.empty(len(rows), dtype=np.uint64)
        _span_hashes(buf, lo[rows], hi[rows], hashes)
        slots = len(self._slot_code) + np.arange(len(rows), dtype=np.int64)
        self._start = np.concatenate([self._start, len(self._pool) + np.cumsum(lengths) - lengths])
        self._length = np.concatenate([self._length, lengths])
        self._pool = np.concatenate([self._pool, *pieces])
        self._slot_hash = np.concatenate([self._slot_hash, hashes])
        self._slot_code = np.concatenate([self._slot_code, self.codes(texts)])
        if 2 * len(self._slot_code) > len(self._table):  # keep the table at most half full
            size = 2 ** int(np.ceil(np.log2(4 * len(self._slot_code))))
            self._keys = np.zeros(size, dtype=np.uint64)
            self._table = np.full(size, -1, dtype=np.int64)
            every = np.arange(len(self._slot_code), dtype=np.int64)
            _insert(self._keys, self._table, self._slot_hash, every)
        else:
            _insert(self._keys, self._table, hashes, slots)

    def of(self, codes: np.ndarray) -> Any:
        if len(self._array) < len(self.names):
            self._array = np.array(self.names, dtype=object)
        return pd.array(self._array[codes], dtype="str")


def _factorize(raws: list[Any]) -> tuple[np.ndarray, list[str]]:
    codes, uniques = pd.factorize(pd.Series(raws, dtype=object), use_na_sentinel=False)
    return codes.astype(np.int64), list(uniques)


# --- a block of lines -----------------------------------------------------------------


@dataclass
class _Rows:
    """Requests parsed from one block, in file order."""

    line: np.ndarray  # int64, 1-based line numbers
    time_ns: np.ndarray  # int64
    code: np.ndarray  # int64, `_Identities` codes
    cost: np.ndarray  # int64

    @staticmethod
    def empty() -> _Rows:
        none = np.empty(0, dtype=np.int64)
        return _Rows(none, none, none, none)

    def take(self, index: Any) -> _Rows:
        return _Rows(self.line[index], self.time_ns[index], self.code[index], self.cost[index])

    @staticmethod
    def concat(parts: list[_Rows]) -> _Rows:
        if len(parts) == 1:
            return parts[0]
        return _Rows(*(np.concatenate([getattr(p, n) for p in parts]) for n in _ROW_FIELDS))

    def __len__(self) -> int:
        return len(self.line)


_ROW_FIELDS = ("line", "time_ns", "code", "cost")


@dataclass
class _Block:
    """Whole lines of the file: `data[starts[i]:ends[i]]` is line `first + i` (no newline)."""

    data: bytes
    starts: np.ndarray
    ends: np.ndarray
    first: int
    unterminated: bool  # the last line had no newline (the end of the file)

    def line(self, i: int) -> bytes:
        return self.data[self.starts[i] : self.ends[i]]

    def excerpts(self, index: np.ndarray) -> Callable[[int], str]:
        return lambda k: _excerpt(self.line(int(index[k]))[: EXCERPT_CHARS * 4])


def _lines_of(data: bytes, first: int, unterminated: bool) -> _Block:
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    starts = np.empty(len(ends) + unterminated, dtype=np.int64)
    starts[0:1] = 0
    starts[1 : len(ends) + 1] = ends[: len(starts) - 1] + 1
    if unterminated:
        ends = np.append(ends, len(data))
    ends = ends.astype(np.int64)
    # CRLF line ends: the CR is not part of the line.
    cr = ends > starts
    cr[cr] = buf[ends[cr] - 1] == 13
    ends -= cr
    return _Block(data, starts, ends, first, unterminated)


def _pieces(stream: IO[bytes], problems: Problems, bar: Any, raw: IO[bytes]):
    """The stream as `_Block`s of whole lines. A line longer than `MAX_LINE_BYTES` that
    spans blocks is counted "too long" here and skipped unread."""
    pending = b""
    line = 1
    skipping = False
    position = 0
    while True:
        data = stream.read(BLOCK_BYTES)
        here = raw.tell()
        bar.update(here - position)
        position = here
        if not data:
            break
        if skipping:
            cut = data.find(b"\n")
            if cut < 0:
                continue
            data, skipping = data[cut + 1 :], False
            line += 1
        if pending:
            data = pending + data
        cut = data.rfind(b"\n") + 1
        pending = data[cut:]
        if cut:
            block = _lines_of(data[:cut], line, False)
            line += len(block.starts)
            yield block
        if len(pending) > MAX_LINE_BYTES:
            head = _excerpt(pending[:480])
            problems._bad(TOO_LONG, np.array([line]), lambda _, text=head: text)
            problems.lines += 1
            pending, skipping = b"", True
    if pending:
        yield _lines_of(pending, line, True)


# --- opening and sniffing -------------------------------------------------------------


def _open(path: Path) -> tuple[IO[bytes], IO[bytes]]:
    """(stream of the log's bytes, the file underneath for progress)."""
    raw = open(path, "rb")  # noqa: SIM115 (closed by the caller)
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    raw.seek(0)
    return raw, raw


def _head(path: Path) -> list[tuple[int, str]]:
    """The first non-blank lines (line number, text), after checking that the file is a
    text file with something in it."""
    path = Path(path)
    if not path.is_file():
        raise LogFormatError(f"{path}: no such log file")
    stream, raw = _open(path)
    try:
        try:
            head = stream.read(4 * MAX_LINE_BYTES)
        except (OSError, EOFError) as exc:
            raise LogFormatError(f"{path} is not a log: {exc}") from None
    finally:
        stream.close()
        raw.close()
    if not head:
        raise LogFormatError(f"{path} is empty: there are no log lines to read")
    probe = head[:65536]
    nul = probe.find(b"\x00")
    text = probe.decode("utf-8", "replace")
    odd = sum(1 for c in text if c == "\ufffd" or (c < " " and c not in "\t\n\r\f"))
    if nul >= 0 or odd > len(text) // 20:
        where = f" (a NUL byte at offset {nul})" if nul >= 0 else ""
        raise LogFormatError(f"{path} is not a text log: it holds binary data{where}")
    complete = head if len(head) < 4 * MAX_LINE_BYTES else head[: head.rfind(b"\n") + 1]
    lines = []
    for number, line in enumerate(complete.split(b"\n"), 1):
        if line.strip():
            lines.append((number, line.rstrip(b"\r").decode("utf-8", "backslashreplace")))
            if len(lines) == SAMPLE_LINES:
                break
    if not lines:
        raise LogFormatError(f"{path} has no log lines (only blank lines)")
    return lines


def _clf_shapes(sample: list[tuple[int, str]]) -> list[str | None]:
    """Per sample line: "combined", "clf" (the shape, whatever its time says), or None."""
    out: list[str | None] = []
    for _, text in sample:
        block = _lines_of(text.encode("utf-8", "surrogateescape"), 1, True)
        spans, times, verdicts = _scan(block)
        if verdicts[0] not in (_OK, _BAD_TIME):
            out.append(None)
        else:
            out.append("combined" if spans[0, _AGENT, 0] >= 0 else "clf")
    return out


def _json_object(text: str) -> dict | None:
    try:
        value = json.loads(text, parse_float=decimal.Decimal)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


_HEADER_NAME = re.compile(r"[A-Za-z_@$][\w@$.:-]*")


def _csv_header(sample: list[tuple[int, str]]) -> list[str] | None:
    """The header of a csv log, when the sample looks like one: identifier-like names,
    and most other lines with as many fields."""
    rows = list(csv.reader([text for _, text in sample]))
    header = rows[0]
    if len(header) < 2 or not all(_HEADER_NAME.fullmatch(name) for name in header):
        return None
    if len(set(header)) != len(header):
        return None
    body = rows[1:]
    fits = sum(1 for row in body if len(row) == len(header))
    return header if body and fits * 2 >= len(body) else None


def _scores(sample: list[tuple[int, str]]) -> dict[str, float]:
    """Share of the sample lines each format reads."""
    shapes = _clf_shapes(sample)
    clf = sum(1 for s in shapes if s) / len(sample)
    combined = sum(1 for s in shapes if s == "combined") / len(sample)
    jsonl = sum(1 for _, text in sample if _json_object(text) is not None) / len(sample)
    header = _csv_header(sample) if len(sample) > 1 else None
    return {
        "clf": clf,
        "combined": combined,
        "jsonl": jsonl,
        "csv": 1.0 if header else 0.0,
    }


def _detect(path: Path, sample: list[tuple[int, str]]) -> str:
    scores = _scores(sample)
    best = max(("clf", "jsonl", "csv"), key=lambda name: scores[name])
    if best == "clf" and scores["combined"] * 2 >= scores["clf"]:
        best = "combined"
    if scores[best] < DETECT_SHARE:
        line, text = sample[0]
        raise LogFormatError(
            f"{path} is not an access log this reads ({', '.join(FORMATS)}): its first "
            f"lines fit none of them; line {line}: {_excerpt(text)!r}"
        )
    return best


def detect_format(path: str | Path) -> str:
    """The format of the log at `path` (one of `FORMATS`), from its first non-blank lines;
    LogFormatError for an empty, binary or unrecognised file."""
    return _detect(Path(path), _head(Path(path)))


# --- the reader -----------------------------------------------------------------------


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


def _lookup(record: dict, name: str) -> Any:
    """A field of a jsonl or csv record; a dotted name reaches into nested objects.
    Missing: None."""
    if name in record:
        return record[name]
    value: Any = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() in ("", "-"))


def _cost_of(value: Any) -> int:
    """A cost as an int >= 1, or 0 when it is not one (bool, fraction, text, < 1)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return 0
    value = int(value)
    return value if 1 <= value < 2**63 else 0


_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")
_EPOCH_SCALES = ((10**11, 10**9), (10**14, 10**6), (10**17, 10**3))


def _epoch_ns(value: decimal.Decimal | int) -> int | None:
    """Unix epoch seconds, ms, µs or ns (by magnitude) as exact ns; None out of range."""
    scale = 1
    for below, factor in _EPOCH_SCALES:
        if abs(value) < below:
            scale = factor
            break
    ns = int((decimal.Decimal(value) * scale).to_integral_value(decimal.ROUND_FLOOR))
    return ns if -(2**63) < ns < 2**63 else None


def _times_ns(values: list[Any]) -> np.ndarray:
    """jsonl or csv time values as epoch ns; _NO_NS where they are not times."""
    out = np.full(len(values), _NO_NS, dtype=np.int64)
    texts, where = [], []
    for i, value in enumerate(values):
        if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
            value = decimal.Decimal(value.strip())
        if isinstance(value, bool):
            continue
        if isinstance(value, int | decimal.Decimal):
            finite = not isinstance(value, decimal.Decimal) or value.is_finite()
            ns = _epoch_ns(value) if finite else None
            out[i] = _NO_NS if ns is None else ns
        elif isinstance(value, str):
            texts.append(value.strip())
            where.append(i)
    if texts:
        strings = pd.Series(texts, dtype=object)
        parsed = pd.to_datetime(strings, format="ISO8601", utc=True, errors="coerce")
        clf = parsed.isna().to_numpy()
        if clf.any():
            parsed[clf] = pd.to_datetime(
                strings[clf], format="%d/%b/%Y:%H:%M:%S %z", utc=True, errors="coerce"
            )
        stamps = pd.DatetimeIndex(parsed).as_unit("ns")
        ns = np.where(stamps.isna(), _NO_NS, stamps.asi8)
        out[np.asarray(where, dtype=np.int64)] = ns
    return out


class LogReader:
    """An access log as trace chunks (time, identity, cost, replica), in bounded memory.

    `path`: the log (gzip too). `format`: one of `FORMATS`, or None to detect it.
    `identity`: the field counted against (None: the client address). `cost`: None (1),
    an integer field's name, or a callable of the line's fields. `time`: jsonl/csv only,
    the time field (None: the first of `TIME_FIELDS` present). `ipv6_prefix`: IPv6
    addresses count per this prefix (as `ratelimit.http`). `chunk_lines`: rows per chunk
    at most. `reorder_s`: how far out of order lines may be and still be sorted (see the
    module doc). `progress`: a progress bar over the bytes read (None: on long reads,
    but not under pytest or with RATELIMIT_PROGRESS=0).

    Raises LogFormatError at once for a file that is not a log or a field it lacks.
    Iterating reads the file (again, on each iteration); `problems` is complete when the
    iteration ends.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        format: str | None = None,
        identity: str | None = None,
        cost: str | Callable[[dict[str, Any]], int] | None = None,
        time: str | None = None,
        ipv6_prefix: int = 64,
        chunk_lines: int = 1_000_000,
        reorder_s: float = 300.0,
        progress: bool | None = None,
    ) -> None:
        self.path = Path(path)
        self.ipv6_prefix = validation.positive_int("ipv6_prefix", ipv6_prefix, 128)
        self.chunk_lines = validation.count("chunk_lines", chunk_lines)
        self.reorder_s = validation.non_negative("reorder_s", reorder_s)
        self.progress = progress
        if format is not None and format not in FORMATS:
            raise LogFormatError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        if cost is not None and not callable(cost) and not isinstance(cost, str):
            raise ValueError(f"cost must be None, a field name or a callable, got {cost!r}")
        sample = _head(self.path)
        if format is None:
            format = _detect(self.path, sample)
        elif _scores(sample)["clf" if format == "combined" else format] == 0:
            line, text = sample[0]
            raise LogFormatError(
                f"{self.path} is not a {format} log: none of its first {len(sample)} non-blank "
                f"lines is one; line {line}: {_excerpt(text)!r}"
            )
        self.format: str = format
        self.cost = cost
        self.header: list[str] | None = None
        self.time_field: str | None = None
        if format in ("clf", "combined"):
            if time is not None:
                raise ValueError(f"time= names a jsonl or csv field; a {format} line has one time")
            fields = self._clf_names(sample)
            present = [name for name in fields if name != "time"]
        else:
            records = self._records(sample)
            fields = self.header or list(dict.fromkeys(n for record in records for n in record))
            named = [name for name in (identity, cost, time) if isinstance(name, str)]
            present = [
                name
                for name in dict.fromkeys([*fields, *named, *ADDRESS_FIELDS, *TIME_FIELDS])
                if any(_lookup(record, name) is not None for record in records)
                or (self.header is not None and name in self.header)
            ]
            self.time_field = time or next((n for n in TIME_FIELDS if n in present), None)
            if self.time_field is None:
                raise LogFormatError(
                    f"{self.path}: no time field ({', '.join(TIME_FIELDS)}); name it with "
                    f"time=; the fields are: {', '.join(fields)}"
                )
        if identity is None:
            address = "host" if self.time_field is None else None
            address = address or next((n for n in ADDRESS_FIELDS if n in present), None)
            if address is None:
                raise LogFormatError(
                    f"{self.path}: no client address field ({', '.join(ADDRESS_FIELDS)}); name "
                    f"the identity field with identity=; the fields are: {', '.join(fields)}"
                )
            identity = address
        self.identity_field: str = identity
        for option, name in (("identity", identity), ("cost", cost), ("time", time)):
            if isinstance(name, str) and name not in present:
                raise LogFormatError(
                    f"{self.path}: no field {name!r} ({option}=) in this {format} log; "
                    f"its fields are: {', '.join(fields)}"
                )
        self.problems = Problems(reorder_s=self.reorder_s)
        self.peak_buffered = 0
        """The most rows held back for reordering at once, in the last iteration."""

    # -- fields ------------------------------------------------------------------------

    def _clf_names(self, sample: list[tuple[int, str]]) -> list[str]:
        names = list(CLF_FIELDS)
        for _, text in sample:
            block = _lines_of(text.encode("utf-8", "surrogateescape"), 1, True)
            spans, _, verdicts = _scan(block)
            if verdicts[0] == _OK and spans[0, _EXTRA, 0] >= 0:
                lo, hi = spans[0, _EXTRA]
                extra = block.data[lo:hi].decode("utf-8", "backslashreplace")
                names += [name for name in _extras(extra) if name not in names]
        return names

    def _records(self, sample: list[tuple[int, str]]) -> list[dict]:
        if self.format == "jsonl":
            return [r for r in (_json_object(text) for _, text in sample) if r is not None]
        self.header = next(csv.reader([sample[0][1]]))
        self._header_line = sample[0][0]
        return [
            dict(zip(self.header, row, strict=True))
            for row in csv.reader([text for _, text in sample[1:]])
            if len(row) == len(self.header)
        ]

    # -- parsing -----------------------------------------------------------------------

    def _parse(self, block: _Block, identities: _Identities) -> _Rows:
        if self.format in ("clf", "combined"):
            return self._parse_clf(block, identities)
        return self._parse_records(block, identities)

    def _report(self, block: _Block, reasons: np.ndarray) -> None:
        """Count the bad lines of a block: `reasons[i]` is a verdict (`_OK` for good)."""
        problems = self.problems
        counted = reasons != _HEADER
        problems.lines += int(np.count_nonzero(counted))
        bad = np.flatnonzero((reasons != 0) & counted)
        if not len(bad):
            return
        if block.unterminated and reasons[-1] == _MALFORMED:  # cut off mid-way
            reasons = reasons.copy()
            reasons[-1] = _TRUNCATED
        for code, reason in _REASONS.items():
            index = bad[reasons[bad] == code]
            problems._bad(reason, block.first + index, block.excerpts(index))

    def _parse_clf(self, block: _Block, identities: _Identities) -> _Rows:
        spans, times, verdicts = _scan(block)
        buf = np.frombuffer(block.data, dtype=np.uint8)
        reasons = verdicts.astype(np.int64)
        good = np.flatnonzero(reasons == _OK)
        field_ = _CLF_SPAN.get(self.identity_field)
        fields: list[dict[str, str]] | None = None
        if (
            field_ is None
            or callable(self.cost)
            or (isinstance(self.cost, str) and self.cost not in _CLF_SPAN)
        ):
            fields = [_clf_fields(block.data, spans[i]) for i in good]
        # identity
        if field_ is not None:
            lo, hi = spans[good, field_, 0], spans[good, field_, 1]
            dash = (hi - lo == 1) & (buf[np.minimum(lo, len(buf) - 1)] == 45)
            absent = (hi <= lo) | dash
        else:
            values = [f.get(self.identity_field, "") for f in fields or []]
            absent = np.array([_missing(v) for v in values], dtype=bool)
        reasons[good[absent]] = _NO_IDENTITY
        # cost
        if self.cost is None:
            costs = np.ones(len(good), dtype=np.int64)
        elif isinstance(self.cost, str) and self.cost in _CLF_SPAN:
            f = _CLF_SPAN[self.cost]
            costs = np.zeros(len(good), dtype=np.int64)
            _span_ints(buf, spans[good, f, 0], spans[good, f, 1], costs)
        else:
            costs = np.array(
                [self._cost(fields_) for fields_ in fields or []], dtype=np.int64
            ).reshape(-1)
        reasons[good[(costs == 0) & ~absent]] = _BAD_COST
        keep = (costs > 0) & ~absent
        self._report(block, reasons)
        rows = good[keep]
        if field_ is not None:
            return _Rows(
                block.first + rows,
                times[rows],
                identities.span_codes(buf, lo[keep], hi[keep]),
                costs[keep],
            )
        codes, raws = _factorize([v for v, k in zip(values, keep, strict=True) if k])
        return _Rows(
            block.first + rows,
            times[rows],
            identities.codes(raws)[codes],
            costs[keep],
        )

    def _cost(self, fields: dict[str, Any]) -> int:
        if isinstance(self.cost, str):
            return _cost_of(_lookup(fields, self.cost))
        try:
            return _cost_of(self.cost(fields))  # type: ignore[misc]
        except _CALLABLE_ERRORS:
            return 0

    def _parse_records(self, block: _Block, identities: _Identities) -> _Rows:
        text = block.data.decode("utf-8", "backslashreplace")
        lines = text.split("\n")
        if not block.unterminated:
            lines.pop()  # after the last newline
        n = len(lines)
        reasons = np.zeros(n, dtype=np.int64)
        too_long = (block.ends - block.starts) > MAX_LINE_BYTES
        rows, raw_times, raw_ids, costs = [], [], [], []
        header = self.header
        for i, line in enumerate(lines):
            line = line.rstrip("\r")
            if not line.strip():
                reasons[i] = _BLANK
                continue
            if too_long[i]:
                reasons[i] = _TOO_LONG
                continue
            if header is not None:
                if block.first + i == self._header_line:
                    reasons[i] = _HEADER  # not a request, and not a bad line
                    continue
                record = _csv_row(line, header)
            else:
                record = _json_object(line)
            if record is None:
                reasons[i] = _MALFORMED
                continue
            when = _lookup(record, self.time_field)  # type: ignore[arg-type]
            if _missing(when):
                reasons[i] = _NO_TIME
                continue
            who = _lookup(record, self.identity_field)
            if _missing(who) or isinstance(who, dict | list | bool):
                reasons[i] = _NO_IDENTITY
                continue
            cost = 1 if self.cost is None else self._cost(record)
            if cost == 0:
                reasons[i] = _BAD_COST
                continue
            rows.append(i)
            raw_times.append(when)
            raw_ids.append(who if isinstance(who, str) else str(who))
            costs.append(cost)
        times = _times_ns(raw_times)
        rows_ = np.asarray(rows, dtype=np.int64)
        untimed = times == _NO_NS
        reasons[rows_[untimed]] = _BAD_TIME
        self._report(block, reasons)
        keep = ~untimed
        codes, raws = _factorize([raw for raw, k in zip(raw_ids, keep, strict=True) if k])
        return _Rows(
            block.first + rows_[keep],
            times[keep],
            identities.codes(raws)[codes],
            np.asarray(costs, dtype=np.int64)[keep],
        )

    # -- iterating ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[pd.DataFrame]:
        self.problems = problems = Problems(reorder_s=self.reorder_s)
        self.peak_buffered = 0
        identities = _Identities(self.ipv6_prefix)
        order = _Reorder(min(round(self.reorder_s * _NS), 2**62))  # 2**62 ns: 146 years
        queue: list[_Rows] = []
        queued = 0
        stream, raw = _open(self.path)
        try:
            with _bar(self.path.stat().st_size, self.progress) as bar:
                for block in _pieces(stream, problems, bar, raw):
                    rows = self._parse(block, identities)
                    problems.parsed += len(rows)
                    late = order.late(rows.time_ns)
                    if late.any():
                        index = np.flatnonzero(late)
                        problems.late += len(index)
                        for k in index[: EXAMPLES_PER_REASON - len(problems.late_examples)]:
                            at = int(rows.line[k]) - block.first
                            problems.late_examples.append(
                                (int(rows.line[k]), "late", _excerpt(block.line(at)))
                            )
                    ready = order.push(rows)
                    self.peak_buffered = max(self.peak_buffered, order.held)
                    if len(ready):
                        queue.append(ready)
                        queued += len(ready)
                    while queued >= self.chunk_lines:
                        chunk, queue, queued = _split(queue, self.chunk_lines)
                        yield self._frame(chunk, identities)
                rest = order.flush()
                if len(rest):
                    queue.append(rest)
                    queued += len(rest)
                while queued:
                    chunk, queue, queued = _split(queue, self.chunk_lines)
                    yield self._frame(chunk, identities)
        finally:
            stream.close()
            raw.close()

    @staticmethod
    def _frame(rows: _Rows, identities: _Identities) -> pd.DataFrame:
        order = np.lexsort((rows.line, rows.time_ns))
        rows = rows.take(order)
        n = len(rows)
        return pd.DataFrame(
            {
                "time": _floor_ms_exact(rows.time_ns),
                "identity": identities.of(rows.code),
                "cost": rows.cost,
                "replica": np.zeros(n, dtype=np.int64),
            },
            index=pd.RangeIndex(n),
        )


def _csv_row(line: str, header: list[str]) -> dict[str, str] | None:
    try:
        row = next(csv.reader([line]))
    except csv.Error:
        return None
    return dict(zip(header, row, strict=True)) if len(row) == len(header) else None


class _Reorder:
    """Holds rows back until they are `horizon` ns older than the newest row seen, then
    releases them sorted by time (ties in file order)."""

    def __init__(self, horizon_ns: int) -> None:
        self.horizon = horizon_ns
        self.newest: int | None = None
        self.buffer = _Rows.empty()

    @property
    def held(self) -> int:
        return len(self.buffer)

    def late(self, times: np.ndarray) -> np.ndarray:
        """Which of these rows (in file order, after those pushed) are more than the
        horizon older than a row before them."""
        if not len(times):
            return np.zeros(0, dtype=bool)
        before = np.maximum.accumulate(times)
        before = np.concatenate([[_NO_NS if self.newest is None else self.newest], before[:-1]])
        if self.newest is not None:
            before = np.maximum(before, self.newest)
        valid = before != _NO_NS
        return valid & (times < np.where(valid, before, 0) - self.horizon)

    def push(self, rows: _Rows) -> _Rows:
        if len(rows):
            top = int(rows.time_ns.max())
            self.newest = top if self.newest is None else max(self.newest, top)
        rows = _Rows.concat([self.buffer, rows])
        if self.newest is None:
            return _Rows.empty()
        ready = rows.time_ns <= self.newest - self.horizon
        self.buffer = rows.take(~ready)
        out = rows.take(ready)
        return out.take(np.argsort(out.time_ns, kind="stable"))

    def flush(self) -> _Rows:
        out = self.buffer.take(np.argsort(self.buffer.time_ns, kind="stable"))
        self.buffer = _Rows.empty()
        return out


def _split(queue: list[_Rows], size: int) -> tuple[_Rows, list[_Rows], int]:
    """The first `size` queued rows, and what remains queued."""
    rows = _Rows.concat(queue)
    head, tail = rows.take(slice(0, size)), rows.take(slice(size, None))
    return head, ([tail] if len(tail) else []), len(tail)


def _bar(total_bytes: int, progress: bool | None):
    """The replay's progress bar (`simulation._progress`: silent under pytest, nbval or
    RATELIMIT_PROGRESS=0), counting bytes, and only for long reads unless asked."""
    if progress is None and total_bytes < PROGRESS_MIN_BYTES:
        progress = False
    return simulation._progress(total_bytes, progress, unit="B", unit_scale=True, unit_divisor=1024)


def read(path: str | Path, **options: Any) -> tuple[pd.DataFrame, Problems]:
    """The whole log as one trace (all chunks, concatenated), and its problems; the
    options are `LogReader`'s."""
    reader = LogReader(path, **options)
    chunks = list(reader)
    if chunks:
        trace = pd.concat(chunks, ignore_index=True)
    else:
        trace = pd.DataFrame(
            {
                "time": np.empty(0, dtype=np.float64),
                "identity": pd.array([], dtype="str"),
                "cost": np.empty(0, dtype=np.int64),
                "replica": np.empty(0, dtype=np.int64),
            }
        )
    return trace, reader.problems
