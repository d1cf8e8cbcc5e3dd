"""The fields of a jsonl or csv record: looking a field up, and reading a cost or a
time from its value."""

from __future__ import annotations

import csv
import decimal
import json
import numbers
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from .problems import _NO_NS


def _lookup(record: Mapping[str, Any], name: str) -> Any:
    """A field of a record (a jsonl or csv line, or a line's fields); a dotted name
    reaches into nested objects. Missing: None."""
    if name in record:
        return record[name]
    value: Any = record
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
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
    if abs(value) >= 2**63:  # beyond any time; and 1E+999999999 must not be expanded
        return None
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


def _csv_row(line: str, header: list[str]) -> dict[str, str] | None:
    try:
        row = next(csv.reader([line]))
    except csv.Error:
        return None
    return dict(zip(header, row, strict=True)) if len(row) == len(header) else None


def _text(value: Any) -> str:
    """A jsonl or csv value as text: strings as they are, numbers as written, true and
    false, nested objects as JSON; "" when missing."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)
