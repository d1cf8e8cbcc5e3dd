"""The read loop's pieces: the file opened (gzip too) and cut into blocks of whole
lines, the rows parsed from a block, and the buffer that puts rows back in time order."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from numba import njit

from .. import simulation
from .problems import _NO_NS, EXCERPT_CHARS, TOO_LONG, Problems, _excerpt

BLOCK_BYTES = 16 * 2**20
"""Bytes read and parsed at a time."""

MAX_LINE_BYTES = 2**20
"""Longer lines are bad lines ("too long"), skipped without being held in memory."""

PROGRESS_MIN_BYTES = 64 * 2**20
"""Reads of at least this many bytes show a progress bar (unless silenced)."""


@dataclass
class _Rows:
    """Requests parsed from one block, in file order."""

    line: np.ndarray  # int64, 1-based line numbers
    time_ns: np.ndarray  # int64
    code: np.ndarray  # int64, `_Identities` codes
    cost: np.ndarray  # int64
    fields: np.ndarray  # object, (rows, asked fields): their text

    @staticmethod
    def empty(width: int = 0) -> _Rows:
        none = np.empty(0, dtype=np.int64)
        return _Rows(none, none, none, none, np.empty((0, width), dtype=object))

    def take(self, index: Any) -> _Rows:
        return _Rows(
            self.line[index],
            self.time_ns[index],
            self.code[index],
            self.cost[index],
            self.fields[index],
        )

    @staticmethod
    def concat(parts: list[_Rows]) -> _Rows:
        if len(parts) == 1:
            return parts[0]
        return _Rows(*(np.concatenate([getattr(p, n) for p in parts]) for n in _ROW_FIELDS))

    def __len__(self) -> int:
        return len(self.line)


_ROW_FIELDS = ("line", "time_ns", "code", "cost", "fields")


@dataclass
class _Block:
    """Whole lines of the file: `data[starts[i]:ends[i]]` is line `first + i` (no newline)."""

    data: bytes
    starts: np.ndarray
    ends: np.ndarray
    first: int
    unterminated: bool  # the last line had no newline (the end of the file)
    span: tuple[int, int]  # data[span[0]:span[1]]: the lines and their newlines

    def text(self) -> bytes:
        """The block's lines, with their newlines."""
        return self.data[self.span[0] : self.span[1]]

    def line(self, i: int) -> bytes:
        return self.data[self.starts[i] : self.ends[i]]

    def excerpts(self, index: np.ndarray) -> Callable[[int], str]:
        return lambda k: _excerpt(self.line(int(index[k]))[: EXCERPT_CHARS * 4])


def _lines_of(
    data: bytes, first: int, unterminated: bool, start: int = 0, stop: int | None = None
) -> _Block:
    """The lines of `data[start:stop]` (which ends after a newline unless `unterminated`),
    the first of them line `first` of the file."""
    stop = len(data) if stop is None else stop
    buf = np.frombuffer(data, dtype=np.uint8)[start:stop]
    ends = np.flatnonzero(buf == 10)
    starts = np.empty(len(ends) + unterminated, dtype=np.int64)
    starts[0:1] = 0
    starts[1 : len(ends) + 1] = ends[: len(starts) - 1] + 1
    if unterminated:
        ends = np.append(ends, len(buf))
    ends = ends.astype(np.int64)
    # CRLF line ends: the CR is not part of the line.
    cr = ends > starts
    cr[cr] = buf[ends[cr] - 1] == 13
    ends -= cr
    return _Block(data, starts + start, ends + start, first, unterminated, (start, stop))


@dataclass
class _TooLong:
    """A line longer than `MAX_LINE_BYTES` that spans blocks, skipped unread."""

    line: int
    head: str  # its first bytes, as text

    def count(self, problems: Problems) -> None:
        problems._bad(TOO_LONG, np.array([self.line]), lambda _, text=self.head: text)
        problems.lines += 1


@dataclass
class _Stopped:
    """Reading stopped early (a damaged gzip file), and why."""

    why: str

    def count(self, problems: Problems) -> None:
        problems.stopped = self.why


