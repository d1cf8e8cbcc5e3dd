"""The four limiters for a synchronous `redis.Redis` client, same scripts and rules.

from ratelimit.sync import SlidingWindowLimiter, connect_sync
limiter = SlidingWindowLimiter(connect_sync(), 1, 10)
limiter.check("api-key-123")

`wait_replicas=N` follows each script with `WAIT` as in `ratelimit.limiters`.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

import redis
import redis.exceptions

from . import algorithms
from ._core import UNAVAILABLE, LimiterBase, NotReplicated
from .autopipeline import _max_idle, _packed
from .backends import bounded_client, connect_sync, is_embedded
from .cluster_client import cluster_batch, cluster_batch_waiting, is_cluster, node_send
from .decision import Decision
from .policy import GcraPolicy, LogPolicy

RETRY_WITHIN = 0.1  # share of the timeout within which a failed attempt is retried

__all__ = [
    "FixedWindowLimiter",
    "SlidingWindowCounterLimiter",
    "SlidingWindowLimiter",
    "SyncLimiter",
    "TokenBucketLimiter",
    "connect_sync",
]


class _Lane:
    """The idle connections that the lone checks on one (bounded) client reuse, as
    `ratelimit.autopipeline.AutoPipeline.command` does for asyncio: leased from the
    client's own pool (connecting, TLS, AUTH, Sentinel discovery stay redis-py's),
    kept after a clean reply, so a check skips the pool's lock, its connection check
    and redis-py's per-command work. Shared by threads: `list.pop` and `append` are
    atomic, so each connection is used by one thread at a time."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._idle: list[Any] = []  # leased, no reply left unread on any of them
        self._max_idle = _max_idle(pool)
        self._pid = os.getpid()

    def command(self, command: tuple[Any, ...]) -> Any:
        """Send one command on an idle connection and return its reply; an error reply
        is raised (its connection, read whole, is kept). On any other error the
        connection is closed and handed back to the pool: a reply may be unread on it."""
        if self._pid != os.getpid():
            # A forked child must not share its parent's sockets: forget them (the
            # pool, which checks the pid too, makes new ones).
            self._idle, self._pid = [], os.getpid()
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._lease()
        try:
            conn.send_packed_command(_packed(conn, (command,)))
            try:
                reply = conn.read_response()
            except redis.exceptions.ResponseError as exc:  # an error reply, read whole
                reply = exc
        except BaseException as exc:
            self._drop(conn, exc)
            raise
        idle = self._idle
        if len(idle) < self._max_idle:
            idle.append(conn)
        else:
            self.pool.release(conn)
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
        return reply

    def _lease(self) -> Any:
        try:
            return self.pool.get_connection()
        except TypeError:  # redis-py before 5.3 wants a command name
            return self.pool.get_connection("EVALSHA")

    def _drop(self, conn: Any, exc: BaseException) -> None:
        try:
            conn.disconnect()  # (redis-py has mostly done it already)
        finally:
            self.pool.release(conn)
        if isinstance(exc, redis.exceptions.ConnectionError):
            # A dropped connection (restart, failover, CLIENT KILL) means the idle
            # ones, ours and the pool's, are likely gone too: closed, they reconnect
            # on next use, so the retry gets a working one (as in the async lane).
            while True:  # (pop: other threads may be giving theirs back meanwhile)
                try:
                    other = self._idle.pop()
                except IndexError:
                    break
                other.disconnect()
                self.pool.release(other)
            self.pool.disconnect(inuse_connections=False)


# One _Lane per bounded client (limiters built alike share it). Weak keys: a client
# nobody uses any more is not kept alive by this table.
_LANES: weakref.WeakKeyDictionary[Any, _Lane] = weakref.WeakKeyDictionary()
_LANES_LOCK = threading.Lock()
_EXECUTE = redis.Redis.execute_command


def _lane_for(client: Any) -> _Lane | None:
    """The shared _Lane of `client`; None where lone checks go through the client
    itself (a cluster, the embedded fakeredis, a client of another kind)."""
    pool = getattr(client, "connection_pool", None)
    if not (
        isinstance(client, redis.Redis)
        and isinstance(pool, redis.ConnectionPool)
        and not is_embedded(client)
        and type(client).execute_command is _EXECUTE  # as in `autopipeline._made`
    ):
        return None
    with _LANES_LOCK:
        lane = _LANES.get(client)
        if lane is None:
            lane = _LANES[client] = _Lane(pool)
    return lane


