"""Auto-pipelining: the checks made on one client in one event-loop turn share a round trip.

In an asyncio service many `await limiter.check(...)` are in flight at once. Rather
than one EVALSHA round trip each, the checks issued on the same client during one
turn of the event loop are queued, and a task started for them sends them on the
next turn as ONE non-transactional pipeline (as ioredis's `enableAutoPipelining`);
on a Redis Cluster, one pipeline per node. Limiters of any algorithm on the same
client share the batch. Nothing waits on a timer, and a check that nothing else can
join (no other callback is ready to run in its turn) is sent at once, as a lone
EVALSHA, exactly as without auto-pipelining.

Each check keeps its own reply, its own timeout and its own failure policy (the
limiter's `check` applies them around the future it awaits). Decisions are those of
the same checks in sequence: Redis runs a pipeline's scripts one after another in
the order they were queued, which is the order the checks were made.

When a limiter with `wait_replicas` has a check in the batch, one `WAIT` follows the
batch's scripts on the same connection (it covers every write before it there):
the most replicas any of them asks for, within the shortest of their WAIT timeouts.
Each such limiter's admits are then held to its own `wait_replicas`; the checks of
limiters without it get the decisions they would get alone (after that WAIT). On a
Redis Cluster each waiting check goes on its own, with its WAIT, to its key's node.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from typing import Any

import redis.asyncio
import redis.asyncio.connection
import redis.exceptions

from .backends import is_embedded
from .cluster_client import cluster_batch_async, is_cluster

# At most this many checks per pipeline: a larger turn sends several. Bounds the memory
# of one batch and the size of one write.
MAX_BATCH = 1000

# At most this many idle connections kept for lone checks (and at most half of a
# bounded pool's); more go back to the pool. Checks one at a time need one. They are
# kept only until the loop's next turn (see `AutoPipeline.send`).
MAX_IDLE = 4

# redis-py's own methods, as found on import: an override means the lone path is
# not taken (see `_made`), or not its own write (see `_write`).
_EXECUTE = redis.asyncio.Redis.execute_command
_SEND = redis.asyncio.connection.AbstractConnection.send_packed_command

# One queued check: (limiter, KEYS, ARGV, the future its caller awaits).
Entry = tuple[Any, list[Any], list[Any], asyncio.Future]


class _Batch:
    __slots__ = ("loop", "entries", "deadline", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.entries: list[Entry] = []
        self.deadline = 0.0  # loop time by which every caller has given up
        self.waiting = False  # a check of a limiter with wait_replicas is in it


class AutoPipeline:
    """The open batch of one client, the flushes in flight, and the connections its
    lone checks reuse. Holds no reference to the client (the registry below is keyed
    weakly on it): each queued check brings its limiter, and the limiter its client.

    A lone check (`command`) skips redis-py's per-command machinery: it takes an idle
    connection leased from the client's own pool (so connecting, TLS, AUTH, HELLO and
    Sentinel discovery stay redis-py's), writes the packed command, reads the reply and
    keeps the connection for a check that follows at once. Taking a connection from the
    pool and giving it back costs about as much client time as the rest of redis-py's
    call. The connections kept go back to the pool on the loop's next turn, so the
    client's other commands never find its pool short by them.
    `pool` is None where that does not apply (a cluster, the embedded fakeredis, a
    client of another kind): `command` is then not used.
    """

    def __init__(self, cluster: bool, pool: Any = None) -> None:
        self._cluster = cluster
        self._open: _Batch | None = None
        self._flushing: set[asyncio.Task] = set()  # strong references while they run
        self.pool = pool
        # Leased from `pool` and ready to send (no reply left unread on any of them),
        # all bound to `_idle_loop`: an asyncio connection works only in its own loop.
        # The pool counts them in use, so the client's close disconnects them too.
        self._idle: list[Any] = []
        self._idle_loop: asyncio.AbstractEventLoop | None = None
        self._max_idle = _max_idle(pool)
        # The callback, queued for the loop's next turn, that hands `_idle` back.
        self._give_back: asyncio.Handle | None = None

    async def command(self, command: tuple[Any, ...]) -> Any:
        """One command's reply (an error reply raised), sent as `send` sends."""
        (reply,) = await self.send((command,))
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
        return reply

    async def send(self, commands: tuple[Any, ...] | list[Any]) -> list[Any]:
        """Write `commands` at once on an idle connection and read all their replies,
        error replies in place (read whole: the connection is kept). On any other
        error or on cancellation the connection is closed and handed back to the
        pool, since a reply may be left unread on it."""
        idle = self._idle
        loop = asyncio.get_running_loop()
        if idle and self._idle_loop is loop:
            conn = idle.pop()
        else:
            conn = await self._lease(loop)
        try:
            await _write(conn, _packed(conn, commands))
            replies = []
            for _ in commands:
                try:
                    # No timer per read: the caller's own timeout bounds it.
                    replies.append(await conn.read_response(timeout=math.inf))
                except redis.exceptions.ResponseError as exc:
                    replies.append(exc)
        except BaseException as exc:
            await self._drop(conn, exc)
            raise
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
            _run_now(self.pool.release(conn), loop, self._flushing)

    async def _lease(self, loop: asyncio.AbstractEventLoop) -> Any:
        if self._idle_loop is not loop:
            # Those of another loop (a finished `asyncio.run`) go back to the pool,
            # which then treats them as it treats its own.
            stale, self._idle, self._idle_loop = self._idle, [], loop
            for conn in stale:
                await self.pool.release(conn)
        return await _get_connection(self.pool)

    async def _drop(self, conn: Any, exc: BaseException) -> None:
        try:
            await conn.disconnect(nowait=True)  # (redis-py has mostly done it already)
        finally:
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
                await other.disconnect(nowait=True)
                await self.pool.release(other)
            await self.pool.disconnect(inuse_connections=False)

    def alone(self) -> bool:
        """True when a check made now would be a batch of one, so it may be sent at
        once, exactly as without auto-pipelining: no batch is open, and no other
        callback is ready to run in this turn of the loop, so none could join it.
        (`_ready` is asyncio's run queue; a loop without one always batches.)"""
        loop = asyncio.get_running_loop()
        batch = self._open
        if batch is not None and batch.loop is loop:
            return False
        ready = getattr(loop, "_ready", None)
        if ready is None:
            return False
        # The lane's own hand-back (see `send`) is no check that could join a batch.
        return not ready or (len(ready) == 1 and ready[0] is self._give_back)

    def submit(self, limiter: Any, keys: list[Any], args: list[Any]) -> asyncio.Future:
        """Queue one script call; the future gets the script's raw reply or the error
        that stopped it."""
        loop = asyncio.get_running_loop()
        batch = self._open
        if batch is None or batch.loop is not loop:  # (a batch of a closed loop is dead)
            batch = self._open = _Batch(loop)
            # A task's first step runs on the next turn, after every callback already
            # queued for this one: the checks they make join this batch.
            task = loop.create_task(self._flush(batch))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)
        future = loop.create_future()
        batch.entries.append((limiter, keys, args, future))
        deadline = loop.time() + limiter.timeout
        if deadline > batch.deadline:
            batch.deadline = deadline
        if len(batch.entries) >= MAX_BATCH:
            self._open = None  # full: the next check opens another batch
        return future

    def submit_waiting(self, limiter: Any, keys: list[Any], args: list[Any]) -> asyncio.Future:
        """`submit` for a limiter with `wait_replicas`: its batch ends with a WAIT."""
        batch = self._open
        future = self.submit(limiter, keys, args)
        if batch is None or batch.loop is not asyncio.get_running_loop():
            batch = self._open  # the one `submit` just opened (MAX_BATCH > 1)
        assert batch is not None
        batch.waiting = True
        return future

    async def _flush(self, batch: _Batch) -> None:
        if self._open is batch:
            self._open = None
        # A caller that gave up (timeout, cancellation) before the send is left out:
        # its request is never counted.
        entries = [e for e in batch.entries if not e[3].done()]
        if not entries:
            return
        try:
            # Past the last caller's deadline nobody waits for an answer: stop, and
            # free the connection (a client without socket timeouts would hang).
            async with asyncio.timeout_at(batch.deadline):
                if len(entries) == 1:
                    await _single(entries[0])
                elif self._cluster:
                    await _cluster(entries, batch.waiting)
                else:
                    await _plain(entries, batch.waiting)
        except asyncio.CancelledError:
            for entry in entries:
                entry[3].cancel()
            raise
        except Exception as exc:  # each caller's failure policy decides
            for entry in entries:
                _settle(entry[3], exc)


