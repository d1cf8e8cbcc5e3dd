"""The four limiters for an asyncio Redis client (`redis.asyncio.Redis`).

    limiter = SlidingWindowLimiter(redis, 1, 10)      # 10 per rolling second
    decision = await limiter.check("api-key-123")     # cost=1
    if not decision.allowed: ... decision.retry_after ...

Each check is one Lua script call (`ratelimit/lua/`), atomic in Redis. Checks made on
one client in the same turn of the event loop are sent together, as one pipeline
(`ratelimit.autopipeline`); `auto_pipeline=False` sends each on its own.

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
from collections.abc import Iterable
from typing import Any

import redis.exceptions

from . import algorithms, autopipeline
from ._core import UNAVAILABLE, LimiterBase, NotReplicated
from .cluster_client import (
    cluster_batch_async,
    cluster_batch_waiting_async,
    is_cluster,
    node_send_async,
)
from .decision import Decision
from .policy import GcraPolicy, LogPolicy


class AsyncLimiter(LimiterBase):
    """Shared `check` for the asyncio limiters.

    `auto_pipeline=True` (the default): concurrent checks on the same client share
    round trips (see `ratelimit.autopipeline`); False sends each check on its own.
    """

    def __init__(self, redis: Any, *args: Any, auto_pipeline: bool = True, **kwargs: Any) -> None:
        if not isinstance(auto_pipeline, bool):
            raise ValueError(f"auto_pipeline must be True or False, got {auto_pipeline!r}")
        super().__init__(redis, *args, **kwargs)
        self._options["auto_pipeline"] = auto_pipeline
        self.auto_pipeline = auto_pipeline
        # The client's shared AutoPipeline: its batches, and its idle connections for
        # the checks sent alone (see `_call_lone`).
        lane = autopipeline.for_client(redis)
        self._batcher = lane if auto_pipeline else None
        if lane.pool is not None and not self.wait_replicas:
            self._lane = lane
            self._call = self._call_lone  # type: ignore[method-assign]
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
        if self.near_cache is not None:
            cached, sent = self._cached(keys, args)
            if cached is not None:
                return cached  # a rejection Redis gave still stands: no round trip
        batcher = self._batcher
        try:
            async with asyncio.timeout(self.timeout):
                if batcher is None or batcher.alone():
                    reply = await self._run(keys, args)
                else:  # the batch's flush applies _run's retry and NOSCRIPT rules
                    reply = await self._submit(self, keys, args)
        except TimeoutError as exc:
            return self._unavailable(exc, f"no answer from Redis within {self.timeout} s")
        except UNAVAILABLE as exc:
            return self._unavailable(exc)
        decision = self._decision(reply, args[0])
        if self.near_cache is not None:
            self._learn(keys, args, decision, sent)
        return decision

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
                replies = await self._run_many(batch)
        except TimeoutError as exc:
            what = f"no answer from Redis within {self.timeout} s"
            return [self._unavailable(exc, what) for _ in batch]
        except UNAVAILABLE as exc:
            return [self._unavailable(exc) for _ in batch]
        if self.wait_replicas:  # some replies may be NotReplicated
            return self._decisions(replies, batch)
        return [
            self._decision(reply, args[0]) for reply, (_, args) in zip(replies, batch, strict=True)
        ]

    async def _run_many(self, batch: list[tuple[list[str], list[Any]]]) -> list[list[int]]:
        try:
            return await self._pipeline(batch)
        except redis.exceptions.ConnectionError:
            if is_cluster(self._script.registered_client):
                raise  # cluster_batch_async re-sent what failed already
            # As in _run: one retry on a fresh connection (stricter if counted twice).
            return await self._pipeline(batch)
        except redis.exceptions.NoScriptError:
            # A flush between the pipeline's SCRIPT LOAD and its EVALSHAs: the calls
            # before the failing one already counted, so going on one by one can only
            # count some requests twice (stricter, never over-admitting).
            return [await self._each(keys, args) for keys, args in batch]

    async def _each(self, keys: list[str], args: list[Any]) -> Any:
        """One check of a batch gone one by one: its reply, or its NotReplicated."""
        try:
            return await self._call(keys, args)
        except NotReplicated as exc:
            return exc

    async def _pipeline(self, batch: list[tuple[list[str], list[Any]]]) -> list[list[int]]:
        if is_cluster(self._script.registered_client):  # split by node; see cluster_client
            if self.wait_replicas:  # per node: its scripts, then one WAIT
                return self._judged(
                    await cluster_batch_waiting_async(
                        self._client, self._script, batch, self._wait_command()
                    )
                )
            return await cluster_batch_async(self._script.registered_client, self._script, batch)
        # `async with`: a pipeline whose SCRIPT EXISTS / LOAD fails still gives its
        # connection back to the pool (without it, only garbage collection would).
        async with self._script.registered_client.pipeline(transaction=False) as pipe:
            for keys, args in batch:
                await self._script(keys=keys, args=args, client=pipe)  # queued, not sent
            if not self.wait_replicas:
                return await pipe.execute()
            pipe.execute_command(*self._wait_command())  # covers every write before it
            *replies, acked = await pipe.execute(raise_on_error=False)
        for reply in replies:  # as without WAIT (NOSCRIPT falls back in _run_many)
            if isinstance(reply, Exception):
                raise reply
        return [self._replication_error(r, acked) or r for r in replies]

    async def _run(self, keys: list[str], args: list[Any]) -> list[int]:
        try:
            return await self._call(keys, args)
        except redis.exceptions.ConnectionError:
            # A pooled connection closed by a server restart fails on first use; the
            # second attempt opens a fresh one. Had the first attempt reached Redis,
            # the request is counted twice: stricter, never over-admitting.
            return await self._call(keys, args)

    async def _call(self, keys: list[str], args: list[Any]) -> list[int]:
        try:
            # EVALSHA on the client itself: redis-py's Script wrapper costs a few
            # microseconds a call, which the hot path cannot afford.
            return await self._client.evalsha(self._script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return await self._reload(keys, args)

    async def _call_lone(self, keys: list[str], args: list[Any]) -> list[int]:
        """`_call` on one of the client's idle connections (`AutoPipeline.command`),
        without redis-py's per-command work; a NOSCRIPT is recovered as by `_call`."""
        script = self._script
        try:
            return await self._lane.command(("EVALSHA", script.sha, len(keys), *keys, *args))
        except redis.exceptions.NoScriptError:
            return await self._reload(keys, args)

    async def _reload(self, keys: list[str], args: list[Any]) -> list[int]:
        # The script cache was emptied (restart, failover, SCRIPT FLUSH): reload, retry.
        client = self._client
        self._script.sha = await client.script_load(self._script.script)
        try:
            return await client.evalsha(self._script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            # A second flush landed between the reload and the retry. EVAL carries
            # the script itself, so it cannot meet NOSCRIPT.
            return await client.eval(self._script.script, len(keys), *keys, *args)

    async def _call_waiting(self, keys: list[str], args: list[Any]) -> Any:
        """`_call` followed by WAIT on the same connection, in one round trip (the
        NOSCRIPT rules too); NotReplicated for an admit too few replicas acknowledged."""
        script, wait = self._script, self._wait_command()
        call = (len(keys), *keys, *args)
        reply, acked = await self._send(keys[0], [("EVALSHA", script.sha, *call), wait])
        if isinstance(reply, redis.exceptions.NoScriptError):
            load = ("SCRIPT", "LOAD", script.script)
            _, reply, acked = await self._send(
                keys[0], [load, ("EVALSHA", script.sha, *call), wait]
            )
            if isinstance(reply, redis.exceptions.NoScriptError):
                reply, acked = await self._send(keys[0], [("EVAL", script.script, *call), wait])
        return self._replicated(reply, acked)

    async def _send(self, key: str, commands: list[tuple[Any, ...]]) -> list[Any]:
        """`commands` in one round trip on one connection (to `key`'s master on a
        cluster); error replies in place."""
        if self._on_cluster:
            return await node_send_async(self._client, key, commands)
        return await autopipeline._send(self._client, commands)


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
