"""The four limiters for an asyncio Redis client (`redis.asyncio.Redis`).

    limiter = SlidingWindowLimiter(redis, 1, 10)      # 10 per rolling second
    decision = await limiter.check("api-key-123")     # cost=1
    if not decision.allowed: ... decision.retry_after ...

Each check is one Lua script call (`ratelimit/lua/`), atomic in Redis. Checks made on
one client while another of its checks waits for Redis are sent together, as one
pipeline (`ratelimit.autopipeline`); `auto_pipeline=False` sends each on its own.

What a check sends, and its NOSCRIPT, retry and WAIT rules, are `ratelimit.plan`'s;
the decision and the failure policy are `ratelimit._core`'s. This module only sends
and receives, as `ratelimit.sync` does for a blocking client.

`wait_replicas=N` (default 0) follows the script with `WAIT N <ms>` in the same round
trip (one WAIT after a pipelined batch: it covers every earlier write on its
connection), waiting at most a third of the limiter's `timeout` (see `_core`). An
admit that fewer than N replicas acknowledged in that time goes to the failure
policy, since a failover could forget it; a rejection stands. It costs a replica
round trip per check and admits nothing while fewer than N replicas are connected.
On a Redis Cluster each check's WAIT goes to its key's master (`cluster_client`); on
the embedded fakeredis (no replicas) it is refused with ValueError.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from functools import partial
from types import TracebackType
from typing import Any, Self

import redis.exceptions

from . import algorithms, autopipeline, cluster_client, lanes, plan
from . import clock as clocks
from ._core import LEASE_RELEASE, LEASE_RENEW, UNAVAILABLE, LeaseCore, LimiterBase, log
from .algorithms import DEFAULT_LOG_STORAGE, LogStorage
from .backends import AsyncClient
from .decision import Decision
from .policy import GcraPolicy, LogPolicy, OnError
from .rates import Rate
from .tiers import TierAlgorithm, TieredCore


class AsyncLimiter(LimiterBase):
    """Shared `check` for the asyncio limiters.

    `auto_pipeline=True` (the default): concurrent checks on the same client share
    round trips (see `ratelimit.autopipeline`); False sends each check on its own.
    A limiter is an async context manager: leaving it calls `aclose()`.
    """

    _asyncio = True
    # A dropped connection is retried once; the check's own timeout bounds both tries.
    _retry_within = math.inf

    def __init__(
        self,
        redis: AsyncClient,
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
        auto_pipeline: bool = True,
    ) -> None:
        if not isinstance(auto_pipeline, bool):
            raise ValueError(f"auto_pipeline must be True or False, got {auto_pipeline!r}")
        super().__init__(
            redis, window_seconds, limit, prefix, window_ms=window_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys, plain_keys=plain_keys,
            key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms, near_cache=near_cache,
            wait_replicas=wait_replicas,
        )  # fmt: skip
        self._options["auto_pipeline"] = auto_pipeline
        self.auto_pipeline = auto_pipeline
        # The client's idle connections for lone checks (see ratelimit.lanes).
        self._lane = None if self._on_cluster else lanes.async_lane(self._client)
        self._elsewhere = (
            partial(cluster_client.asend, self._client)
            if self._on_cluster
            else self._through_client
        )
        self._batcher = autopipeline.for_client(redis) if auto_pipeline else None
        if self._batcher is not None:  # chosen once: a waiting check marks its batch
            self._submit = (
                self._batcher.submit_waiting if self.wait_replicas else self._batcher.submit
            )

    async def check(self, identity: str | bytes, cost: int = 1) -> Decision:
        """Admit or reject one request of `cost` units for `identity`.

        Bad arguments raise ValueError. When Redis cannot answer within `timeout`,
        the failure policy decides: raise `RateLimiterUnavailable`, or return a
        `Decision` with `degraded=True` (allowed under "allow", rejected under "deny").
        """
        keys, args = self._prepare(identity, cost)
        cached, sent = self._lookup(keys, args)
        if cached is not None:
            return cached  # a rejection Redis gave still stands: no round trip
        batcher = self._batcher
        try:
            async with asyncio.timeout(self.timeout):
                if batcher is None:
                    reply = await self._run(keys, args)
                elif self._wait is None and batcher.alone():
                    # (A check that waits for replicas always batches: the checks made
                    # with it share its WAIT, and nothing waits for it to be answered.)
                    batcher.lone += 1  # the checks made meanwhile batch behind it
                    try:
                        reply = await self._run(keys, args)
                    finally:
                        batcher.lone_done()
                else:  # the batch's flush applies the same plan to every check
                    reply = await self._submit(self, keys, args)
        except TimeoutError as exc:
            return self._unavailable(exc, self._no_answer())
        except UNAVAILABLE as exc:
            return self._unavailable(exc)
        return self._decided(reply, keys, args, sent)

    async def peek(self, identity: str | bytes, cost: int = 1) -> Decision:
        """The `Decision` that `check(identity, cost)` would return now, changing nothing
        in Redis (no write, no TTL change): one read-only script call, with the same
        validation, near-cache answer and failure policy as `check`. It goes on its own,
        never in an auto-pipelined batch."""
        keys, args = self._prepare(identity, cost)
        cached, sent = self._lookup(keys, args)
        if cached is not None:
            return cached  # what check would answer too
        try:
            async with asyncio.timeout(self.timeout):
                result = await plan.arun(self._peek_plan(keys, args), self._send, keys[0])
                reply = self._peek_reply(result)
        except TimeoutError as exc:
            return self._peek_unavailable(exc, self._no_answer())
        except UNAVAILABLE as exc:
            return self._peek_unavailable(exc)
        return self._peeked(reply, keys, args, sent)

    async def reset(self, identity: str | bytes) -> bool:
        """Forget `identity` under this limiter: its key is deleted, so its next check
        finds a fresh budget. True when there was state to delete. Raises
        `RateLimiterUnavailable` when Redis cannot answer, whatever `on_error` says."""
        keys = self._reset_keys(identity)
        try:
            async with asyncio.timeout(self.timeout):
                reply = await plan.arun(self._reset_plan(keys), self._send, keys[0])
                return self._reset_done(reply)
        except TimeoutError as exc:
            raise self._reset_failed(exc, self._no_answer()) from exc
        except UNAVAILABLE as exc:
            raise self._reset_failed(exc) from exc

    async def check_many(
        self, identities: Iterable[str | bytes], costs: int | Iterable[int] = 1
    ) -> list[Decision]:
        """Decide several requests in one pipelined round trip, in order.

        Redis runs the scripts one after another, so the decisions are those of the
        same checks made in sequence. `costs` is one int for all, or one per identity.
        A bad request raises ValueError before anything is sent. The failure policy
        applies to the batch as a whole: every request gets its answer.
        """
        batch = self._prepare_many(identities, costs)
        if not batch:
            return []
        try:
            async with asyncio.timeout(self.timeout):
                replies = self._judged(await self._run_many(batch))
        except TimeoutError as exc:
            what = self._no_answer()
            return [self._unavailable(exc, what) for _ in batch]
        except UNAVAILABLE as exc:
            return [self._unavailable(exc) for _ in batch]
        return self._decisions(replies, batch)

    def _no_answer(self) -> str:
        """Why a check timed out: no answer within `timeout`, and, when the client's
        pool had no connection left for it, the pool's class and size."""
        what = f"no answer from Redis within {self.timeout} s"
        short = self._lane.shortage() if self._lane is not None else None
        return f"{what}: {short}" if short else what

    async def aclose(self) -> None:
        """Give back the connections kept for this client's lone checks. The client
        stays the caller's: closing it closes every connection it made."""
        if self._lane is not None:
            await self._lane.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _run(self, keys: list[str], args: list[Any]) -> Any:
        """One check's raw reply, sent on its own."""
        return self._judge(await plan.arun(self._check_plan(keys, args), self._send, keys[0]))

    async def _run_many(self, batch: list[tuple[list[str], list[Any]]]) -> list[Any]:
        calls = self._calls(batch)
        if self._on_cluster:
            return await cluster_client.arun_batch(
                self._client, calls, self._wait, self._count_resends
            )
        steps = plan.batch(calls, self._wait, self._retry_within, resent=self._count_resends)
        replies: list[Any] = await plan.arun(steps, self._send, None)
        return replies

    async def _send(self, key: Any, commands: plan.Commands) -> Any:
        """One round trip: the replies (error replies in place), or what stopped it."""
        try:
            return await self._route()(key, commands)
        except Exception as exc:
            return exc

    async def _through_client(self, key: Any, commands: plan.Commands) -> list[Any]:
        if self._pipelines(commands):
            replies: list[Any] = await self._pipeline_of(commands).execute(raise_on_error=False)
            return replies
        return [await self._in_place(command) for command in commands]

    async def _in_place(self, command: tuple[Any, ...]) -> Any:
        try:
            return await self._client.execute_command(*command)
        except redis.exceptions.ResponseError as exc:  # an error reply
            return exc


