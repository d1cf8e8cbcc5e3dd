"""Other rate limiters on the same server, each asked for one check at a time.

- the `limits` library, on redis-py: its moving window (an exact log kept in a list)
  and sliding-window counter; async storage (`implementation="redispy"`) in `build`,
  `limits.storage.RedisStorage` with `limits.strategies` in `build_sync`;
- throttled-py (its Redis store on redis-py; `throttled.asyncio.Throttled` in `build`,
  `throttled.Throttled` in `build_sync`): sliding window (a weighted counter of two
  windows) and GCRA;
- the classic recipe (`classic.py`), a new limiter object per request (async only).

Every peer gets its own redis-py client for the same URL with the same socket
timeout as ours (hiredis parser when installed, as ours), its own key prefix under
the run's prefix, and the same limit and window (`limit` per `window_s` seconds;
GCRA with a burst of the whole limit, as ours). A peer whose package is not
installed, or that needs a server URL when only fakeredis is there, is skipped with
the reason, never silently left out.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ratelimit.lab.classic import ClassicSlidingLog

Checker = Callable[[str], Awaitable[Any]]  # one check for an identity


@dataclass
class Peer:
    """A peer's check, how to read "admitted" from its answer, and our like-for-like case."""

    check: Checker  # in `build_sync`'s peers a plain function
    admitted: Callable[[Any], bool]
    counterpart: str  # our limiter class implementing the same algorithm
    closers: list[Callable[[], Any]] = field(default_factory=list)


# Peer name -> our limiter implementing the same algorithm (the fair comparison).
COUNTERPARTS = {
    "limits moving window": "SlidingWindowLimiter",
    "limits sliding-window counter": "SlidingWindowCounterLimiter",
    "throttled-py sliding window": "SlidingWindowCounterLimiter",
    "throttled-py GCRA": "TokenBucketLimiter",
    "classic recipe": "SlidingWindowLimiter",
}
CLASSIC = "classic recipe"  # a recipe, not a library: judged on its own (targets.py)


def _import(name: str) -> Any:
    return importlib.import_module(name)


def _limits_peers(
    url: str, prefix: str, limit: int, window_s: int, timeout: float
) -> dict[str, Peer]:
    limits = _import("limits")
    storage_mod = _import("limits.aio.storage")
    strategies = _import("limits.aio.strategies")
    storage = storage_mod.RedisStorage(
        "async+" + url,
        implementation="redispy",
        key_prefix=f"{prefix}:limits",
        socket_timeout=timeout,
    )
    item = limits.RateLimitItemPerSecond(limit, window_s)
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


def _limits_peers_sync(
    url: str, prefix: str, limit: int, window_s: int, timeout: float
) -> dict[str, Peer]:
    limits = _import("limits")
    storage_mod = _import("limits.storage")
    strategies = _import("limits.strategies")
    storage = storage_mod.RedisStorage(url, key_prefix=f"{prefix}:limits", socket_timeout=timeout)
    item = limits.RateLimitItemPerSecond(limit, window_s)
    moving = strategies.MovingWindowRateLimiter(storage)
    counter = strategies.SlidingWindowCounterRateLimiter(storage)
    return {
        "limits moving window": Peer(
            lambda who: moving.hit(item, who),
            bool,
            COUNTERPARTS["limits moving window"],
            [storage.storage.close],
        ),
        "limits sliding-window counter": Peer(
            lambda who: counter.hit(item, who), bool, COUNTERPARTS["limits sliding-window counter"]
        ),
    }


def _throttled_kinds(module: Any) -> tuple[tuple[str, str], ...]:
    kinds = module.RateLimiterType
    return (
        ("throttled-py sliding window", kinds.SLIDING_WINDOW.value),
        ("throttled-py GCRA", kinds.GCRA.value),
    )


