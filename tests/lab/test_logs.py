"""`ratelimit.lab.logs.collected`: the limiter's warnings, kept out of the output."""

from __future__ import annotations

import logging

from ratelimit.lab import logs


def test_records_are_collected_and_kept_from_other_handlers(capsys, caplog):
    with logs.collected("ratelimit") as records:
        logging.getLogger("ratelimit").warning("degraded: %s", "port 1234")
        logging.getLogger("ratelimit.http").warning("answered 503")
        logging.getLogger("ratelimit").info("below the level")
    assert [(r.name, r.getMessage()) for r in records] == [
        ("ratelimit", "degraded: port 1234"),
        ("ratelimit.http", "answered 503"),
    ]
    assert caplog.records == [] and capsys.readouterr().err == ""
    # Afterwards the logger is as it was: records propagate again.
    logging.getLogger("ratelimit").warning("after")
    assert [r.getMessage() for r in caplog.records] == ["after"]