def _settle(future: asyncio.Future, reply: Any) -> None:
    """Hand a reply (or an error) to a caller that still waits."""
    if future.done():
        return
    if isinstance(reply, BaseException):
        future.set_exception(reply)
        future.exception()  # retrieved: no "never retrieved" log if its caller is gone
    else:
        future.set_result(reply)


async def _single(entry: Entry) -> None:
    # A batch of one is a lone call, with the limiter's own retry and NOSCRIPT rules.
    limiter, keys, args, future = entry
    try:
        reply = await limiter._run(keys, args)
    except Exception as exc:
        reply = exc
    _settle(future, reply)


# The stages of one plain flush: EVALSHA; for the requests that met NOSCRIPT (a
# restart, failover or SCRIPT FLUSH) the script is loaded and EVALSHA sent again in
# one round trip; those that meet it again (a second flush in between) go with EVAL,
# which carries the script and cannot miss. A NOSCRIPT reply means the script did
# not run, so sending that request again never counts it twice, and only such
# requests are sent again.
_EVALSHA, _RELOAD, _EVAL = range(3)


async def _plain(entries: list[Entry], waiting: bool = False) -> None:
    retried = False
    wait: tuple[Any, ...] | None = None
    for stage in (_EVALSHA, _RELOAD, _EVAL):
        while True:
            entries = [e for e in entries if not e[3].done()]  # none for who gave up
            if not entries:
                return
            if waiting:
                wait = _wait_for(entries)
            try:
                replies = await _pipeline(entries, stage, wait)
                break
            except redis.exceptions.ConnectionError:
                # As `_run`: a pooled connection closed by a restart fails on first
                # use, so the stage goes once more on a fresh one. Had the first
                # attempt reached Redis, its requests count twice: stricter, never
                # over-admitting.
                if retried:
                    raise
                retried = True
        if wait is not None:
            *replies, acked = replies
            # The admits of a waiting limiter count only once enough replicas have them.
            replies = [
                e[0]._replication_error(r, acked) or r if e[0].wait_replicas else r
                for e, r in zip(entries, replies, strict=True)
            ]
        missing = []
        for entry, reply in zip(entries, replies, strict=True):
            if stage != _EVAL and isinstance(reply, redis.exceptions.NoScriptError):
                missing.append(entry)
            else:
                _settle(entry[3], reply)
        entries = missing


