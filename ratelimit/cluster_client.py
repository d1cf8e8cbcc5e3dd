"""What the limiters need to run through a Redis Cluster client.

`ratelimit.backends.connect()` makes the cluster clients; this module adapts them:
a sync client whose every command is bounded by the limiter's timeout, a guard for
a redis-py race in the asyncio client, and batches of script calls (`check_many`)
pipelined per node.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.asyncio
import redis.cluster
import redis.exceptions
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.retry import Retry


def bounded_cluster(client: redis.RedisCluster, timeout: float) -> redis.RedisCluster:
    """A `redis.RedisCluster` on the same nodes whose every command gives up after
    `timeout`: socket timeouts of `timeout` and no cluster-level retries.

    A cluster client made without timeouts waits forever for a node that hangs, and
    its retries (each a topology refresh plus a new attempt) multiply even a bounded
    wait; the limiter retries a dropped connection once itself. Its connection
    options (credentials, TLS, encoding) are kept; the client's own connect hook,
    bound to the original client, is not.
    """
    manager = client.nodes_manager
    # Hooks bound to the original client are left for the copy to make its own.
    own = ("redis_connect_func", "oss_cluster_maint_notifications_handler")
    kwargs = {k: v for k, v in manager.connection_kwargs.items() if k not in own}
    kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout)
    known = client.get_nodes() or list(manager.startup_nodes.values())
    return redis.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(node.host, node.port) for node in known],
        retry=Retry(NoBackoff(), 0),
        require_full_coverage=manager._require_full_coverage,
        dynamic_startup_nodes=manager._dynamic_startup_nodes,
        address_remap=manager.address_remap,
        **kwargs,
    )


# Batches of script calls on a cluster (`check_many`) --------------------------------
#
# redis-py's cluster pipelines split a batch by node and send each node its share in
# one round trip, but they do not load scripts (the sync one even refuses `evalsha()`),
# so the raw EVALSHA is queued instead, routed by its key like any keyed command. A
# node that lacks the script (new, restarted, flushed) answers NOSCRIPT to all of its
# share and runs none of it: those requests, and only those, go again with EVAL (which
# carries the script and cannot miss), in their order, after the script is loaded on
# every master for the next batch. Requests of one identity share a node, so they stay
# in order, and nothing is counted twice. A reply that is still an error (a node down)
# is raised, so the limiter's failure policy answers the batch.


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client, sync or asyncio (guarded or not)."""
    return isinstance(client, redis.RedisCluster | redis.asyncio.RedisCluster | GuardedCluster)


# redis-py's asyncio cluster client (8.1) recycles connections in the background after
# every topology refresh (its first use, a node restart). A check that picks such a
# connection at the wrong moment fails inside redis-py with AttributeError or TypeError
# on a None socket writer instead of a ConnectionError, which would escape the
# limiter's failure policy. Such errors, and only when raised inside redis-py or
# asyncio's streams, are turned into ConnectionError: the limiter then retries once on a
# fresh connection, or applies its policy.

_RACE_MODULES = ("redis.", "asyncio.")


def _race(exc: BaseException) -> bool:
    if not isinstance(exc, AttributeError | TypeError) or exc.__traceback__ is None:
        return False
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith(_RACE_MODULES)


async def _guard(call: Any) -> Any:
    try:
        return await call
    except (AttributeError, TypeError) as exc:
        if not _race(exc):
            raise
        raise redis.exceptions.ConnectionError(f"connection recycled mid-command: {exc}") from exc


class GuardedCluster:
    """An asyncio RedisCluster whose script commands raise ConnectionError, not
    AttributeError/TypeError, when redis-py races with itself (see above)."""

    def __init__(self, client: redis.asyncio.RedisCluster) -> None:
        self.client = client

    async def evalsha(self, *args: Any) -> Any:
        return await _guard(self.client.evalsha(*args))

    async def eval(self, *args: Any) -> Any:
        return await _guard(self.client.eval(*args))

    async def script_load(self, script: Any) -> Any:
        return await _guard(self.client.script_load(script))

    def register_script(self, script: Any) -> AsyncScript:
        return AsyncScript(self, script)  # so that its registered_client is this guard

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def guarded(client: Any) -> Any:
    """`GuardedCluster(client)` for an asyncio RedisCluster; any other client as it is."""
    if isinstance(client, redis.asyncio.RedisCluster):
        return GuardedCluster(client)
    return client


Batch = list[tuple[list[Any], list[Any]]]


