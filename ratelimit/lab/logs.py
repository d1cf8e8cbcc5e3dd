"""Collect what the limiter logs, instead of letting it reach a chapter's output.

    with logs.collected("ratelimit") as records:   # ratelimit and ratelimit.http
        ...                                        # checks that degrade log warnings
    len(records), records[0].name                  # the LogRecords, in order

The limiters log a warning for every degraded decision (with ports and error text
that vary by machine); a chapter counts them rather than printing them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collected"]


class _Keep(logging.Handler):
    def __init__(self, records: list[logging.LogRecord], level: int) -> None:
        super().__init__(level)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def collected(
    name: str = "ratelimit", level: int = logging.WARNING
) -> Iterator[list[logging.LogRecord]]:
    """The records logged on `name` (and its children) at `level` or above inside the
    block; they are kept from every other handler until the block ends."""
    records: list[logging.LogRecord] = []
    logger = logging.getLogger(name)
    handler, propagate = _Keep(records, level), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