def _throttled(
    module: str, url: str, prefix: str, limit: int, window_s: int, timeout: float
) -> tuple[dict[str, Peer], Any]:
    """throttled-py's peers from `module` (its asyncio or sync API), and their store."""
    tp = _import(module)
    store = tp.RedisStore(server=url, options={"SOCKET_TIMEOUT": timeout})
    quota = tp.rate_limiter.per_duration(timedelta(seconds=window_s), limit)
    peers = {}
    for name, using in _throttled_kinds(tp):
        limiter = tp.Throttled(using=using, quota=quota, store=store, key_prefix=f"{prefix}:tp")
        peers[name] = Peer(limiter.limit, lambda result: not result.limited, COUNTERPARTS[name])
    return peers, store


def _throttled_peers(
    url: str, prefix: str, limit: int, window_s: int, timeout: float
) -> dict[str, Peer]:
    peers, store = _throttled("throttled.asyncio", url, prefix, limit, window_s, timeout)

    async def close() -> None:
        await store._backend.get_client().aclose()

    peers["throttled-py GCRA"].closers.append(close)
    return peers


def _throttled_peers_sync(
    url: str, prefix: str, limit: int, window_s: int, timeout: float
) -> dict[str, Peer]:
    peers, store = _throttled("throttled", url, prefix, limit, window_s, timeout)
    peers["throttled-py GCRA"].closers.append(lambda: store._backend.get_client().close())
    return peers


_PACKAGES = (
    (("limits moving window", "limits sliding-window counter"), "limits"),
    (("throttled-py sliding window", "throttled-py GCRA"), "throttled-py"),
)


def _build(
    factories: tuple[Callable[..., dict[str, Peer]], ...],
    url: str | None,
    prefix: str,
    limit: int,
    window_s: int,
    timeout: float,
) -> tuple[dict[str, Peer], dict[str, str]]:
    peers: dict[str, Peer] = {}
    skipped: dict[str, str] = {}
    for (names, package), factory in zip(_PACKAGES, factories, strict=True):
        if url is None:
            for name in names:
                skipped[name] = "skipped: needs a real Redis URL (running on embedded fakeredis)"
            continue
        try:
            peers.update(factory(url, prefix, limit, window_s, timeout))
        except ImportError as exc:
            for name in names:
                skipped[name] = (
                    f"skipped: {package} is not installed ({exc}); "
                    "pip install -e '.[bench]' brings it"
                )
    return peers, skipped


def build(
    client: Any,
    url: str | None,
    prefix: str,
    limit: int,
    timeout: float = 1.0,
    window_s: int = 1,
) -> tuple[dict[str, Peer], dict[str, str]]:
    """The async peers that can run here, and a reason for each one that cannot."""
    peers, skipped = _build(
        (_limits_peers, _throttled_peers), url, prefix, limit, window_s, timeout
    )

    # The recipe runs on our own client: it is code an application would write around it.
    def classic(who: str) -> Awaitable[bool]:
        # A new object per request, as a route that builds the recipe inside itself.
        recipe = ClassicSlidingLog(client, window_s, limit, prefix=f"{prefix}:classic")
        return recipe.check_transaction(who)

    peers[CLASSIC] = Peer(classic, bool, COUNTERPARTS[CLASSIC])
    return peers, skipped


def build_sync(
    url: str | None, prefix: str, limit: int, timeout: float = 1.0, window_s: int = 1
) -> tuple[dict[str, Peer], dict[str, str]]:
    """The sync peers (the libraries' blocking APIs) that can run here, and why not."""
    return _build(
        (_limits_peers_sync, _throttled_peers_sync), url, prefix, limit, window_s, timeout
    )


async def close_all(peers: dict[str, Peer]) -> None:
    """Close what the peers opened (their own clients)."""
    for peer in peers.values():
        for close in peer.closers:
            await close()


def close_all_sync(peers: dict[str, Peer]) -> None:
    for peer in peers.values():
        for close in peer.closers:
            close()