def _queue(pipe: Any, command: str, body: str, batch: Batch, which: list[int]) -> None:
    for i in which:
        keys, args = batch[i]
        pipe.execute_command(command, body, len(keys), *keys, *args)


def _noscript(replies: list[Any]) -> list[int]:
    missing = redis.exceptions.NoScriptError
    return [i for i, reply in enumerate(replies) if isinstance(reply, missing)]


def _raise_first_error(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def cluster_batch(client: redis.RedisCluster, script: Any, batch: Batch) -> list[Any]:
    """Run `script` once per (keys, args) of `batch` on a sync cluster, pipelined per
    node; the replies in order (see the comment above)."""
    pipe = client.pipeline(transaction=False)
    _queue(pipe, "EVALSHA", script.sha, batch, list(range(len(batch))))
    replies = pipe.execute(raise_on_error=False)
    missing = _noscript(replies)
    if missing:
        script.sha = client.script_load(script.script)
        pipe = client.pipeline(transaction=False)
        _queue(pipe, "EVAL", script.script, batch, missing)
        for i, reply in zip(missing, pipe.execute(raise_on_error=False), strict=True):
            replies[i] = reply
    return _raise_first_error(replies)


async def cluster_batch_async(client: Any, script: Any, batch: Batch) -> list[Any]:
    """`cluster_batch` for an asyncio cluster client. Unlike the sync pipeline, the
    asyncio one hands back a dropped connection's share as ConnectionErrors; that
    share is sent once more (on a fresh connection) before anything else."""

    async def send(command: str, body: str, which: list[int]) -> None:
        pipe = client.pipeline(transaction=False)
        _queue(pipe, command, body, batch, which)
        # redis-py's asyncio pipeline (8.1), unlike its single commands and the sync
        # pipeline, fetches no new slot map after a node failed to answer unless it
        # may retry, and ours may not: every batch for the slots of a master that died
        # would go on to it, also after its replica took over. So refresh it here.
        try:
            answers = await _guard(pipe.execute(raise_on_error=False))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            await _refresh_async(unguarded)
            raise
        for i, reply in zip(which, answers, strict=True):
            replies[i] = reply
        if any(isinstance(reply, redis.exceptions.ConnectionError) for reply in answers):
            await _refresh_async(unguarded)

    unguarded = client.client if isinstance(client, GuardedCluster) else client
    replies: list[Any] = [None] * len(batch)
    await send("EVALSHA", script.sha, list(range(len(batch))))
    dropped = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.ConnectionError)]
    if dropped:
        await send("EVALSHA", script.sha, dropped)
    missing = _noscript(replies)
    if missing:
        script.sha = await _guard(client.script_load(script.script))
        await send("EVAL", script.script, missing)
    return _raise_first_error(replies)


# WAIT on a cluster (`wait_replicas`) ------------------------------------------------
#
# WAIT counts the replicas that acknowledged the writes made on its own connection, so
# it must follow the script on the same connection to the key's master. The cluster
# clients pick a connection per command, so a waiting check goes to the key's master
# directly: the node the client's slot map names, one of that node's connections, the
# script and WAIT in one round trip. A reply that says the slot is elsewhere (MOVED,
# ASK: a failover or a resharding) or a dropped connection refreshes the slot map
# before the error reaches the limiter, whose retry or next check then finds the new
# master. Batches of waiting checks go one check at a time.


def _refresh_sync(client: redis.RedisCluster) -> None:
    try:
        client.nodes_manager.initialize()
    except redis.exceptions.RedisError:
        pass  # every node unreachable: the next check tries again


def _master(client: Any, key: Any) -> Any:
    """The node the slot map names for `key`; ConnectionError when it names none (a
    cluster error that is not a RedisError would escape the failure policy)."""
    try:
        node = client.get_node_from_key(key)
    except redis.exceptions.RedisClusterException as exc:
        raise redis.exceptions.ConnectionError(f"no master for the key's slot: {exc}") from exc
    if node is None:
        raise redis.exceptions.ConnectionError("no master for the key's slot")
    return node


def node_send(
    client: redis.RedisCluster, key: Any, commands: list[tuple[Any, ...]], node: Any = None
) -> list[Any]:
    """`commands` in one round trip on one connection to the master of `key`'s slot
    (or to `node`); error replies in place."""
    try:
        node = node or _master(client, key)
        pipe = client.get_redis_connection(node).pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        replies = pipe.execute(raise_on_error=False)
    except redis.exceptions.ConnectionError:
        _refresh_sync(client)
        raise
    if any(isinstance(reply, redis.exceptions.AskError) for reply in replies):
        _refresh_sync(client)
    return replies


