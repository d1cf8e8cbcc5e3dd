"""`LogReader` and `read`: a log's lines parsed block by block, bad lines counted,
rows reordered and released as trace chunks (see `ratelimit.lab.accesslog`)."""

from __future__ import annotations

import csv
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ratelimit import validation

from ..traffic import _floor_ms_exact
from . import blocks
from .ahead import ahead
from .blocks import _bar, _Block, _chunks, _lines_of, _open, _pieces, _Reorder, _Rows
from .clf import _CLF_SPAN, _EXTRA, _clf_fields, _columns, _extras, _scan, _span_ints
from .fields import _cost_of, _csv_row, _lookup, _missing, _text, _times_ns
from .formats import (
    ADDRESS_FIELDS,
    CLF_FIELDS,
    FORMATS,
    TIME_FIELDS,
    _json_object,
    _sample,
)
from .identities import _factorize, _Identities
from .problems import (
    _BAD_COST,
    _BAD_TIME,
    _BLANK,
    _HEADER,
    _MALFORMED,
    _NO_IDENTITY,
    _NO_NS,
    _NO_TIME,
    _OK,
    _PARTIAL,
    _REASONS,
    _TOO_LONG,
    _TRUNCATED,
    EXAMPLES_PER_REASON,
    LogFormatError,
    Problems,
    _excerpt,
)

_CALLABLE_ERRORS = (ValueError, TypeError, KeyError, IndexError, ArithmeticError)
_NS = 1_000_000_000
BLOCKS_AHEAD = 2
"""Blocks read and scanned ahead in a thread of their own, when reading ahead."""
TRACE_COLUMNS = ("time", "identity", "cost", "replica")
"""The columns of every trace chunk; `fields=` adds one column per named field."""


