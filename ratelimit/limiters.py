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
from collections.abc import Iterable
from functools import partial
from types import TracebackType
from typing import Any, Self

import redis.exceptions

from . import algorithms, autopipeline, cluster_client, lanes, plan
from ._core import UNAVAILABLE, LimiterBase
from .decision import Decision
from .policy import GcraPolicy, LogPolicy


class AsyncLimiter(LimiterBase):
    """Shared `check` for the asyncio limiters.

    `auto_pipeline=True` (the default): concurrent checks on the same client share
    round trips (see `ratelimit.autopipeline`); False sends each check on its own.
    A limiter is an async context manager: leaving it calls `aclose()`.
    """

    # A dropped connection is retried once; the check's own timeout bounds both tries.
    _retry_within = math.inf

    def __init__(self, redis: Any, *args: Any, auto_pipeline: bool = True, **kwargs: Any) -> None:
        if not isinstance(auto_pipeline, bool):
            raise ValueError(f"auto_pipeline must be True or False, got {auto_pipeline!r}")
        super().__init__(redis, *args, **kwargs)
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
        key = self._reset_key(identity)
        try:
            async with asyncio.timeout(self.timeout):
                reply = await plan.arun(self._reset_plan(key), self._send, key)
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
        return await plan.arun(steps, self._send, None)

    async def _send(self, key: Any, commands: plan.Commands) -> Any:
        """One round trip: the replies (error replies in place), or what stopped it."""
        try:
            return await self._route()(key, commands)
        except Exception as exc:
            return exc

    async def _through_client(self, key: Any, commands: plan.Commands) -> list[Any]:
        if self._pipelines(commands):
            return await self._pipeline_of(commands).execute(raise_on_error=False)
        return [await self._in_place(command) for command in commands]

    async def _in_place(self, command: tuple[Any, ...]) -> Any:
        try:
            return await self._client.execute_command(*command)
        except redis.exceptions.ResponseError as exc:  # an error reply
            return exc


class SlidingWindowLimiter(LogPolicy, AsyncLimiter):
    """Sliding-window log: exact. `storage="compact"` (the default) keeps about 6 bytes per
    admitted unit of cost; `storage="sorted-set"` one sorted-set member per unit."""


class FixedWindowLimiter(AsyncLimiter):
    """Fixed window: one counter per aligned window; up to 2x the limit at a boundary."""

    algorithm = algorithms.FIXED_WINDOW


class SlidingWindowCounterLimiter(AsyncLimiter):
    """Sliding-window counter: the previous window weighted by overlap; O(1), approximate."""

    algorithm = algorithms.SLIDING_WINDOW_COUNTER


class TokenBucketLimiter(GcraPolicy, AsyncLimiter):
    """Token bucket as GCRA: `limit` per window sustained, `burst` at once (default limit)."""

    algorithm = algorithms.GCRA
