"""Lanes: the idle connections that checks sent alone reuse, one lane per client.

A check sent alone through redis-py costs, on the client, a pool lease and release, a
connection check and redis-py's per-command work, together about as much as the rest
of the call. A lane leases connections from the client's own pool (so connecting, TLS,
AUTH, HELLO and Sentinel discovery stay redis-py's), writes packed commands, reads
their replies and keeps the connection for the next check. A connection with a reply
that may be left unread on it (an error, a cancellation) is closed and given back.

A pool that has no connection left (redis-py's `ConnectionPool` raises
MaxConnectionsError at once) does not fail the check: it waits, first come first
served, for the connection another check gives back, within its timeout (see
`SyncLane._wait`, `AsyncLane._wait`). The pool stays the caller's, as it is.

A client whose `execute_command` is not redis-py's own (tracing such as
OpenTelemetry's redis instrumentation, a subclass, a wrapper) gets no lane while it
is so, whenever it became so: its commands then go through the client, which sees
every check.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import threading
import time
import weakref
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.exceptions

from .backends import is_embedded

# At most this many idle connections kept for lone checks (and at most half of a
# bounded pool's); more go back to the pool. Checks one at a time need one. The asyncio
# lane keeps them only until the loop's next turn (see `AsyncLane.send`).
MAX_IDLE = 4

# How often a check waiting for a connection also asks the pool itself: for one given
# back around the lane (the client's own commands, or a connection the lane dropped).
POLL = 0.02

# redis-py's own sending, as its module defines it: a subclass that sends its own way
# keeps doing so (see `_write`).
_SEND = redis.asyncio.connection.AbstractConnection.send_packed_command


def untouched(client: Any) -> bool:
    """True while `client` sends its commands as redis-py does: its class's
    `execute_command` is redis-py's own function (not wrapped, not overridden), and the
    client itself has none of its own. Asked on every round trip, so it is cheap."""
    method = type(client).execute_command
    seen = _VERDICTS.get(id(method))
    if seen is None or seen[0] is not method:
        verdict = (
            getattr(method, "__wrapped__", None) is None
            and getattr(method, "__module__", "").startswith("redis.")
            and getattr(method, "__qualname__", "") == "Redis.execute_command"
        )
        seen = _VERDICTS[id(method)] = (method, verdict)
    return seen[1] and "execute_command" not in client.__dict__


# What `untouched` found for each `execute_command` function seen (few: redis-py's own
# and whatever wraps it), by identity: a wrapper (wrapt's) compares and hashes equal to
# the function it wraps.
_VERDICTS: dict[int, tuple[Any, bool]] = {}


class StaleReply(redis.exceptions.InvalidResponse):
    """A reply that cannot be the script call's own: one left unread on the connection
    by someone else (an interrupted connect, a cancelled command). The connection is
    dropped, and the check goes to its failure policy rather than to a decision."""


_SCRIPT_CALLS = frozenset({"EVALSHA", "EVAL"})


def _own(command: tuple[Any, ...], reply: Any) -> Any:
    """`reply`, unless `command` is a script call and the reply cannot be one's (every
    script answers an integer, a list or an error): then StaleReply."""
    kind = type(reply)
    if kind is int or kind is list or command[0] not in _SCRIPT_CALLS:
        return reply
    if isinstance(reply, redis.exceptions.ResponseError):
        return reply
    raise StaleReply(
        f"{command[0]} was answered {reply!r}, which no script answers: a reply left "
        "unread on the connection by an earlier command; the connection is dropped"
    )


def shortage(pool: Any) -> str:
    """Why a check found no connection: the pool's class and size (whose every
    connection was in use), so that the fix (a larger pool) is plain."""
    size = getattr(pool, "max_connections", None)
    return (
        f"every connection of the client's {type(pool).__name__} "
        f"(max_connections={size}) was in use"
    )


def _max_idle(pool: Any) -> int:
    """How many idle connections a lane keeps: MAX_IDLE, but at most half of a
    bounded pool, so that the client's other commands still get connections."""
    bound = getattr(pool, "max_connections", None)
    return MAX_IDLE if not isinstance(bound, int) else min(MAX_IDLE, bound // 2)


# The RESP text of a command's first three arguments (a script call's name, SHA or
# text, and key count), packed once per encoding and distinct triple: few scripts, few
# commands.
_HEADS: dict[str, dict[tuple[Any, ...], bytes]] = {}
_MAX_HEADS = 256


def _add_bulks(out: list[bytes], args: Any, encoding: str, errors: str) -> bool:
    """Append the RESP bulk strings of `args` to `out`; False (out unusable) if one is
    not bytes, text or an integer."""
    for arg in args:
        kind = type(arg)
        if kind is str:
            arg = arg.encode(encoding, errors)
        elif kind is int:
            arg = b"%d" % arg
        elif kind is not bytes:
            return False
        out.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return True


def packed(conn: Any, commands: Any) -> list[bytes]:
    """The commands in RESP, the same bytes as `conn.pack_commands` (the tests hold
    them to it) for the bytes, text and integers a check sends, at a fraction of its
    cost. Any other argument goes through redis-py's own rules."""
    encoding, errors = conn.encoder.encoding, conn.encoder.encoding_errors
    heads = _HEADS.get(encoding)
    if heads is None:
        heads = _HEADS[encoding] = {}
    out: list[bytes] = []
    for command in commands:
        start = command[:3]
        head = heads.get(start)
        if head is None:
            parts: list[bytes] = []
            if not _add_bulks(parts, start, encoding, errors):
                packed: list[bytes] = conn.pack_commands(commands)
                return packed
            head = b"".join(parts)
            if len(heads) < _MAX_HEADS:
                heads[start] = head
        out += (b"*%d\r\n" % len(command), head)
        if not _add_bulks(out, command[3:], encoding, errors):
            packed = conn.pack_commands(commands)
            return packed
    return [b"".join(out)]


def _leasable(client: Any, kind: type, pool_kind: type) -> Any:
    """`client`'s pool if a lane may lease from it, else None (a cluster, the embedded
    fakeredis, a client of another kind)."""
    pool = getattr(client, "connection_pool", None)
    if isinstance(client, kind) and isinstance(pool, pool_kind) and not is_embedded(client):
        return pool
    return None


class AsyncLane:
    """The idle connections of one asyncio client, leased from its pool.

    All of them are bound to one event loop (an asyncio connection works only in its
    own). The pool counts them in use, so closing the client disconnects them too, and
    they go back to the pool on the loop's next turn, so the client's other commands
    never find its pool short by them."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._idle: list[Any] = []  # leased, no reply left unread on any of them
        self._idle_loop: asyncio.AbstractEventLoop | None = None
        # Checks waiting for a connection (in `_idle_loop`), oldest first (see `_wait`).
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        # The pool had no connection for the latest lease, and has not had one for a
        # lease since: a check that times out says so (`shortage`).
        self.short = False
        self._polling: asyncio.AbstractEventLoop | None = None  # has a `_poll` timer
        self._max_idle = _max_idle(pool)
        # The callback, queued for the loop's next turn, that hands `_idle` back.
        self._give_back: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # strong references while they run

    @property
    def idle(self) -> int:
        """How many connections the lane holds now."""
        return len(self._idle)

    async def send(self, key: Any, commands: Any) -> list[Any]:
        """Write `commands` at once on an idle connection and read all their replies,
        error replies in place (read whole: the connection is kept). On any other
        error or on cancellation the connection is closed and handed back to the
        pool, since a reply may be left unread on it. (`key` is the round trip's
        first key: a lane has one server, so it does not route by it.)"""
        idle = self._idle
        loop = asyncio.get_running_loop()
        if idle and self._idle_loop is loop:
            conn = idle.pop()
        else:
            conn = await self._lease(loop)
        try:
            try:
                await _write(conn, packed(conn, commands))
                replies = []
                for command in commands:
                    try:
                        # No timer per read: the caller's own timeout bounds it.
                        reply = await conn.read_response(timeout=math.inf)
                    except redis.exceptions.ResponseError as exc:
                        reply = exc
                    replies.append(_own(command, reply))
            except RuntimeError as exc:
                # A connection opened in an event loop that is gone (an earlier
                # `asyncio.run`): as good as dropped, so the check retries on a fresh one.
                raise redis.exceptions.ConnectionError(
                    f"connection of another loop: {exc}"
                ) from exc
        except BaseException as exc:
            await self._drop(conn, exc)
            raise
        if self._waiting and self._handed(conn):
            return replies
        idle = self._idle  # (a new list if another loop's check came meanwhile)
        if len(idle) < self._max_idle and self._idle_loop is loop:
            idle.append(conn)
            if self._give_back is None:
                self._give_back = loop.call_soon(self._hand_back, loop)
        else:
            await self.pool.release(conn)
        return replies

    def _hand_back(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the turn after a check: give the pool the connections no check took
        meanwhile. Checks made one after another in one task never yield in between,
        so they keep reusing theirs; any other code that runs first finds the pool
        whole."""
        self._give_back = None
        if self._idle_loop is not loop:
            return
        kept, self._idle = self._idle, []
        for conn in kept:
            _run_now(self.pool.release(conn), loop, self._tasks)

    async def aclose(self) -> None:
        """Give every idle connection back to the pool now."""
        kept, self._idle = self._idle, []
        for conn in kept:
            await self.pool.release(conn)

    async def _lease(self, loop: asyncio.AbstractEventLoop) -> Any:
        if self._idle_loop is not loop:
            # Connections of another loop (a finished `asyncio.run`) cannot work in this
            # one, ours and the pool's idle ones alike: closed before anything is written
            # on them (a write may still reach Redis, and its reply could not be read),
            # they reconnect here when next used.
            stale, self._idle = self._idle, []
            # (Checks of that loop that still wait never will: forgotten.)
            self._waiting = collections.deque(w for w in self._waiting if w.get_loop() is loop)
            for conn in stale:
                await _close(conn)
                await self.pool.release(conn)
            if self._idle_loop is not None:
                with contextlib.suppress(RuntimeError):
                    await self.pool.disconnect(inuse_connections=False)
            self._idle_loop = loop
        if not self._waiting:  # else behind them, as in `SyncLane._lease`
            try:
                conn = await self.pool.get_connection()
            except redis.exceptions.MaxConnectionsError:
                pass
            else:
                self.short = False
                return conn
        return await self._wait(loop)

    async def _wait(self, loop: asyncio.AbstractEventLoop) -> Any:
        """The connection a check of this lane hands on (`_handed`), first come first
        served. No bound of its own: the check's timeout cancels it, and the check
        then names the pool (`shortage`)."""
        self.short = True
        waiter = self._queued(loop.create_future(), loop)
        try:
            while True:
                conn = await waiter
                if conn is not None:
                    return conn
                try:  # (None: the pool got one back around the lane, see `_poll`)
                    return await self.pool.get_connection()
                except redis.exceptions.MaxConnectionsError:  # taken meanwhile: still first
                    waiter = self._queued(loop.create_future(), loop, first=True)
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # handed one as it gave up
                self._pass_on(waiter.result(), loop)
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiting.remove(waiter)
            raise

    def _queued(
        self, waiter: asyncio.Future[Any], loop: asyncio.AbstractEventLoop, first: bool = False
    ) -> asyncio.Future[Any]:
        if first:
            self._waiting.appendleft(waiter)
        else:
            self._waiting.append(waiter)
        if self._polling is not loop:
            self._polling = loop
            loop.call_later(POLL, self._poll, loop)
        return waiter

    def _poll(self, loop: asyncio.AbstractEventLoop) -> None:
        """Every POLL seconds while checks wait: when the pool has a connection that came
        back around the lane (the client's own commands, one the lane dropped), the
        first waiting check is told to ask the pool for it. One timer, however many wait."""
        if self._polling is not loop:
            return  # (a timer of a loop that is gone; another loop polls now)
        if self._waiting and self._idle_loop is loop:
            if self.pool.can_get_connection():
                self._handed(None)
            loop.call_later(POLL, self._poll, loop)
        else:
            self._polling = None

    def _handed(self, conn: Any) -> bool:
        """Hand `conn` to the check that has waited longest for one; False if none waits."""
        waiting = self._waiting
        while waiting:
            waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def _pass_on(self, conn: Any, loop: asyncio.AbstractEventLoop) -> None:
        """Hand `conn` (or None, `_poll`'s hint) to the next waiting check, else give
        it back to the pool."""
        if not self._handed(conn) and conn is not None:
            _run_now(self.pool.release(conn), loop, self._tasks)

    def shortage(self) -> str | None:
        """Why checks time out, when the pool had no connection for them (see `short`)."""
        return shortage(self.pool) if self.short else None

    async def _drop(self, conn: Any, exc: BaseException) -> None:
        try:
            await _close(conn)  # (redis-py has mostly done it already)
        finally:
            if not (self._waiting and self._handed(conn)):  # (it connects again there)
                await self.pool.release(conn)
        if isinstance(exc, redis.exceptions.ConnectionError):
            # A dropped connection (restart, failover, CLIENT KILL) means the idle
            # ones, ours and the pool's, are likely gone too, and the pool cannot
            # always tell (an asyncio socket whose close the loop has not seen yet):
            # closed, they reconnect on next use, so the retry gets a working one.
            while True:  # (pop: other checks may be giving theirs back meanwhile)
                try:
                    other = self._idle.pop()
                except IndexError:
                    break
                await _close(other)
                await self.pool.release(other)
            with contextlib.suppress(RuntimeError):  # (some of another loop: closed anyway)
                await self.pool.disconnect(inuse_connections=False)


async def _close(conn: Any) -> None:
    """Close an asyncio connection, also one of an event loop that is gone (whose
    transport cannot be closed any more: redis-py forgets it all the same)."""
    with contextlib.suppress(RuntimeError):
        await conn.disconnect(nowait=True)


class _Waiter:
    """A sync check waiting for a connection: `ready` is released once `conn` is set."""

    __slots__ = ("conn", "ready")

    def __init__(self) -> None:
        self.conn: Any = None
        self.ready = threading.Lock()
        self.ready.acquire()


class SyncLane:
    """The idle connections of one (bounded) sync client, leased from its pool and
    kept after a clean reply. Shared by threads: `list.pop` and `append` are atomic,
    so each connection is used by one thread at a time.

    The client is the limiter's own copy with socket timeouts of `timeout` (see
    `backends.bounded_client`: one per timeout), so a check that finds the pool
    empty waits at most that long for a connection."""

    def __init__(self, pool: Any, timeout: float) -> None:
        self.pool = pool
        self.timeout = timeout
        self._idle: list[Any] = []  # leased, no reply left unread on any of them
        self._max_idle = _max_idle(pool)
        self._pid = os.getpid()
        # Checks waiting for a connection, oldest first, and the lock that hands
        # them one (see `_give`).
        self._waiting: collections.deque[_Waiter] = collections.deque()
        self._lock = threading.Lock()

    @property
    def idle(self) -> int:
        """How many connections the lane holds now."""
        return len(self._idle)

    def send(self, key: Any, commands: Any) -> list[Any]:
        """`AsyncLane.send` for a blocking client."""
        if self._pid != os.getpid():
            # A forked child must not share its parent's sockets: forget them (the
            # pool, which checks the pid too, makes new ones), and the parent's waiters.
            self._idle, self._pid = [], os.getpid()
            self._waiting, self._lock = collections.deque(), threading.Lock()
        conn = self._lease()
        try:
            conn.send_packed_command(packed(conn, commands))
            replies = []
            for command in commands:
                try:
                    reply = conn.read_response()
                except redis.exceptions.ResponseError as exc:  # an error reply, read whole
                    reply = exc
                replies.append(_own(command, reply))
        except BaseException as exc:
            self._drop(conn, exc)
            raise
        self._give(conn)
        return replies

    def close(self) -> None:
        """Give every idle connection back to the pool now."""
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return
            self.pool.release(conn)

    def _lease(self) -> Any:
        """An idle connection, else a new one from the pool, else (none left) the
        first one given back within `timeout` (`_wait`). While checks wait, a new
        one waits behind them: taking the connection a check just gave back would
        let the threads that keep checking starve the ones that wait."""
        if not self._waiting:
            conn = self._take()
            if conn is not None:
                return conn
        return self._wait()

    def _take(self) -> Any:
        """An idle connection or one from the pool; None when the pool has none left."""
        try:
            return self._idle.pop()
        except IndexError:
            pass
        try:
            return self.pool.get_connection()
        except redis.exceptions.MaxConnectionsError:
            return None

    def _wait(self) -> Any:
        """The connection a check of this lane hands on (`_give`), first come first
        served, or one the pool got back around the lane (the first waiting check asks
        it every POLL seconds), within `timeout`; else MaxConnectionsError naming the
        pool and its size."""
        waiter = _Waiter()
        with self._lock:
            self._waiting.append(waiter)
        deadline = time.monotonic() + self.timeout
        conn = None
        try:
            while conn is None:
                left = deadline - time.monotonic()
                if left <= 0 or waiter.ready.acquire(timeout=min(left, POLL)):
                    break
                if self._first(waiter):  # (the others would only get in its way)
                    conn = self._take()
        except BaseException:
            handed = self._withdraw(waiter)
            if handed is not None:
                self._give(handed)
            raise
        handed = self._withdraw(waiter)
        if handed is None:
            if conn is None:
                raise redis.exceptions.MaxConnectionsError(
                    f"no connection within {self.timeout} s: {shortage(self.pool)}"
                )
            return conn
        if conn is not None:
            self._give(conn)  # handed one as it found another: one too many
        return handed

    def _first(self, waiter: _Waiter) -> bool:
        try:
            return self._waiting[0] is waiter
        except IndexError:
            return False

    def _withdraw(self, waiter: _Waiter) -> Any:
        """Take `waiter` out of the queue; the connection it was handed, if any."""
        with self._lock:
            try:
                self._waiting.remove(waiter)
            except ValueError:  # `_give` took it out, and handed it one
                return waiter.conn
        return None

    def _give(self, conn: Any, keep: bool = True) -> None:
        """Hand `conn` to the check that has waited longest for one; else keep it idle
        (when `keep`, up to `_max_idle`) or give it back to the pool."""
        if self._waiting:  # (read without the lock: a waiter missed asks the pool)
            with self._lock:
                if self._waiting:
                    waiter = self._waiting.popleft()
                    waiter.conn = conn
                    waiter.ready.release()
                    return
        if keep and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            self.pool.release(conn)

    def _drop(self, conn: Any, exc: BaseException) -> None:
        try:
            conn.disconnect()  # (redis-py has mostly done it already)
        finally:
            self._give(conn, keep=False)  # (a waiter's check connects it again)
        if isinstance(exc, redis.exceptions.ConnectionError):
            # As in the asyncio lane: the retry must get a working connection.
            while True:
                try:
                    other = self._idle.pop()
                except IndexError:
                    break
                other.disconnect()
                self.pool.release(other)
            self.pool.disconnect(inuse_connections=False)


# One lane per client, whatever limiters use it. Weak keys: a client nobody uses any
# more is not kept alive by these tables.
_ASYNC: weakref.WeakKeyDictionary[Any, AsyncLane] = weakref.WeakKeyDictionary()
_SYNC: weakref.WeakKeyDictionary[Any, SyncLane] = weakref.WeakKeyDictionary()
_SYNC_LOCK = threading.Lock()


def async_lane(client: Any) -> AsyncLane | None:
    """The lane every asyncio limiter on `client` shares; None where lone checks go
    through the client itself."""
    pool = _leasable(client, redis.asyncio.Redis, redis.asyncio.ConnectionPool)
    if pool is None:
        return None
    try:
        lane = _ASYNC.get(client)
        if lane is None:
            lane = _ASYNC[client] = AsyncLane(pool)
        return lane
    except TypeError:  # not weak-referenceable: no lane (nothing would free it)
        return None


def sync_lane(client: Any, timeout: float) -> SyncLane | None:
    """The lane every sync limiter on `client` shares (see `async_lane`); a check on
    it waits at most `timeout` for a connection."""
    pool = _leasable(client, redis.Redis, redis.ConnectionPool)
    if pool is None:
        return None
    with _SYNC_LOCK:
        try:
            lane = _SYNC.get(client)
            if lane is None:
                lane = _SYNC[client] = SyncLane(pool, timeout)
            return lane
        except TypeError:
            return None


def _run_now(coro: Any, loop: asyncio.AbstractEventLoop, tasks: set[asyncio.Task[Any]]) -> None:
    """Run `coro` to its end at once if it never has to wait (the pool's release does
    not, unless its connection must reconnect or re-authenticate); else a task (kept
    in `tasks`) finishes it. A task alone would start only after every task already
    queued, which may be the very commands that need the connection back."""
    try:
        waiting = coro.send(None)
    except StopIteration:
        return
    task = loop.create_task(_finish(coro, waiting))
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def _finish(coro: Any, waiting: Any) -> None:
    """Go on with a coroutine that `_run_now` started by hand, as a task would: wait
    for what it waits for, then resume it, until it returns."""
    while True:
        if waiting is None:  # a bare yield, as in asyncio.sleep(0)
            await asyncio.sleep(0)
        else:
            waiting._asyncio_future_blocking = False
            await asyncio.wait([waiting])
        try:
            waiting = coro.send(None)
        except StopIteration:
            return


async def _write(conn: Any, data: list[bytes]) -> None:
    """`conn.send_packed_command(data)` without the timer that redis-py puts around
    each write when the connection has a socket timeout: the check's own timeout
    bounds it instead. The caller closes the connection on any error."""
    writer = getattr(conn, "_writer", None)
    if (
        writer is None  # not connected yet (or a redis-py that keeps it elsewhere)
        or conn.health_check_interval  # a PING may be due first
        or type(conn).send_packed_command is not _SEND  # a subclass's own sending
    ):
        await conn.send_packed_command(data)
        return
    try:
        writer.writelines(data)
        await writer.drain()  # at once, unless the socket's buffer is full
    except OSError as exc:  # as redis-py reports it, so that the check retries
        raise redis.exceptions.ConnectionError(f"Error while writing to socket: {exc}") from exc
