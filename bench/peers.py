"""Other rate limiters on the same server, each asked for one check of a limit that admits.

- the `limits` library, async storage on redis-py (`implementation="redispy"`):
  its moving window (an exact log kept in a list) and sliding-window counter;
- throttled-py (asyncio API, its Redis store on redis-py): sliding window (a weighted
  counter of two windows) and GCRA;
- the classic recipe (`classic.py`), a new limiter object per request.

Every peer gets its own redis-py asyncio client for the same URL with the same
socket timeout as ours (hiredis parser when installed, as ours), its own key prefix
under the run's prefix, and the same limit and window. A peer whose package is not
installed, or that needs a server URL when only fakeredis is there, is skipped with
the reason, never silently left out.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ratelimit.lab.classic import ClassicSlidingLog

Checker = Callable[[str], Awaitable[Any]]  # one check for an identity


@dataclass
class Peer:
    """A peer's check, how to read "admitted" from its answer, and our like-for-like case."""

    check: Checker
    admitted: Callable[[Any], bool]
    counterpart: str  # our limiter class implementing the same algorithm
    closers: list[Callable[[], Awaitable[Any]]] = field(default_factory=list)


# Peer name -> our limiter implementing the same algorithm (the fair comparison).
COUNTERPARTS = {
    "limits moving window": "SlidingWindowLimiter",
    "limits sliding-window counter": "SlidingWindowCounterLimiter",
    "throttled-py sliding window": "SlidingWindowCounterLimiter",
    "throttled-py GCRA": "TokenBucketLimiter",
    "classic recipe": "SlidingWindowLimiter",
}


def _import(name: str) -> Any:
    return importlib.import_module(name)


def _limits_peers(url: str, prefix: str, limit: int, timeout: float) -> dict[str, Peer]:
    limits = _import("limits")
    storage_mod = _import("limits.aio.storage")
    strategies = _import("limits.aio.strategies")
    storage = storage_mod.RedisStorage(
        "async+" + url,
        implementation="redispy",
        key_prefix=f"{prefix}:limits",
        socket_timeout=timeout,
    )
    item = limits.RateLimitItemPerSecond(limit)
    moving = strategies.MovingWindowRateLimiter(storage)
    counter = strategies.SlidingWindowCounterRateLimiter(storage)

    async def close() -> None:
        client = getattr(getattr(storage, "bridge", None), "storage", None)
        if client is not None:
            await client.aclose()

    return {
        "limits moving window": Peer(
            lambda who: moving.hit(item, who), bool, COUNTERPARTS["limits moving window"], [close]
        ),
        "limits sliding-window counter": Peer(
            lambda who: counter.hit(item, who), bool, COUNTERPARTS["limits sliding-window counter"]
        ),
    }


def _throttled_peers(url: str, prefix: str, limit: int, timeout: float) -> dict[str, Peer]:
    ta = _import("throttled.asyncio")
    store = ta.RedisStore(server=url, options={"SOCKET_TIMEOUT": timeout})
    quota = ta.rate_limiter.per_sec(limit)
    peers = {}
    for name, using in (
        ("throttled-py sliding window", ta.RateLimiterType.SLIDING_WINDOW.value),
        ("throttled-py GCRA", ta.RateLimiterType.GCRA.value),
    ):
        limiter = ta.Throttled(using=using, quota=quota, store=store, key_prefix=f"{prefix}:tp")
        peers[name] = Peer(limiter.limit, lambda result: not result.limited, COUNTERPARTS[name])

    async def close() -> None:
        await store._backend.get_client().aclose()

    peers["throttled-py GCRA"].closers.append(close)
    return peers


def build(
    client: Any, url: str | None, prefix: str, limit: int, timeout: float = 1.0
) -> tuple[dict[str, Peer], dict[str, str]]:
    """The peers that can run here, and a reason for each one that cannot."""
    peers: dict[str, Peer] = {}
    skipped: dict[str, str] = {}
    for names, package, factory in (
        (("limits moving window", "limits sliding-window counter"), "limits", _limits_peers),
        (("throttled-py sliding window", "throttled-py GCRA"), "throttled-py", _throttled_peers),
    ):
        if url is None:
            for name in names:
                skipped[name] = "skipped: needs a real Redis URL (running on embedded fakeredis)"
            continue
        try:
            peers.update(factory(url, prefix, limit, timeout))
        except ImportError as exc:
            for name in names:
                skipped[name] = (
                    f"skipped: {package} is not installed ({exc}); "
                    "pip install -e '.[bench]' brings it"
                )

    # The recipe runs on our own client: it is code an application would write around it.
    def classic(who: str) -> Awaitable[bool]:
        # A new object per request, as a route that builds the recipe inside itself.
        recipe = ClassicSlidingLog(client, 1, limit, prefix=f"{prefix}:classic")
        return recipe.check_transaction(who)

    peers["classic recipe"] = Peer(classic, bool, COUNTERPARTS["classic recipe"])
    return peers, skipped


async def close_all(peers: dict[str, Peer]) -> None:
    """Close what the peers opened (their own clients)."""
    for peer in peers.values():
        for close in peer.closers:
            await close()