def _wait_for(entries: list[Entry]) -> tuple[Any, ...] | None:
    """The WAIT for these entries: the most replicas any asks for, within the
    shortest of their WAIT timeouts; None when none of them asks."""
    waiting = [e[0] for e in entries if e[0].wait_replicas]
    if not waiting:
        return None
    return (
        "WAIT",
        max(limiter.wait_replicas for limiter in waiting),
        min(limiter._wait_ms for limiter in waiting),
    )


async def _pipeline(
    entries: list[Entry], stage: int, wait: tuple[Any, ...] | None = None
) -> list[Any]:
    """One round trip: the entries' script calls, then `wait` if any; their replies
    in order (WAIT's count last), errors in place."""
    commands: list[tuple[Any, ...]] = []
    if stage == _RELOAD:
        bodies = {e[0]._script.sha: e[0]._script.script for e in entries}
        commands += [("SCRIPT", "LOAD", body) for body in bodies.values()]
    for limiter, keys, args, _ in entries:
        script = limiter._script
        if stage == _EVAL:
            commands.append(("EVAL", script.script, len(keys), *keys, *args))
        else:
            commands.append(("EVALSHA", script.sha, len(keys), *keys, *args))
    if wait is not None:
        commands.append(wait)
    replies = await _send(entries[0][0]._client, commands)
    return replies[len(commands) - len(entries) - (wait is not None) :]


