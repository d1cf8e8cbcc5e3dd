"""The log formats, their field names, and telling them apart from a file's first
non-blank lines (`detect_format`)."""

from __future__ import annotations

import csv
import decimal
import json
import re
from pathlib import Path

from . import blocks
from .blocks import _Gunzip, _lines_of, _open
from .clf import _AGENT, _scan
from .problems import _BAD_TIME, _OK, _PARTIAL, LogFormatError, _excerpt

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
SAMPLE_LINES = 20
"""Non-blank lines read to detect the format and the fields."""

DETECT_SHARE = 0.25
"""A format is detected when at least this share of the sample lines fit it (the rest
are bad lines)."""

WIDE_SAMPLE_LINES = 1000
"""When the first lines fit no format, lines sampled from the first `HEAD_BYTES` (and as
many again from across the rest of a plain file) to judge by instead."""

HEAD_BYTES = 4 * blocks.MAX_LINE_BYTES
"""Bytes read at the start of the file to sample its lines."""

BINARY_SHARE = 0.5
"""A file is refused as binary when more than this share of its first 64 KiB is not
text (NUL and other control bytes, invalid UTF-8); below it, binary bytes only spoil
the lines they are in."""


def _head_bytes(path: Path) -> bytes:
    """The file's first `HEAD_BYTES` (uncompressed), after checking that it is a file
    of text with something in it."""
    path = Path(path)
    if not path.is_file():
        raise LogFormatError(f"{path}: no such log file")
    stream, raw = _open(path)
    try:
        head = stream.read(HEAD_BYTES)
    finally:
        stream.close()
        raw.close()
    if not head and isinstance(stream, _Gunzip) and stream.error:
        raise LogFormatError(
            f"{path} is a gzip file with no line that can be read: {stream.error} at byte "
            f"{stream.offset:,} of {stream.size:,}"
        )
    if not head:
        raise LogFormatError(f"{path} is empty: there are no log lines to read")
    probe = head[:65536]
    text = probe.decode("utf-8", "replace")
    odd = sum(1 for c in text if c == "\ufffd" or (c < " " and c not in "\t\n\r\f"))
    if odd > len(text) * BINARY_SHARE:
        nul = probe.find(b"\x00")
        where = f"; a NUL byte at offset {nul}" if nul >= 0 else ""
        raise LogFormatError(
            f"{path} is not a text log: it holds binary data ({odd / len(text):.0%} of its "
            f"first {len(probe):,} bytes{where})"
        )
    return head


def _nonblank(data: bytes, first: int = 1) -> list[tuple[int, str]]:
    """The non-blank lines of `data` (whole lines), numbered from `first`."""
    return [
        (number, line.rstrip(b"\r").decode("utf-8", "backslashreplace"))
        for number, line in enumerate(data.split(b"\n"), first)
        if line.strip()
    ]


def _whole(head: bytes) -> bytes:
    return head if len(head) < HEAD_BYTES else head[: head.rfind(b"\n") + 1]


def _head(path: Path) -> list[tuple[int, str]]:
    """The first non-blank lines (line number, text), after checking that the file is a
    text file with something in it."""
    head = _whole(_head_bytes(path))
    lines = []
    for number, line in enumerate(head.split(b"\n"), 1):
        if line.strip():
            lines.append((number, line.rstrip(b"\r").decode("utf-8", "backslashreplace")))
            if len(lines) == SAMPLE_LINES:
                break
    if not lines:
        raise LogFormatError(f"{path} has no log lines (only blank lines)")
    return lines


def _wide(path: Path, sample: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """A wider sample than the first lines: those, then up to `WIDE_SAMPLE_LINES` spread
    over the head, and for a plain file as many spread over the rest of it (numbered 0:
    their line numbers are not counted)."""
    head = _whole(_head_bytes(path))
    lines = _nonblank(head)
    step = max(1, len(lines) // WIDE_SAMPLE_LINES)
    out = sample + lines[len(sample) :: step]
    size = path.stat().st_size
    with open(path, "rb") as raw:
        if raw.read(2) == b"\x1f\x8b" or size <= len(head):
            return out
        places = 16
        for k in range(places):
            raw.seek(len(head) + (size - len(head)) * k // places)
            piece = raw.read(65536)
            whole = piece[piece.find(b"\n") + 1 : piece.rfind(b"\n") + 1]
            out += [(0, text) for _, text in _nonblank(whole)][: WIDE_SAMPLE_LINES // places]
    return out


def _sample(path: Path, format: str | None) -> tuple[str, list[tuple[int, str]]]:
    """The log's format (`format`, or detected) and the sample of lines it was judged
    by: the first lines, or a wider sample when they do not settle it, so that a log is
    refused only when few of its lines fit (LogFormatError)."""
    sample = _head(path)
    if format is None:
        scores = _scores(sample)
        if max(scores.values()) < DETECT_SHARE:
            sample = _wide(path, sample)
        return _detect(path, sample), sample
    kind = "clf" if format == "combined" else format
    if _scores(sample)[kind] == 0:
        sample = _wide(path, sample)
        if _scores(sample)[kind] == 0:
            line, text = sample[0]
            raise LogFormatError(
                f"{path} is not a {format} log: none of {len(sample)} non-blank lines "
                f"sampled from it is one; line {line}: {_excerpt(text)!r}"
            )
    return format, sample


def _clf_shapes(sample: list[tuple[int, str]]) -> list[str | None]:
    """Per sample line: "combined", "clf" (the shape, whatever its time says), or None."""
    out: list[str | None] = []
    for _, text in sample:
        block = _lines_of(text.encode("utf-8", "surrogateescape"), 1, True)
        spans, times, verdicts = _scan(block)
        if verdicts[0] not in (_OK, _PARTIAL, _BAD_TIME):
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
    try:
        rows = list(csv.reader([text for _, text in sample]))
    except csv.Error:  # a stray carriage return: not a csv log this reads
        return None
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
    return _sample(Path(path), None)[0]
