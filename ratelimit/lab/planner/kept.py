"""The requests of a plan kept to replay other limits on (`KeptTrace`): in memory up to a
bound, then in a temporary file read back a block at a time, so that keeping them costs
disk (20 bytes a request), not memory that grows with the log."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import IO

import numpy as np

MEMORY_ROWS = 1 << 21
"""Requests a `KeptTrace` holds in memory before it writes them out (about 40 MiB)."""
_COLUMNS = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.int64))  # code, ms, cost

Block = tuple[np.ndarray, np.ndarray, np.ndarray]


class NoRoom(OSError):
    """The temporary file of kept requests could not be written (a full disk, a
    temporary folder that is missing or read-only)."""


class KeptTrace:
    """Every request of a plan as (identity code, whole-ms time, cost), in the order they
    were decided. At most `memory_rows` (default `MEMORY_ROWS`) requests wait in memory;
    the rest are written to a temporary file (removed when the trace is closed or
    collected) and read back by `blocks()`, one written block at a time."""

    def __init__(self, memory_rows: int | None = None) -> None:
        memory_rows = MEMORY_ROWS if memory_rows is None else memory_rows
        if memory_rows < 1:
            raise ValueError(f"memory_rows must be at least 1, got {memory_rows!r}")
        self._memory_rows = memory_rows
        self._waiting: list[Block] = []
        self._waiting_rows = 0
        self._file: IO[bytes] | None = None
        self._written: list[int] = []  # rows of each block in the file, in order
        self._rows = 0

    @classmethod
    def in_memory(cls, codes: np.ndarray, times: np.ndarray, costs: np.ndarray) -> KeptTrace:
        """A trace of requests already in memory, kept there (nothing written)."""
        trace = cls(memory_rows=len(codes) + 1)
        trace.add(codes, times, costs)
        return trace

    def __len__(self) -> int:
        return self._rows

    def add(self, codes: np.ndarray, times: np.ndarray, costs: np.ndarray) -> None:
        """Keep one chunk's requests (three equal-length columns) after those before."""
        columns = zip((codes, times, costs), _COLUMNS, strict=True)
        block = tuple(np.array(a, dtype=d) for a, d in columns)  # a copy: chunks are reused
        if len({len(a) for a in block}) != 1:
            raise ValueError("codes, times and costs must have the same length")
        if not len(block[0]):
            return
        self._waiting.append(block)  # type: ignore[arg-type]
        self._waiting_rows += len(block[0])
        self._rows += len(block[0])
        if self._waiting_rows >= self._memory_rows:
            self._write()

    @property
    def on_disk(self) -> int:
        """Requests written to the temporary file so far."""
        return sum(self._written)

    def blocks(self) -> Iterator[Block]:
        """(codes, times_ms, costs) blocks, every request once, in the kept order."""
        if self._file is not None:
            self._file.seek(0)
            for rows in self._written:  # a block's three columns follow one another
                yield tuple(self._read(rows, d) for d in _COLUMNS)  # type: ignore[misc]
        if len(self._waiting) > 1:  # joined once, not at every replay
            self._waiting = [tuple(np.concatenate(c) for c in zip(*self._waiting, strict=True))]  # type: ignore[list-item]
        yield from self._waiting

    def close(self) -> None:
        """Drop the kept requests and remove the temporary file."""
        if self._file is not None:
            self._file.close()
        self._file, self._written, self._waiting = None, [], []
        self._waiting_rows = self._rows = 0

    def __enter__(self) -> KeptTrace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> None:
        try:
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="ratelimit-plan-")
            self._file.seek(0, 2)
            for column in zip(*self._waiting, strict=True):
                for part in column:
                    self._file.write(memoryview(part).cast("B"))
            self._file.flush()
        except OSError as exc:
            raise NoRoom(
                exc.errno,
                f"cannot keep the plan's requests (20 bytes each) in a temporary file under "
                f"{tempfile.gettempdir()}: {exc.strerror or exc}; set TMPDIR to a folder with "
                "room, or plan with --affect none --no-spread, which keep nothing",
            ) from exc
        self._written.append(self._waiting_rows)
        self._waiting, self._waiting_rows = [], 0

    def _read(self, rows: int, dtype: np.dtype) -> np.ndarray:
        assert self._file is not None
        out = np.empty(rows, dtype=dtype)
        if self._file.readinto(memoryview(out).cast("B")) != out.nbytes:
            raise OSError("the plan's temporary file of kept requests ended early")
        return out