class LogReader:
    """An access log as trace chunks (time, identity, cost, replica), in bounded memory.

    `path`: the log (gzip too). `format`: one of `FORMATS`, or None to detect it.
    `identity`: the field counted against (None: the client address). `cost`: None (1),
    an integer field's name, or a callable of the line's fields. `time`: jsonl/csv only,
    the time field (None: the first of `TIME_FIELDS` present). `ipv6_prefix`: IPv6
    addresses count per this prefix (as `ratelimit.http`). `chunk_lines`: rows per chunk
    at most. `reorder_s`: how far out of order lines may be and still be sorted (see the
    module doc). `progress`: a progress bar over the bytes read (None: on long reads,
    but not under pytest or with RATELIMIT_PROGRESS=0). `fields`: more fields to carry,
    each a column of text in every chunk ("" where a line lacks it): for clf and combined
    the format's field names (`CLF_FIELDS` and the extras), for jsonl and csv a (dotted)
    field name. `read_ahead`: how many chunks a thread of their own may parse ahead
    while the caller works on the one before (0: parse each chunk when it is asked for),
    with up to `BLOCKS_AHEAD` blocks of the file read and scanned ahead in another thread;
    the chunks are the same either way. `identity_dtype`: "str" (each row its text) or
    "category" (the names held once, each row a code: what a planner groups by fastest).

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
        fields: Sequence[str] = (),
        read_ahead: int = 1,
        identity_dtype: str = "str",
    ) -> None:
        self.path = Path(path)
        self.read_ahead = validation.count("read_ahead", read_ahead, minimum=0)
        if identity_dtype not in ("str", "category"):
            raise ValueError(f'identity_dtype must be "str" or "category", got {identity_dtype!r}')
        self.identity_dtype = identity_dtype
        self.ipv6_prefix = validation.positive_int("ipv6_prefix", ipv6_prefix, 128)
        self.chunk_lines = validation.count("chunk_lines", chunk_lines)
        self.reorder_s = validation.non_negative("reorder_s", reorder_s)
        self.progress = progress
        self.fields: tuple[str, ...] = _field_names(fields)
        if format is not None and format not in FORMATS:
            raise LogFormatError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        if cost is not None and not callable(cost) and not isinstance(cost, str):
            raise ValueError(f"cost must be None, a field name or a callable, got {cost!r}")
        format, sample = _sample(self.path, format)
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
            named = [n for n in (identity, cost, time, *self.fields) if isinstance(n, str)]
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
        for name in self.fields:
            if name not in present:
                raise LogFormatError(
                    f"{self.path}: no field {name!r} (fields=) in this {format} log; "
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
        try:
            self.header = next(csv.reader([sample[0][1]]))
        except csv.Error as exc:
            raise LogFormatError(f"{self.path}: its csv header cannot be read ({exc})") from None
        self._header_line = sample[0][0]
        rows = (_csv_row(text, self.header) for _, text in sample[1:])
        return [row for row in rows if row is not None]

    # -- parsing -----------------------------------------------------------------------

    def _parse(self, block: _Block, identities: _Identities, scanned: Any) -> _Rows:
        if self.format in ("clf", "combined"):
            return self._parse_clf(block, identities, scanned)
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

    def _parse_clf(
        self, block: _Block, identities: _Identities, scanned: tuple[np.ndarray, ...]
    ) -> _Rows:
        """The rows of a block, from its `_scan`."""
        spans, times, verdicts = scanned
        buf = np.frombuffer(block.data, dtype=np.uint8)
        reasons = verdicts.astype(np.int64)
        reasons[reasons == _PARTIAL] = _OK  # a request; counted apart once kept
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
            lo, hi = spans[:, field_, 0][good], spans[:, field_, 1][good]
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
            _span_ints(buf, spans[:, f, 0][good], spans[:, f, 1][good], costs)
        else:
            costs = np.array(
                [self._cost(fields_) for fields_ in fields or []], dtype=np.int64
            ).reshape(-1)
        reasons[good[(costs == 0) & ~absent]] = _BAD_COST
        keep = (costs > 0) & ~absent
        self._report(block, reasons)
        rows = good[keep]
        partial = rows[verdicts[rows] == _PARTIAL]
        if len(partial):
            self.problems._partial(block.first + partial, block.excerpts(partial))
        texts = (
            _columns(block.data, spans[rows], self.fields)
            if self.fields
            else np.empty((len(rows), 0), dtype=object)
        )
        if field_ is not None:
            return _Rows(
                block.first + rows,
                times[rows],
                identities.span_codes(buf, lo[keep], hi[keep]),
                costs[keep],
                texts,
            )
        codes, raws = _factorize([v for v, k in zip(values, keep, strict=True) if k])
        return _Rows(
            block.first + rows,
            times[rows],
            identities.codes(raws)[codes],
            costs[keep],
            texts,
        )

    def _cost(self, fields: dict[str, Any]) -> int:
        if isinstance(self.cost, str):
            return _cost_of(_lookup(fields, self.cost))
        try:
            return _cost_of(self.cost(fields))  # type: ignore[misc]
        except _CALLABLE_ERRORS:
            return 0

    def _parse_records(self, block: _Block, identities: _Identities) -> _Rows:
        text = block.text().decode("utf-8", "backslashreplace")
        lines = text.split("\n")
        if not block.unterminated:
            lines.pop()  # after the last newline
        n = len(lines)
        reasons = np.zeros(n, dtype=np.int64)
        too_long = (block.ends - block.starts) > blocks.MAX_LINE_BYTES
        rows, raw_times, raw_ids, costs, texts = [], [], [], [], []
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
            if self.fields:
                texts.append([_text(_lookup(record, name)) for name in self.fields])
        times = _times_ns(raw_times)
        rows_ = np.asarray(rows, dtype=np.int64)
        untimed = times == _NO_NS
        reasons[rows_[untimed]] = _BAD_TIME
        self._report(block, reasons)
        keep = ~untimed
        codes, raws = _factorize([raw for raw, k in zip(raw_ids, keep, strict=True) if k])
        columns = np.empty((len(rows), len(self.fields)), dtype=object)
        if self.fields and rows:
            columns[:] = texts
        return _Rows(
            block.first + rows_[keep],
            times[keep],
            identities.codes(raws)[codes],
            np.asarray(costs, dtype=np.int64)[keep],
            columns[keep],
        )

    # -- iterating ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[pd.DataFrame]:
        return ahead(self._read(), self.read_ahead)

    def _read(self) -> Generator[pd.DataFrame, None, None]:
        self.problems = problems = Problems(reorder_s=self.reorder_s)
        self.peak_buffered = 0
        identities = _Identities(self.ipv6_prefix)
        order = _Reorder(min(round(self.reorder_s * _NS), 2**62), len(self.fields))  # 146 y
        pending = _Rows.empty(len(self.fields))  # released, not yet in a chunk
        stream, raw = _open(self.path)
        try:
            with _bar(self.path.stat().st_size, self.progress) as bar:
                # Reading ahead, blocks are read, cut into lines and scanned in a thread
                # of their own too (the scan is compiled and lets go of the GIL).
                depth = BLOCKS_AHEAD if self.read_ahead else 0
                pieces = ahead(self._scanned(_pieces(stream, bar, raw)), depth)
                try:
                    for block, scanned in pieces:
                        if not isinstance(block, _Block):
                            block.count(problems)
                            continue
                        rows = self._parse(block, identities, scanned)
                        problems.parsed += len(rows)
                        self._count_late(order, rows, block)
                        ready = order.push(rows)
                        self.peak_buffered = max(self.peak_buffered, order.held)
                        if len(ready):
                            ready = _Rows.concat([pending, ready]) if len(pending) else ready
                            chunks, pending = _chunks(ready, self.chunk_lines, final=False)
                            for chunk in chunks:
                                yield self._frame(chunk, identities)
                finally:
                    pieces.close()  # the thread stops before the file closes
                rest = _Rows.concat([pending, order.flush()])
                for chunk in _chunks(rest, self.chunk_lines, final=True)[0]:
                    yield self._frame(chunk, identities)
        finally:
            stream.close()
            raw.close()

    def _scanned(self, pieces: Iterator[Any]) -> Generator[tuple[Any, Any], None, None]:
        """Each piece, and a clf or combined block's `_scan` (None for the others)."""
        clf = self.format in ("clf", "combined")
        for piece in pieces:
            yield piece, (_scan(piece) if clf and isinstance(piece, _Block) else None)

    def _count_late(self, order: _Reorder, rows: _Rows, block: _Block) -> None:
        late = order.late(rows.time_ns)
        if late.any():
            problems = self.problems
            index = np.flatnonzero(late)
            problems.late += len(index)
            for k in index[: EXAMPLES_PER_REASON - len(problems.late_examples)]:
                at = int(rows.line[k]) - block.first
                problems.late_examples.append(
                    (int(rows.line[k]), "late", _excerpt(block.line(at)))
                )

    def _frame(self, rows: _Rows, identities: _Identities) -> pd.DataFrame:
        n = len(rows)
        columns = {
            "time": _floor_ms_exact(rows.time_ns),
            "identity": identities.of(rows.code, self.identity_dtype),
            "cost": rows.cost,
            "replica": np.zeros(n, dtype=np.int64),
        }
        for k, name in enumerate(self.fields):
            columns[name] = pd.array(rows.fields[:, k], dtype="str")
        return pd.DataFrame(columns, index=pd.RangeIndex(n))


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
                **{name: pd.array([], dtype="str") for name in reader.fields},
            }
        )
    return trace, reader.problems


def _field_names(fields: Sequence[str]) -> tuple[str, ...]:
    """`fields=` checked: names (one name alone too), none a trace column, each once."""
    names = (fields,) if isinstance(fields, str) else tuple(fields)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"fields must be field names, got {name!r}")
        if name in TRACE_COLUMNS:
            raise ValueError(f"fields cannot name {name!r}: the trace has its own {name!r} column")
    return tuple(dict.fromkeys(names))
