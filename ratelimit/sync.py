"""The four limiters for a synchronous `redis.Redis` client, same scripts and rules.

from ratelimit.sync import SlidingWindowLimiter, connect_sync
limiter = SlidingWindowLimiter(connect_sync(), 1, 10)
limiter.check("api-key-123")

What a check sends is `ratelimit.plan`'s, as for the asyncio limiters; this module
only sends and receives. `wait_replicas=N` follows each script with `WAIT` as in
`ratelimit.limiters`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from types import TracebackType
from typing import Any, Self

import redis.exceptions

from . import algorithms, cluster_client, lanes, plan
from . import clock as clocks
from ._core import LEASE_RELEASE, LEASE_RENEW, UNAVAILABLE, LeaseCore, LimiterBase, log
from .algorithms import DEFAULT_LOG_STORAGE, LogStorage
from .backends import SyncClient, bounded_client, connect_sync
from .decision import Decision
from .policy import GcraPolicy, LogPolicy, OnError
from .rates import Rate
from .tiers import TierAlgorithm, TieredCore

RETRY_WITHIN = 0.1  # share of the timeout within which a failed attempt is retried

__all__ = [
    "ConcurrencyLimiter",
    "FixedWindowLimiter",
    "SlidingWindowCounterLimiter",
    "SlidingWindowLimiter",
    "SyncLimiter",
    "TieredLimiter",
    "TokenBucketLimiter",
    "connect_sync",
]


class SyncLimiter(LimiterBase):
    """Shared `check` for the synchronous limiters. A limiter is a context manager:
    leaving it calls `close()`."""

    _asyncio = False

    def __init__(
        self,
        redis: SyncClient,
        window_seconds: int | str | Rate | None = None,
        limit: int | None = None,
        prefix: str = "rl",
        *,
        window_ms: int | None = None,
        clock: clocks.Clock = clocks.DEFAULT,
        on_error: OnError = "raise",
        timeout: float = 1.0,
        readable_keys: bool = False,
        plain_keys: bool = False,
        key_secret: bytes | None = None,
        ttl_slack_ms: int | None = None,
        clock_tolerance_ms: int | None = None,
        near_cache: bool | int = False,
        wait_replicas: int = 0,
    ) -> None:
        super().__init__(
            redis, window_seconds, limit, prefix, window_ms=window_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys, plain_keys=plain_keys,
            key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms, near_cache=near_cache,
            wait_replicas=wait_replicas,
        )  # fmt: skip
        # A blocking call cannot be cut short, and a retry gets a full socket timeout
        # of its own, so only a connection that failed at once (closed by a restart)
        # is retried: that keeps a whole check within about 1.1 x timeout.
        self._retry_within = RETRY_WITHIN * self.timeout
        self._lane = None if self._on_cluster else lanes.sync_lane(self._client, self.timeout)
        self._elsewhere = (
            partial(cluster_client.send, self._client) if self._on_cluster else self._through_client
        )

    def _client_for_script(self, redis: Any) -> Any:
        return bounded_client(redis, self.timeout)

    def check(self, identity: str | bytes, cost: int = 1) -> Decision:
        """Admit or reject one request; see `ratelimit.limiters.AsyncLimiter.check`."""
        keys, args = self._prepare(identity, cost)
        cached, sent = self._lookup(keys, args)
        if cached is not None:
            return cached  # a rejection Redis gave still stands: no round trip
        try:
            reply = self._judge(plan.run(self._check_plan(keys, args), self._send, keys[0]))
        except UNAVAILABLE as exc:
            return self._unavailable(exc)
        return self._decided(reply, keys, args, sent)

    def peek(self, identity: str | bytes, cost: int = 1) -> Decision:
        """What `check(identity, cost)` would return now, changing nothing in Redis; see
        `ratelimit.limiters.AsyncLimiter.peek`."""
        keys, args = self._prepare(identity, cost)
        cached, sent = self._lookup(keys, args)
        if cached is not None:
            return cached  # what check would answer too
        try:
            result = plan.run(self._peek_plan(keys, args), self._send, keys[0])
            reply = self._peek_reply(result)
        except UNAVAILABLE as exc:
            return self._peek_unavailable(exc)
        return self._peeked(reply, keys, args, sent)

    def reset(self, identity: str | bytes) -> bool:
        """Forget `identity` under this limiter (a fresh budget); True when there was
        state to delete; see `ratelimit.limiters.AsyncLimiter.reset`."""
        keys = self._reset_keys(identity)
        try:
            return self._reset_done(plan.run(self._reset_plan(keys), self._send, keys[0]))
        except UNAVAILABLE as exc:
            raise self._reset_failed(exc) from exc

    def check_many(
        self, identities: Iterable[str | bytes], costs: int | Iterable[int] = 1
    ) -> list[Decision]:
        """Decide several requests in one pipelined round trip; see
        `ratelimit.limiters.AsyncLimiter.check_many`."""
        batch = self._prepare_many(identities, costs)
        if not batch:
            return []
        calls = self._calls(batch)
        try:
            if self._on_cluster:
                results = cluster_client.run_batch(
                    self._client, calls, self._wait, self._count_resends
                )
            else:
                steps = plan.batch(
                    calls, self._wait, self._retry_within, resent=self._count_resends
                )
                results = plan.run(steps, self._send, None)
            replies = self._judged(results)
        except UNAVAILABLE as exc:
            return [self._unavailable(exc) for _ in batch]
        return self._decisions(replies, batch)

    def close(self) -> None:
        """Close the connections this limiter made: its client's copy with the
        limiter's timeout (limiters with the same client and timeout share it and
        reconnect on their next check), and those its lane keeps."""
        if self._lane is not None:
            self._lane.close()
        if self._client is not self.redis:
            if self._on_cluster:
                self._client.close()
            else:
                self._client.connection_pool.disconnect()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _send(self, key: Any, commands: plan.Commands) -> Any:
        """One round trip: the replies (error replies in place), or what stopped it."""
        try:
            return self._route()(key, commands)
        except Exception as exc:
            return exc

    def _through_client(self, key: Any, commands: plan.Commands) -> list[Any]:
        if self._pipelines(commands):
            replies: list[Any] = self._pipeline_of(commands).execute(raise_on_error=False)
            return replies
        return [self._in_place(command) for command in commands]

    def _in_place(self, command: tuple[Any, ...]) -> Any:
        try:
            return self._client.execute_command(*command)
        except redis.exceptions.ResponseError as exc:  # an error reply
            return exc


class SlidingWindowLimiter(LogPolicy, SyncLimiter):
    """Sliding-window log: exact. `storage="compact"` (the default) keeps about 6 bytes per
    admitted unit of cost; `storage="sorted-set"` one sorted-set member per unit."""

    def __init__(
        self,
        redis: SyncClient,
        window_seconds: int | str | Rate | None = None,
        limit: int | None = None,
        prefix: str = "rl",
        *,
        window_ms: int | None = None,
        clock: clocks.Clock = clocks.DEFAULT,
        on_error: OnError = "raise",
        timeout: float = 1.0,
        readable_keys: bool = False,
        plain_keys: bool = False,
        key_secret: bytes | None = None,
        ttl_slack_ms: int | None = None,
        clock_tolerance_ms: int | None = None,
        storage: LogStorage = DEFAULT_LOG_STORAGE,
        near_cache: bool | int = False,
        wait_replicas: int = 0,
    ) -> None:
        self._use_storage(storage)
        super().__init__(
            redis, window_seconds, limit, prefix, window_ms=window_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys, plain_keys=plain_keys,
            key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms, near_cache=near_cache,
            wait_replicas=wait_replicas,
        )  # fmt: skip


class FixedWindowLimiter(SyncLimiter):
    """Fixed window: one counter per aligned window; up to 2x the limit at a boundary."""

    algorithm = algorithms.FIXED_WINDOW


class SlidingWindowCounterLimiter(SyncLimiter):
    """Sliding-window counter: the previous window weighted by overlap; O(1), approximate."""

    algorithm = algorithms.SLIDING_WINDOW_COUNTER


class TokenBucketLimiter(GcraPolicy, SyncLimiter):
    """Token bucket as GCRA: `limit` per window sustained, `burst` at once (default limit)."""

    algorithm = algorithms.GCRA

    def __init__(
        self,
        redis: SyncClient,
        window_seconds: int | str | Rate | None = None,
        limit: int | None = None,
        prefix: str = "rl",
        *,
        window_ms: int | None = None,
        clock: clocks.Clock = clocks.DEFAULT,
        on_error: OnError = "raise",
        timeout: float = 1.0,
        readable_keys: bool = False,
        plain_keys: bool = False,
        key_secret: bytes | None = None,
        ttl_slack_ms: int | None = None,
        clock_tolerance_ms: int | None = None,
        burst: int | None = None,
        near_cache: bool | int = False,
        wait_replicas: int = 0,
    ) -> None:
        self._use_burst(burst)
        super().__init__(
            redis, window_seconds, limit, prefix, window_ms=window_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys, plain_keys=plain_keys,
            key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms, near_cache=near_cache,
            wait_replicas=wait_replicas,
        )  # fmt: skip


class ConcurrencyLimiter(LeaseCore, SyncLimiter):
    """At most `limit` requests of an identity in flight at once; see
    `ratelimit.limiters.ConcurrencyLimiter`.

        with limiter.hold("api-key-123") as decision:
            if not decision.allowed: ...
    """

    def __init__(
        self,
        redis: SyncClient,
        limit: int = 4,
        lease_seconds: float | None = None,
        prefix: str = "rl",
        *,
        lease_ms: int | None = None,
        clock: clocks.Clock = "redis",
        on_error: OnError = "raise",
        timeout: float = 1.0,
        readable_keys: bool = False,
        plain_keys: bool = False,
        key_secret: bytes | None = None,
        ttl_slack_ms: int | None = None,
        clock_tolerance_ms: int | None = None,
        near_cache: bool | int = False,
        wait_replicas: int = 0,
    ) -> None:
        super().__init__(
            redis, limit, lease_seconds, prefix, lease_ms=lease_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys,
            plain_keys=plain_keys, key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms, near_cache=near_cache,
            wait_replicas=wait_replicas,
        )  # fmt: skip

    def acquire(self, identity: str | bytes) -> Decision:
        """Take a lease; see `ratelimit.limiters.ConcurrencyLimiter.acquire`."""
        return self.check(identity)

    def peek(self, identity: str | bytes, cost: int = 1) -> Decision:
        """Not for leases: a lease is taken or not, there is no budget to preview (and
        the lease script has no read-only path). TypeError."""
        raise TypeError(
            "ConcurrencyLimiter has no peek: acquire a lease, or count the identity's "
            "leases with ZCARD on limiter.key_for(identity)"
        )

    def release(self, identity: str | bytes, lease: str | None) -> bool:
        """End a lease; see `ratelimit.limiters.ConcurrencyLimiter.release`."""
        if lease is None:
            return False
        return self._end(identity, lease, LEASE_RELEASE)

    def renew(self, identity: str | bytes, lease: str) -> bool:
        """Extend a held lease; see `ratelimit.limiters.ConcurrencyLimiter.renew`."""
        return self._end(identity, lease, LEASE_RENEW)

    def _end(self, identity: str | bytes, lease: str, op: int) -> bool:
        keys, args = self._lease_call(identity, lease, op)
        try:
            reply = self._judge(plan.run(self._check_plan(keys, args), self._send, keys[0]))
        except UNAVAILABLE as exc:
            return self._unreleased(exc)
        return self._ended(reply)

    @contextmanager
    def hold(self, identity: str | bytes) -> Iterator[Decision]:
        """`acquire` on entry, `release` on exit; see
        `ratelimit.limiters.ConcurrencyLimiter.hold`."""
        decision = self.acquire(identity)
        try:
            yield decision
        finally:
            if decision.lease is not None:
                try:
                    self.release(identity, decision.lease)
                except Exception as exc:  # on_error="raise": the lease expires by itself
                    log.warning("lease not released (it expires by itself): %s", exc)


class TieredLimiter(TieredCore, SyncLimiter):
    """Several limits on one identity at once, decided by one atomic script: a request
    is admitted only if every tier admits it, and a rejected one spends nothing.

        limiter = TieredLimiter(redis, ["10/s", "1000/h"])      # or "10/s; 1000/h"
        decision = limiter.check("api-key-123")
        limiter.rates[decision.tier]                            # the tier that binds

    `rates` are sorted shortest window first, one tier per window; every tier runs
    `algorithm` ("log", the default, in `storage`; "fw", "swc" or "gcra") in its own
    key, the key a single-rate limiter of that algorithm and window would use. The
    decision is the binding tier's: for a rejection the one that asks the longest
    wait, for an admission the one with the fewest units left. Takes the limiters'
    options, except `near_cache` and `plain_keys` (each tier needs a key of its own).
    """

    def __init__(
        self,
        redis: SyncClient,
        rates: str | Rate | Iterable[str | Rate],
        prefix: str = "rl",
        *,
        algorithm: TierAlgorithm = "log",
        storage: LogStorage | None = None,
        clock: clocks.Clock = clocks.DEFAULT,
        on_error: OnError = "raise",
        timeout: float = 1.0,
        readable_keys: bool = False,
        plain_keys: bool = False,
        key_secret: bytes | None = None,
        ttl_slack_ms: int | None = None,
        clock_tolerance_ms: int | None = None,
        near_cache: bool | int = False,
        wait_replicas: int = 0,
    ) -> None:
        super().__init__(
            redis, rates, prefix, algorithm=algorithm, storage=storage, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys,
            plain_keys=plain_keys, key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms, near_cache=near_cache,
            wait_replicas=wait_replicas,
        )  # fmt: skip