class SlidingWindowLimiter(LogPolicy, AsyncLimiter):
    """Sliding-window log: exact. `storage="compact"` (the default) keeps about 6 bytes per
    admitted unit of cost; `storage="sorted-set"` one sorted-set member per unit."""

    def __init__(
        self,
        redis: AsyncClient,
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
        auto_pipeline: bool = True,
    ) -> None:
        self._use_storage(storage)
        super().__init__(
            redis, window_seconds, limit, prefix, window_ms=window_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys, plain_keys=plain_keys,
            key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms, near_cache=near_cache,
            wait_replicas=wait_replicas,
            auto_pipeline=auto_pipeline,
        )  # fmt: skip


class FixedWindowLimiter(AsyncLimiter):
    """Fixed window: one counter per aligned window; up to 2x the limit at a boundary."""

    algorithm = algorithms.FIXED_WINDOW


class SlidingWindowCounterLimiter(AsyncLimiter):
    """Sliding-window counter: the previous window weighted by overlap; O(1), approximate."""

    algorithm = algorithms.SLIDING_WINDOW_COUNTER


class TokenBucketLimiter(GcraPolicy, AsyncLimiter):
    """Token bucket as GCRA: `limit` per window sustained, `burst` at once (default limit)."""

    algorithm = algorithms.GCRA

    def __init__(
        self,
        redis: AsyncClient,
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
        auto_pipeline: bool = True,
    ) -> None:
        self._use_burst(burst)
        super().__init__(
            redis, window_seconds, limit, prefix, window_ms=window_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys, plain_keys=plain_keys,
            key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms, near_cache=near_cache,
            wait_replicas=wait_replicas,
            auto_pipeline=auto_pipeline,
        )  # fmt: skip


