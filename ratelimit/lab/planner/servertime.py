"""The server time per check a plan uses: measured now on a Redis, or read from the
latest `make bench` record (`choose_server_time`)."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratelimit import algorithms as registry

from .. import capacity, memory

DEFAULT_ALGORITHMS: tuple[str, ...] = registry.NAMES
_REPO = Path(__file__).resolve().parents[3]


def _shown_path(path: Path) -> str:
    """`path` relative to the repository when it lies inside it: plans and the chapter
    quote no machine's folders."""
    try:
        return path.resolve().relative_to(_REPO).as_posix()
    except ValueError:
        return str(path)


def default_bench_record() -> Path:
    """Where `make bench` records its figures: bench/record.json in this repository."""
    return _REPO / "bench" / "record.json"


def default_memory_table() -> Path:
    """Chapter 3's measured bytes per key, shipped with the lab (`memory.STORED_TABLE`)."""
    return memory.STORED_TABLE


@dataclass(frozen=True)
class ServerTimeChoice:
    """The server time per check a plan uses, and why: `kind` is "measured" (now, on
    the reader's Redis), "bench" (the latest `make bench` record) or "none"; `note`
    says why a measurement was not used ("" when it was)."""

    kind: str
    server_time: capacity.ServerTime | None
    note: str = ""

    def us_per_check(self, algorithm: str) -> float | None:
        if self.server_time is None:
            return None
        return self.server_time.us_per_check.get(algorithm)

    def to_dict(self) -> dict[str, Any]:
        st = self.server_time
        return {
            "kind": self.kind,
            "source": st.source if st is not None else "",
            "date": st.date if st is not None else "",
            "note": self.note,
            "us_per_check": dict(st.us_per_check) if st is not None else {},
        }


def _shown_url(url: str) -> str:
    """The URL without its password, to print."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _measured(
    url: str, names: Sequence[str], checks: int
) -> tuple[capacity.ServerTime | None, str]:
    import redis

    shown = _shown_url(url)
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=10.0)
    except ValueError as exc:
        return None, f"not measured: cannot use the Redis URL {shown!r} ({exc})"
    try:
        try:
            client.ping()
        except (redis.exceptions.RedisError, OSError) as exc:
            return None, f"not measured: no Redis answered at {shown} ({exc})"
        try:
            return capacity.measure_server_time(client, names, checks=checks, where=shown), ""
        except (ValueError, RuntimeError, redis.exceptions.RedisError, OSError) as exc:
            return None, f"not measured: the Redis at {shown} could not be measured ({exc})"
    finally:
        client.close()


def choose_server_time(
    names: Sequence[str] = DEFAULT_ALGORITHMS,
    *,
    redis_url: str | None = None,
    measure: bool = True,
    bench_record: str | Path | None = None,
    checks: int = 2_000,
) -> ServerTimeChoice:
    """Server time per check of `names`: measured on the Redis at `redis_url` (default:
    REDIS_URL; one second to connect) unless `measure` is False, none is named or it
    does not answer, else read from `bench_record` (default: `default_bench_record()`),
    else "none", with a note that says why. Only a Redis someone named is measured on:
    scratch keys on a server nobody pointed the planner at would be a surprise."""
    names = [registry.get(n).name for n in names]
    notes = []
    if measure:
        url = redis_url or os.environ.get("REDIS_URL", "").strip() or None
        if url is None:
            notes.append(
                "not measured: no Redis named; set REDIS_URL or pass --redis URL to measure"
            )
        else:
            measured, why = _measured(url, names, checks)
            if measured is not None:
                return ServerTimeChoice("measured", measured)
            notes.append(why)
    else:
        notes.append("not measured: measure=False (--no-measure)")
    record = Path(bench_record) if bench_record is not None else default_bench_record()
    if not record.exists():
        notes.append(f"no `make bench` record at {record}: run `make bench` or measure on a Redis")
        return ServerTimeChoice("none", None, "; ".join(notes))
    try:
        recorded = capacity.server_time_from_bench(record, names, shown_as=_shown_path(record))
    except (ValueError, KeyError, TypeError) as exc:
        notes.append(f"the `make bench` record at {record} cannot be used ({exc})")
        return ServerTimeChoice("none", None, "; ".join(notes))
    return ServerTimeChoice("bench", recorded, "; ".join(notes))