async def _refresh_async(client: redis.asyncio.RedisCluster) -> None:
    try:
        await client.nodes_manager.initialize()
    except redis.exceptions.RedisError:
        pass  # every node unreachable: the next check tries again


async def node_send_async(
    client: Any, key: Any, commands: list[tuple[Any, ...]], node: Any = None
) -> list[Any]:
    """`node_send` for an asyncio cluster client (guarded or not)."""
    cluster = client.client if isinstance(client, GuardedCluster) else client
    await _guard(cluster.initialize())  # a no-op once it has its slot map
    try:
        node = node or _master(cluster, key)
    except redis.exceptions.ConnectionError:
        await _refresh_async(cluster)
        raise
    connection = node.acquire_connection()
    try:
        await _guard(connection.send_packed_command(connection.pack_commands(commands)))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await _guard(connection.read_response()))
            except redis.exceptions.ResponseError as exc:  # an error reply, read whole
                replies.append(exc)
    except redis.exceptions.ConnectionError:
        await connection.disconnect()
        await _refresh_async(cluster)
        raise
    except BaseException:
        await connection.disconnect()  # no unread reply left for its next user
        raise
    finally:
        node.release(connection)
    if any(isinstance(reply, redis.exceptions.AskError) for reply in replies):
        await _refresh_async(cluster)
    return replies


# A batch of waiting checks (`check_many`): per master, its checks' scripts then one
# WAIT, in one round trip, all masters at once; a master that lacks the script gets
# the checks that met NOSCRIPT again with EVAL (and WAIT). Each check's reply comes
# with the count of the WAIT that followed it on its master.


def _groups(client: Any, batch: Batch) -> list[tuple[Any, list[int]]]:
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, (keys, _) in enumerate(batch):
        node = _master(client, keys[0])
        groups.setdefault(node.name, (node, []))[1].append(i)
    return list(groups.values())


def _calls(command: str, body: str, batch: Batch, which: list[int]) -> list[tuple[Any, ...]]:
    return [(command, body, len(batch[i][0]), *batch[i][0], *batch[i][1]) for i in which]


def _place(out: list[Any], which: list[int], replies: list[Any]) -> list[int]:
    """Store (reply, WAIT's count) per check; the checks that met NOSCRIPT."""
    acked = replies[-1]
    for i, reply in zip(which, replies[:-1], strict=True):
        out[i] = (reply, acked)
    return [i for i in which if isinstance(out[i][0], redis.exceptions.NoScriptError)]


def cluster_batch_waiting(
    client: redis.RedisCluster, script: Any, batch: Batch, wait: tuple[Any, ...]
) -> list[tuple[Any, Any]]:
    """(reply, WAIT's count) per check of `batch`, in order (see above)."""
    out: list[Any] = [None] * len(batch)
    try:
        groups = _groups(client, batch)
    except redis.exceptions.ConnectionError:
        _refresh_sync(client)
        raise
    for node, which in groups:
        calls = _calls("EVALSHA", script.sha, batch, which)
        missing = _place(out, which, node_send(client, None, [*calls, wait], node))
        if missing:
            calls = _calls("EVAL", script.script, batch, missing)
            _place(out, missing, node_send(client, None, [*calls, wait], node))
    return out


async def cluster_batch_waiting_async(
    client: Any, script: Any, batch: Batch, wait: tuple[Any, ...]
) -> list[tuple[Any, Any]]:
    """`cluster_batch_waiting` for an asyncio cluster client (guarded or not)."""
    cluster = client.client if isinstance(client, GuardedCluster) else client
    await _guard(cluster.initialize())
    out: list[Any] = [None] * len(batch)
    try:
        groups = _groups(cluster, batch)
    except redis.exceptions.ConnectionError:
        await _refresh_async(cluster)
        raise

    async def one(node: Any, which: list[int]) -> None:
        calls = _calls("EVALSHA", script.sha, batch, which)
        missing = _place(out, which, await node_send_async(cluster, None, [*calls, wait], node))
        if missing:
            calls = _calls("EVAL", script.script, batch, missing)
            _place(out, missing, await node_send_async(cluster, None, [*calls, wait], node))

    await asyncio.gather(*(one(node, which) for node, which in groups))
    return out