class ConcurrencyLimiter(LeaseCore, AsyncLimiter):
    """At most `limit` requests of an identity in flight at once: each holds a lease
    until it is released, or for `lease_seconds` (default 30) if its holder dies::

        limiter = ConcurrencyLimiter(redis, limit=4, lease_seconds=30)
        async with limiter.hold("api-key-123") as decision:
            if not decision.allowed: ... decision.retry_after ...

    Leases live in one sorted set per identity scored by their expiry, read on Redis's
    clock (`clock="redis"`, the default, so hosts with skewed clocks agree on when a
    lease has expired; an injected clock is for tests and simulations). Takes the
    limiters' options (`prefix`, `on_error`, `timeout`, `key_secret`, ...; `lease_ms`
    in place of `lease_seconds`), except `near_cache`.
    """

    def __init__(
        self,
        redis: AsyncClient,
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
        auto_pipeline: bool = True,
    ) -> None:
        super().__init__(
            redis, limit, lease_seconds, prefix, lease_ms=lease_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys,
            plain_keys=plain_keys, key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms, near_cache=near_cache,
            wait_replicas=wait_replicas,
            auto_pipeline=auto_pipeline,
        )  # fmt: skip

    async def acquire(self, identity: str | bytes) -> Decision:
        """Take a lease for `identity`. Admitted: `decision.lease` is its id, for
        `release`. Rejected (`limit` held): no lease, and `retry_after_ms` is the time
        until the earliest lease expires, the longest the wait can be if nobody releases.
        Redis unavailable: the failure policy, as for `check` (a degraded admit holds no
        lease)."""
        return await self.check(identity)

    async def peek(self, identity: str | bytes, cost: int = 1) -> Decision:
        """Not for leases: a lease is taken or not, there is no budget to preview (and
        the lease script has no read-only path). TypeError."""
        raise TypeError(
            "ConcurrencyLimiter has no peek: acquire a lease, or count the identity's "
            "leases with ZCARD on limiter.key_for(identity)"
        )

    async def release(self, identity: str | bytes, lease: str | None) -> bool:
        """End a lease: True if it was held, False if it had expired, was released
        already or is None (a degraded admit's). When Redis cannot answer: raises
        `RateLimiterUnavailable` under on_error="raise", else logs and returns False
        (the lease then expires by itself)."""
        if lease is None:
            return False
        return await self._end(identity, lease, LEASE_RELEASE)

    async def renew(self, identity: str | bytes, lease: str) -> bool:
        """Give a held lease another `lease_seconds` from now: True if it was still held,
        False if it had expired or been released (it is not taken again). Redis
        unavailable: as `release`."""
        return await self._end(identity, lease, LEASE_RENEW)

    async def _end(self, identity: str | bytes, lease: str, op: int) -> bool:
        keys, args = self._lease_call(identity, lease, op)
        try:
            async with asyncio.timeout(self.timeout):
                reply = await self._run(keys, args)
        except TimeoutError as exc:
            return self._unreleased(exc, self._no_answer())
        except UNAVAILABLE as exc:
            return self._unreleased(exc)
        return self._ended(reply)

    @asynccontextmanager
    async def hold(self, identity: str | bytes) -> AsyncIterator[Decision]:
        """`acquire` on entry, `release` on exit, also when the body raises or is
        cancelled. Not admitted: the body runs with the rejected decision (nothing
        raises; test `decision.allowed`). A release that fails never raises here: it is
        logged and the lease expires after `lease_seconds`."""
        decision = await self.acquire(identity)
        try:
            yield decision
        finally:
            if decision.lease is not None:
                # Shielded: a second cancellation does not stop the release half-way.
                await asyncio.shield(self._release_quietly(identity, decision.lease))

    async def _release_quietly(self, identity: str | bytes, lease: str) -> None:
        try:
            await self.release(identity, lease)
        except Exception as exc:  # on_error="raise": the lease expires by itself
            log.warning("lease not released (it expires by itself): %s", exc)


class TieredLimiter(TieredCore, AsyncLimiter):
    """Several limits on one identity at once, decided by one atomic script: a request
    is admitted only if every tier admits it, and a rejected one spends nothing.

        limiter = TieredLimiter(redis, ["10/s", "1000/h"])      # or "10/s; 1000/h"
        decision = await limiter.check("api-key-123")
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
        redis: AsyncClient,
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
        auto_pipeline: bool = True,
    ) -> None:
        super().__init__(
            redis, rates, prefix, algorithm=algorithm, storage=storage, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys,
            plain_keys=plain_keys, key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms, near_cache=near_cache,
            wait_replicas=wait_replicas,
            auto_pipeline=auto_pipeline,
        )  # fmt: skip