def _pieces(stream: IO[bytes], bar: Any, raw: IO[bytes]):
    """The stream as `_Block`s of whole lines, with a `_TooLong` where a line longer
    than `MAX_LINE_BYTES` spans blocks and a `_Stopped` where a gzip stream ends early:
    what the reader counts, in the order the file holds them (the caller counts them,
    so that the pieces can be made in a thread of their own)."""
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
        start = 0
        if skipping:
            cut = data.find(b"\n")
            if cut < 0:
                continue
            start, skipping = cut + 1, False
            line += 1
        if pending:
            # The line the read before cut is finished in a block of its own, so that
            # the bytes just read are parsed where they are, not copied behind it.
            cut = data.find(b"\n", start)
            if cut >= 0:
                yield _lines_of(pending + data[start : cut + 1], line, False)
                line += 1
                pending, start = b"", cut + 1
        if pending:
            pending += data[start:]
        else:
            cut = data.rfind(b"\n", start) + 1
            if cut > start:
                block = _lines_of(data, line, False, start, cut)
                line += len(block.starts)
                yield block
            pending = data[max(cut, start) :]
        if len(pending) > MAX_LINE_BYTES:
            yield _TooLong(line, _excerpt(pending[:480]))
            pending, skipping = b"", True
    if pending:
        yield _lines_of(pending, line, True)
        line += 1
    if isinstance(stream, _Gunzip) and stream.error:
        yield _Stopped(
            f"{stream.error} at byte {stream.offset:,} of {stream.size:,} of the gzip file: "
            f"reading stopped after line {line - 1:,}; what follows was not read"
        )


class _Gunzip:
    """The bytes of a gzip file (member after member) that can be read: where the data
    is cut off or damaged the stream ends, `error` says why and `offset` where (a byte
    of the compressed file), rather than raising and losing what was read."""

    PIECE = 2**12  # compressed bytes fed at a time: damage loses at most one piece's output

    def __init__(self, raw: IO[bytes], size: int) -> None:
        self.raw, self.size = raw, size
        self.error = ""
        self.offset = 0
        self._z = zlib.decompressobj(31)
        self._input = b""  # compressed bytes read but not yet fed
        self._out = bytearray()
        self._in_member = False
        self._done = False

    def read(self, n: int) -> bytes:
        while len(self._out) < n and not self._done:
            self._fill()
        data = bytes(self._out[:n])
        del self._out[:n]
        return data

    def _fill(self) -> None:
        data, self._input = self._input, b""
        if not data:
            data = self.raw.read(self.PIECE)
            if not data:
                self._stop("ends early (the file is cut off)" if self._in_member else "", self.size)
                return
        if not self._in_member:
            data = data.lstrip(b"\x00")  # zeros padding the file after a member
            if not data:
                return
            self._in_member = True
        fed = self.raw.tell() - len(data)
        try:
            self._out += self._z.decompress(data)
        except zlib.error as exc:
            self._stop(f"is damaged ({exc})", fed)
            return
        self._input = self._z.unconsumed_tail
        if self._z.eof:  # a member ends; another may follow
            self._input = self._z.unused_data
            self._z = zlib.decompressobj(31)
            self._in_member = False

    def _stop(self, why: str, offset: int) -> None:
        self._done = True
        if why:
            self.error, self.offset = f"the gzip data {why}", offset

    def close(self) -> None:
        pass


def _open(path: Path) -> tuple[IO[bytes], IO[bytes]]:
    """(stream of the log's bytes, the file underneath for progress). A gzip file's
    stream is a `_Gunzip`."""
    raw = open(path, "rb")  # noqa: SIM115 (closed by the caller)
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return _Gunzip(raw, path.stat().st_size), raw  # type: ignore[return-value]
    raw.seek(0)
    return raw, raw


_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min