async def _send(client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Write `commands` at once on one pooled connection and read all their replies:
    what redis-py's non-transactional pipeline does, without its bookkeeping per
    command and its timer per reply (together about half of a pipelined command's
    client time). The flush's deadline bounds the reads instead. The client's idle
    connections serve when it has them (`AutoPipeline.send`)."""
    lane = for_client(client)
    if lane.pool is not None:
        return await lane.send(commands)
    pool = getattr(client, "connection_pool", None)
    if pool is None:  # not redis-py's kind of client: its own pipeline
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return await pipe.execute(raise_on_error=False)
    conn = await _get_connection(pool)
    try:
        # On any error or cancellation in these two calls, redis-py closes the
        # connection, so no unread reply is left for its next user.
        await conn.send_packed_command(_packed(conn, commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await conn.read_response(timeout=math.inf))
            except redis.exceptions.ResponseError as exc:  # an error reply, read whole
                replies.append(exc)
        return replies
    finally:
        await pool.release(conn)


def _run_now(coro: Any, loop: asyncio.AbstractEventLoop, tasks: set[asyncio.Task]) -> None:
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


async def _write(conn: Any, packed: list[bytes]) -> None:
    """`conn.send_packed_command(packed)` without the task and timer that redis-py
    puts around each write when the connection has a socket timeout (a third of a
    lone check's client time): the check's own timeout bounds it instead. The
    caller closes the connection on any error."""
    writer = getattr(conn, "_writer", None)
    if (
        writer is None  # not connected yet
        or conn.health_check_interval  # a PING may be due first
        or type(conn).send_packed_command is not _SEND  # a subclass's own sending
    ):
        await conn.send_packed_command(packed)
        return
    try:
        writer.writelines(packed)
        await writer.drain()  # at once, unless the socket's buffer is full
    except OSError as exc:  # as redis-py reports it, so that the check retries
        raise redis.exceptions.ConnectionError(f"Error while writing to socket: {exc}") from exc


def _max_idle(pool: Any) -> int:
    """How many idle connections a lane keeps: MAX_IDLE, but at most half of a
    bounded pool, so that the client's other commands still get connections."""
    bound = getattr(pool, "max_connections", None)
    return MAX_IDLE if not isinstance(bound, int) else min(MAX_IDLE, bound // 2)


async def _get_connection(pool: Any) -> Any:
    try:
        return await pool.get_connection()
    except TypeError:  # redis-py before 5.3 wants a command name
        return await pool.get_connection("EVALSHA")


def _packed(conn: Any, commands: list[tuple[Any, ...]]) -> list[bytes]:
    """The commands in RESP, the same bytes as `conn.pack_commands` (the tests hold
    them to it) for the bytes, text and integers a check sends, at about a third of
    its cost: redis-py's packing is one of a batched check's largest client costs.
    Any other argument goes through redis-py's own rules."""
    encoding, errors = conn.encoder.encoding, conn.encoder.encoding_errors
    out = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            kind = type(arg)
            if kind is str:
                arg = arg.encode(encoding, errors)
            elif kind is int:
                arg = b"%d" % arg
            elif kind is not bytes:
                return conn.pack_commands(commands)
            out.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return [b"".join(out)]


async def _cluster(entries: list[Entry], waiting: bool = False) -> None:
    """One pipeline per node and script, at once; each group is answered as soon as
    its node replies, so a stalled or lost node holds up only its own checks."""
    if waiting:  # a waiting check needs its own connection to its node: one by one
        alone = [e for e in entries if e[0].wait_replicas]
        entries = [e for e in entries if not e[0].wait_replicas]
        waits = [_single(entry) for entry in alone]
    groups: dict[tuple[Any, str], list[Entry]] = {}
    for entry in entries:
        groups.setdefault((_node(entry), entry[0]._script.sha), []).append(entry)
    batches = [_cluster_group(group) for group in groups.values()]
    await asyncio.gather(*batches, *(waits if waiting else ()))


def _node(entry: Entry) -> Any:
    try:
        return entry[0]._client.get_node_from_key(entry[1][0]).name
    except Exception:  # no slot map yet: one group, the pipeline routes it
        return None


async def _cluster_group(group: list[Entry]) -> None:
    if len(group) == 1:
        await _single(group[0])
        return
    limiter = group[0][0]
    try:
        # Per node, with the NOSCRIPT fallback and one resend of a dropped
        # connection's share (see cluster_client).
        replies: Any = await cluster_batch_async(
            limiter._client, limiter._script, [(keys, args) for _, keys, args, _ in group]
        )
    except Exception as exc:
        replies = [exc] * len(group)
    for entry, reply in zip(group, replies, strict=True):
        _settle(entry[3], reply)


# One AutoPipeline per client, whatever limiters (and copies) use it. Weak keys: a
# client nobody uses any more is not kept alive by this table.
_BY_CLIENT: weakref.WeakKeyDictionary[Any, AutoPipeline] = weakref.WeakKeyDictionary()


def for_client(client: Any) -> AutoPipeline:
    """The AutoPipeline that every limiter on `client` shares."""
    try:
        found = _BY_CLIENT.get(client)
        if found is None:
            found = _BY_CLIENT[client] = _made(client)
        return found
    except TypeError:  # not weak-referenceable: the limiter batches on its own (and
        return AutoPipeline(is_cluster(client))  # keeps no connections nobody would free)


def _made(client: Any) -> AutoPipeline:
    pool = getattr(client, "connection_pool", None)
    leasable = (
        isinstance(client, redis.asyncio.Redis)
        and isinstance(pool, redis.asyncio.ConnectionPool)
        and not is_embedded(client)
        # A client that sends its commands its own way (a subclass, tracing that
        # wraps the method) keeps doing so for every check.
        and type(client).execute_command is _EXECUTE
    )
    return AutoPipeline(is_cluster(client), pool if leasable else None)
