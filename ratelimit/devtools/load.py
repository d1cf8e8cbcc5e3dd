"""A bounded HTTP load generator on loopback: N connections, a fixed count or duration.

    plan = lambda i: (f"/tiles/3/{i % 8}/0.png", f"key-{i % 4}")   # path, API key
    result = asyncio.run(run_load(server.url, plan, connections=8, duration_s=3))
    result.statuses()          # {200: ..., 429: ...}

Each of `connections` asyncio tasks keeps one keep-alive connection busy (an httpx
`AsyncClient` with that many connections), sending request `i` as `plan(i)` says (the
API key goes in `x-api-key`; None sends none), until `total` requests were sent or
`duration_s` passed, whichever comes first. `rate` paces the requests (that many per
second across all connections, request `i` no earlier than `i / rate` s after the
start) for a steady load; without it every connection sends as fast as it is answered.

`clients` sends on connections the caller opened instead (one task per client, each
an httpx `AsyncClient` of one connection, e.g. kept on one server process of several:
which process accepts a new connection is the kernel's choice); the caller closes them.

Every answer is kept as an `Outcome`: its status (0 when the request failed in
transit, with the error), its latency, when it was sent, and, when asked for, its
headers and body. A run never outlives its bound by more than one request's timeout.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

__all__ = ["LoadResult", "Outcome", "Plan", "percentile", "run_load"]

Plan = Callable[[int], tuple[str, str | None]]  # request index -> (path, API key or None)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request's answer."""

    index: int
    path: str
    api_key: str | None
    status: int  # 0: no answer (see `error`)
    sent_s: float  # when it was sent, seconds after the run started
    latency_s: float
    headers: dict[str, str] | None = None  # lower-case names, when kept
    body: bytes | None = None  # when kept
    error: str | None = None


@dataclass
class LoadResult:
    """Every outcome of one run, and how long the run took."""

    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    def statuses(self) -> dict[int, int]:
        """How many answers of each status (0: failed in transit)."""
        return dict(sorted(Counter(o.status for o in self.outcomes).items()))

    def latencies_ms(self) -> list[float]:
        """The latencies of the answered requests, in ms, sorted."""
        return sorted(o.latency_s * 1000 for o in self.outcomes if o.status)

    @property
    def per_s(self) -> float:
        """Answers per second over the run."""
        return len(self.outcomes) / self.seconds if self.seconds > 0 else 0.0


def percentile(sorted_values: list[float], q: float) -> float:
    """The `q`-th percentile (0-100) of ascending values, by the nearest rank."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be from 0 to 100, got {q!r}")
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def _positive(name: str, value: float | None, integer: bool) -> None:
    if value is None:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        what = "an int" if integer else "a number"
        raise ValueError(f"{name} must be {what} > 0, got {value!r}")


async def run_load(
    base_url: str,
    plan: Plan,
    *,
    connections: int,
    total: int | None = None,
    duration_s: float | None = None,
    rate: float | None = None,
    keep_headers: bool = False,
    keep_bodies: bool = False,
    timeout: float = 5.0,
    clients: Sequence[httpx.AsyncClient] | None = None,
) -> LoadResult:
    """Send requests to `base_url` until `total` were sent or `duration_s` passed (see
    the module doc); at least one bound is required. With `clients`, `connections` is
    their number and `timeout` theirs."""
    _positive("connections", connections, integer=True)
    if clients is not None and len(clients) != connections:
        raise ValueError(f"connections must be the number of clients, {len(clients)}")
    _positive("total", total, integer=True)
    _positive("duration_s", duration_s, integer=False)
    _positive("rate", rate, integer=False)
    _positive("timeout", timeout, integer=False)
    if total is None and duration_s is None:
        raise ValueError("give total or duration_s (or both): a run must be bounded")
    result = LoadResult()
    next_index = 0
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    base = base_url.rstrip("/")
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as shared:
        start = time.perf_counter()
        end = start + duration_s if duration_s is not None else float("inf")

        async def connection(client: httpx.AsyncClient) -> None:
            nonlocal next_index
            while True:
                i = next_index
                if total is not None and i >= total:
                    return
                next_index = i + 1  # claimed before any await: no other task takes i
                if rate is not None:
                    wait = start + i / rate - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                if time.perf_counter() >= end:
                    return
                path, api_key = plan(i)
                headers = {"x-api-key": api_key} if api_key is not None else None
                sent = time.perf_counter()
                try:
                    response = await client.get(base + path, headers=headers)
                except httpx.HTTPError as exc:
                    outcome = Outcome(
                        i, path, api_key, 0, sent - start, time.perf_counter() - sent,
                        error=f"{type(exc).__name__}: {exc}",
                    )  # fmt: skip
                else:
                    outcome = Outcome(
                        i, path, api_key, response.status_code, sent - start,
                        time.perf_counter() - sent,
                        headers=dict(response.headers) if keep_headers else None,
                        body=response.content if keep_bodies else None,
                    )  # fmt: skip
                result.outcomes.append(outcome)

        await asyncio.gather(*(connection(c) for c in clients or [shared] * connections))
        result.seconds = time.perf_counter() - start
    result.outcomes.sort(key=lambda o: o.index)
    return result


LOCAL_URL = "redis://127.0.0.1:6379/0"


def load_url(given: str | None) -> str:
    """The Redis a load tool sends to: `given`, else REDIS_URL, else the local default.

    It says which on stderr, so no load lands on a Redis nobody named without a word.
    """
    from ratelimit.backends import configured_url, redact_url

    if given:
        url, why = given, "--redis-url"
    elif (named := configured_url()) is not None:
        url, why = named, "REDIS_URL"
    else:
        url, why = LOCAL_URL, "the default: neither --redis-url nor REDIS_URL names one"
    print(f"load on the Redis at {redact_url(url)} ({why})", file=sys.stderr, flush=True)
    return url