class _Reorder:
    """Puts rows back in time order within a horizon, by a rule of the file's content
    alone: reading line j, every held row at least `horizon` ns older than the newest row
    up to line j is released; the rows released at one line go out sorted by time (ties
    in file order), and lines release in file order. So a row more than the horizon older
    than a row before it (late) goes out as soon as it is read, and every other row in
    time order; how the file is cut into blocks changes nothing."""

    def __init__(self, horizon_ns: int, width: int = 0) -> None:
        self.horizon = horizon_ns
        self.width = width
        self.newest: int | None = None
        # Held rows, in file order, as the blocks they came in; `ascending` when their
        # times never go back, the usual case, where releasing is taking a prefix.
        self.parts: list[_Rows] = []
        self.ascending = True

    @property
    def held(self) -> int:
        return sum(len(part) for part in self.parts)

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
        """The rows released while reading `rows` (the next rows of the file), in the
        order they are released."""
        if not len(rows):
            return _Rows.empty(self.width)
        times = rows.time_ns
        if (
            self.ascending
            and (self.newest is None or times[0] >= self.newest)
            and _ascending(times)
        ):
            return self._push_ascending(rows)
        newest = np.maximum.accumulate(times)
        if self.newest is not None:
            newest = np.maximum(newest, self.newest)
        self.newest = int(newest[-1])
        buffer = _Rows.concat(self.parts) if self.parts else _Rows.empty(self.width)
        held = len(buffer)
        rows = _Rows.concat([buffer, rows])
        times = rows.time_ns
        # The newest time that releases each row: its own plus the horizon, saturated.
        due = np.where(times > _INT64_MAX - self.horizon, _INT64_MAX, times + self.horizon)
        step = first_reaching(newest, due)  # the row of this block releasing it
        step[held:] = np.maximum(step[held:], np.arange(len(rows) - held))
        released = step < len(newest)
        buffer = rows.take(~released)
        self.parts = [buffer] if len(buffer) else []
        self.ascending = _ascending(buffer.time_ns)
        out = rows.take(released)
        return out.take(np.lexsort((out.time_ns, step[released])))

    def _push_ascending(self, rows: _Rows) -> _Rows:
        """`push` when the held rows and these ones never go back in time: each row's
        releasing line is the first whose time reaches its own plus the horizon, so the
        rows released are those up to the newest time less the horizon, a prefix, and
        they go out in file order (the order of their time and of their step)."""
        self.newest = int(rows.time_ns[-1])
        self.parts.append(rows)
        threshold = max(self.newest - self.horizon, _INT64_MIN)  # exact, in Python ints
        out: list[_Rows] = []
        while self.parts:
            part = self.parts[0]
            cut = int(np.searchsorted(part.time_ns, threshold, side="right"))
            if cut < len(part):
                if cut:
                    out.append(part.take(slice(0, cut)))
                    self.parts[0] = part.take(slice(cut, None))
                break
            out.append(self.parts.pop(0))
        return _Rows.concat(out) if out else _Rows.empty(self.width)

    def flush(self) -> _Rows:
        buffer = _Rows.concat(self.parts) if self.parts else _Rows.empty(self.width)
        out = buffer.take(np.argsort(buffer.time_ns, kind="stable"))
        self.parts, self.ascending = [], True
        return out


def _ascending(times: np.ndarray) -> bool:
    return bool(len(times) < 2 or (times[1:] >= times[:-1]).all())


def first_reaching(ascending: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each value, the first index of `ascending` (non-decreasing) whose element is
    >= it, or len(ascending): `np.searchsorted(ascending, values, side="left")`, but
    walking forward from the last answer, as values that mostly ascend allow."""
    out = np.empty(len(values), dtype=np.int64)
    _first_reaching(np.ascontiguousarray(ascending, dtype=np.int64),
                    np.ascontiguousarray(values, dtype=np.int64), out)  # fmt: skip
    return out


@njit(cache=True, nogil=True)
def _first_reaching(ascending, values, out):  # pragma: no cover (compiled)
    m = ascending.shape[0]
    j = 0  # the answer for the value before: ascending[:j] < it <= ascending[j:]
    for i in range(values.shape[0]):
        v = values[i]
        if j < m and ascending[j] < v:
            # Further on: gallop to a bound, then halve between.
            lo, step = j + 1, 1
            hi = lo
            while hi < m and ascending[hi] < v:
                lo = hi + 1
                hi += step
                step *= 2
            hi = min(hi, m)
        elif j > 0 and ascending[j - 1] >= v:
            lo, hi = 0, j - 1  # back: somewhere before
        else:
            out[i] = j
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if ascending[mid] < v:
                lo = mid + 1
            else:
                hi = mid
        j = lo
        out[i] = j
    return out


def _chunks(rows: _Rows, size: int, final: bool) -> tuple[list[_Rows], _Rows]:
    """Released rows cut into chunks: a chunk ends where time goes back (a late row
    starts the next) and after `size` rows. The chunks complete so far, and the rows
    left over (all of them into chunks when `final`)."""
    times = rows.time_ns
    ends = [*(np.flatnonzero(times[1:] < times[:-1]) + 1).tolist(), len(rows)]
    out, start = [], 0
    for end in ends:
        while end - start >= size:
            out.append(rows.take(slice(start, start + size)))
            start += size
        if start < end and (end < len(rows) or final):
            out.append(rows.take(slice(start, end)))
            start = end
    return out, rows.take(slice(start, None))


def _bar(total_bytes: int, progress: bool | None):
    """The replay's progress bar (`simulation._progress`: silent under pytest, nbval or
    RATELIMIT_PROGRESS=0), counting bytes, and only for long reads unless asked."""
    if progress is None and total_bytes < PROGRESS_MIN_BYTES:
        progress = False
    return simulation._progress(total_bytes, progress, unit="B", unit_scale=True, unit_divisor=1024)
