"""The read loop's pieces: the file opened (gzip too) and cut into blocks of whole
lines, the rows parsed from a block, and the buffer that puts rows back in time order."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

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


def _open(path: Path) -> tuple[IO[bytes], IO[bytes]]:
    """(stream of the log's bytes, the file underneath for progress)."""
    raw = open(path, "rb")  # noqa: SIM115 (closed by the caller)
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    raw.seek(0)
    return raw, raw


class _Reorder:
    """Holds rows back until they are `horizon` ns older than the newest row seen, then
    releases them sorted by time (ties in file order)."""

    def __init__(self, horizon_ns: int, width: int = 0) -> None:
        self.horizon = horizon_ns
        self.width = width
        self.newest: int | None = None
        self.buffer = _Rows.empty(width)

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
            return _Rows.empty(self.width)
        ready = rows.time_ns <= self.newest - self.horizon
        self.buffer = rows.take(~ready)
        out = rows.take(ready)
        return out.take(np.argsort(out.time_ns, kind="stable"))

    def flush(self) -> _Rows:
        out = self.buffer.take(np.argsort(self.buffer.time_ns, kind="stable"))
        self.buffer = _Rows.empty(self.width)
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