class SyncLimiter(LimiterBase):
    """Shared `check` for the synchronous limiters."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        lane = _lane_for(self._client)
        if lane is not None and not self.wait_replicas:
            self._lane = lane
            self._call = self._call_lone  # type: ignore[method-assign]

    def _client_for_script(self, redis: Any) -> Any:
        return bounded_client(redis, self.timeout)

    def check(self, identity: str | bytes, cost: int = 1) -> Decision:
        """Admit or reject one request; see `ratelimit.limiters.AsyncLimiter.check`."""
        keys, args = self._prepare(identity, cost)
        if self.near_cache is not None:
            cached, sent = self._cached(keys, args)
            if cached is not None:
                return cached  # a rejection Redis gave still stands: no round trip
        try:
            reply = self._run(keys, args)
        except UNAVAILABLE as exc:
            return self._unavailable(exc)
        decision = self._decision(reply, args[0])
        if self.near_cache is not None:
            self._learn(keys, args, decision, sent)
        return decision

    def check_many(
        self, identities: Iterable[str | bytes], costs: int | Iterable[int] = 1
    ) -> list[Decision]:
        """Decide several requests in one pipelined round trip; see
        `ratelimit.limiters.AsyncLimiter.check_many`."""
        batch = self._prepare_many(identities, costs)
        if not batch:
            return []
        try:
            replies = self._run_many(batch)
        except UNAVAILABLE as exc:
            return [self._unavailable(exc) for _ in batch]
        if self.wait_replicas:  # some replies may be NotReplicated
            return self._decisions(replies, batch)
        return [
            self._decision(reply, args[0]) for reply, (_, args) in zip(replies, batch, strict=True)
        ]

    def _run_many(self, batch: list[tuple[list[str], list[Any]]]) -> list[list[int]]:
        started = time.monotonic()
        try:
            return self._pipeline(batch)
        except redis.exceptions.NoScriptError:
            # As in the async limiter: go on one by one (stricter if counted twice).
            return [self._each(keys, args) for keys, args in batch]
        except redis.exceptions.ConnectionError:
            if time.monotonic() - started > RETRY_WITHIN * self.timeout:
                raise
            if is_cluster(self._script.registered_client):
                raise  # its pipeline re-sent what failed already; again would count twice
            return self._pipeline(batch)

    def _pipeline(self, batch: list[tuple[list[str], list[Any]]]) -> list[list[int]]:
        if is_cluster(self._script.registered_client):  # split by node; see cluster_client
            if self.wait_replicas:  # per node: its scripts, then one WAIT
                return self._judged(
                    cluster_batch_waiting(self._client, self._script, batch, self._wait_command())
                )
            return cluster_batch(self._script.registered_client, self._script, batch)
        pipe = self._script.registered_client.pipeline(transaction=False)
        for keys, args in batch:
            self._script(keys=keys, args=args, client=pipe)  # queued, not sent
        if not self.wait_replicas:
            return pipe.execute()
        pipe.execute_command(*self._wait_command())  # covers every write before it
        *replies, acked = pipe.execute(raise_on_error=False)
        for reply in replies:  # as without WAIT (NOSCRIPT falls back in _run_many)
            if isinstance(reply, Exception):
                raise reply
        return [self._replication_error(r, acked) or r for r in replies]

    def _each(self, keys: list[str], args: list[Any]) -> Any:
        """One check of a batch gone one by one: its reply, or its NotReplicated."""
        try:
            return self._call(keys, args)
        except NotReplicated as exc:
            return exc

    def _run(self, keys: list[str], args: list[Any]) -> list[int]:
        started = time.monotonic()
        try:
            return self._call(keys, args)
        except redis.exceptions.ConnectionError:
            # As in the async limiter: one retry on a fresh connection. A blocking call
            # cannot be cut short, and the retry gets a full socket timeout of its own,
            # so retry only a connection that failed at once (closed by a restart);
            # that keeps a whole check within about 1.1 x timeout.
            if time.monotonic() - started > RETRY_WITHIN * self.timeout:
                raise
            return self._call(keys, args)

    def _call(self, keys: list[str], args: list[Any]) -> list[int]:
        # As in the async limiter: EVALSHA on the client itself; after NOSCRIPT reload
        # and retry once, and use EVAL if a second flush lands during the reload.
        try:
            return self._client.evalsha(self._script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return self._reload(keys, args)

    def _call_lone(self, keys: list[str], args: list[Any]) -> list[int]:
        """`_call` on one of the client's idle connections (`_Lane.command`), without
        redis-py's per-command work; a NOSCRIPT is recovered as by `_call`."""
        script = self._script
        try:
            return self._lane.command(("EVALSHA", script.sha, len(keys), *keys, *args))
        except redis.exceptions.NoScriptError:
            return self._reload(keys, args)

    def _reload(self, keys: list[str], args: list[Any]) -> list[int]:
        client = self._client
        self._script.sha = client.script_load(self._script.script)
        try:
            return client.evalsha(self._script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return client.eval(self._script.script, len(keys), *keys, *args)

    def _call_waiting(self, keys: list[str], args: list[Any]) -> Any:
        """`_call` followed by WAIT on the same connection, in one round trip (the
        NOSCRIPT rules too); NotReplicated for an admit too few replicas acknowledged."""
        script, wait = self._script, self._wait_command()
        call = (len(keys), *keys, *args)
        reply, acked = self._send(keys[0], [("EVALSHA", script.sha, *call), wait])
        if isinstance(reply, redis.exceptions.NoScriptError):
            load = ("SCRIPT", "LOAD", script.script)
            _, reply, acked = self._send(keys[0], [load, ("EVALSHA", script.sha, *call), wait])
            if isinstance(reply, redis.exceptions.NoScriptError):
                reply, acked = self._send(keys[0], [("EVAL", script.script, *call), wait])
        return self._replicated(reply, acked)

    def _send(self, key: str, commands: list[tuple[Any, ...]]) -> list[Any]:
        """`commands` in one round trip on one connection (to `key`'s master on a
        cluster); error replies in place."""
        if self._on_cluster:
            return node_send(self._client, key, commands)
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return pipe.execute(raise_on_error=False)


class SlidingWindowLimiter(LogPolicy, SyncLimiter):
    """Sliding-window log: exact. `storage="compact"` (the default) keeps about 6 bytes per
    admitted unit of cost; `storage="sorted-set"` one sorted-set member per unit."""


class FixedWindowLimiter(SyncLimiter):
    """Fixed window: one counter per aligned window; up to 2x the limit at a boundary."""

    algorithm = algorithms.FIXED_WINDOW


class SlidingWindowCounterLimiter(SyncLimiter):
    """Sliding-window counter: the previous window weighted by overlap; O(1), approximate."""

    algorithm = algorithms.SLIDING_WINDOW_COUNTER


class TokenBucketLimiter(GcraPolicy, SyncLimiter):
    """Token bucket as GCRA: `limit` per window sustained, `burst` at once (default limit)."""

    algorithm = algorithms.GCRA
