"""What the limiters need to run through a Redis Cluster client.

`ratelimit.backends.connect()` makes the cluster clients; this module adapts them:
a sync client whose every command is bounded by the limiter's timeout, a guard for
a redis-py race in the asyncio client, and the round trips of `ratelimit.plan` sent
through a cluster: lone checks routed by key, batches pipelined per node, WAIT on the
key's master.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import redis
import redis.asyncio
import redis.cluster
import redis.exceptions
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.retry import Retry

from . import plan


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

    async def execute_command(self, *args: Any) -> Any:
        return await _guard(self.client.execute_command(*args))

    def register_script(self, script: Any) -> AsyncScript:
        # so that its registered_client is this guard (which acts as the client)
        return AsyncScript(self, script)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def guarded(client: Any) -> Any:
    """`GuardedCluster(client)` for an asyncio RedisCluster; any other client as it is."""
    if isinstance(client, redis.asyncio.RedisCluster):
        return GuardedCluster(client)
    return client


# A plan's round trips on a cluster (see `ratelimit.plan`) ---------------------------
#
# A lone check's script call goes through the client, which routes it by its key and
# follows MOVED; SCRIPT LOAD goes to every master. A round trip that ends with WAIT goes
# to the key's master on one connection (see below). A batch's script calls go through
# the client's pipeline, which splits them by node and sends each node its share in one
# round trip; cluster pipelines do not load scripts (the sync one even refuses
# `evalsha()`), so the raw EVALSHA is queued, routed by its key like any keyed command,
# and the plan's SCRIPT LOAD goes to every master first. Requests of one identity share
# a node, so they stay in order.

# A cluster batch is never sent again whole: the asyncio pipeline hands back a dropped
# node's share in place (the plan sends that share once more), and the sync one
# re-sends what failed itself, so a second try could count requests twice.
NO_RETRY = -1.0


def _command(client: Any, command: tuple[Any, ...]) -> Any:
    """One of a plan's commands through a cluster client (a coroutine for asyncio)."""
    if command[0] == "SCRIPT":
        return client.script_load(command[2])
    if command[0] == "EVALSHA":
        return client.evalsha(*command[1:])
    if command[0] == "EVAL":
        return client.eval(*command[1:])
    return client.execute_command(*command)  # a reset's UNLINK, routed by its key


def _in_place(client: Any, command: tuple[Any, ...]) -> Any:
    try:
        return _command(client, command)
    except redis.exceptions.ResponseError as exc:  # an error reply
        return exc


async def _ain_place(client: Any, command: tuple[Any, ...]) -> Any:
    try:
        return await _command(client, command)
    except redis.exceptions.ResponseError as exc:
        return exc


def _loads(commands: list[tuple[Any, ...]]) -> int:
    """How many SCRIPT LOADs open a round trip."""
    return next((i for i, c in enumerate(commands) if c[0] != "SCRIPT"), len(commands))


def send(client: Any, key: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """A lone check's round trip on a sync cluster client, error replies in place."""
    if commands[-1][0] == "WAIT":
        return node_send(client, key, commands)
    return [_in_place(client, command) for command in commands]


async def asend(client: Any, key: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """`send` for an asyncio cluster client (guarded or not)."""
    if commands[-1][0] == "WAIT":
        return await node_send_async(client, key, commands)
    return [await _ain_place(client, command) for command in commands]


def send_batch(client: Any, key: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """A batch's round trip on a sync cluster client, through its pipeline."""
    n = _loads(commands)
    replies = [_in_place(client, command) for command in commands[:n]]
    pipe = client.pipeline(transaction=False)
    for command in commands[n:]:
        pipe.execute_command(*command)
    answers: list[Any] = pipe.execute(raise_on_error=False)
    return replies + answers


async def asend_batch(client: Any, key: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """`send_batch` for an asyncio cluster client (guarded or not)."""
    unguarded = client.client if isinstance(client, GuardedCluster) else client
    n = _loads(commands)
    replies = [await _ain_place(client, command) for command in commands[:n]]
    pipe = unguarded.pipeline(transaction=False)
    for command in commands[n:]:
        pipe.execute_command(*command)
    # redis-py's asyncio pipeline (8.1), unlike its single commands and the sync
    # pipeline, fetches no new slot map after a node failed to answer unless it may
    # retry, and ours may not: every batch for the slots of a master that died would go
    # on to it, also after its replica took over. So refresh it here.
    try:
        answers: list[Any] = await _guard(pipe.execute(raise_on_error=False))
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        await _refresh_async(unguarded)
        raise
    if any(isinstance(reply, redis.exceptions.ConnectionError) for reply in answers):
        await _refresh_async(unguarded)
    return replies + answers


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


# A batch of checks (`check_many`, the auto-pipeline): through the client's pipeline;
# with WAIT, per master, its checks' scripts then one WAIT in one round trip, all
# masters at once. Each check's reply comes with the count of the WAIT that followed it
# on its master.


def _groups(client: Any, calls: list[plan.Call]) -> list[tuple[Any, list[int]]]:
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, (_, keys, _) in enumerate(calls):
        node = _master(client, keys[0])
        groups.setdefault(node.name, (node, []))[1].append(i)
    return list(groups.values())


def _to_node(client: Any, node: Any, key: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    return node_send(client, key, commands, node)


async def _ato_node(client: Any, node: Any, key: Any, commands: list[tuple[Any, ...]]) -> Any:
    return await node_send_async(client, key, commands, node)


def _part(resent: plan.Resent | None, which: list[int]) -> plan.Resent | None:
    """`resent` for the part of a batch made of the calls `which`."""
    if resent is None:
        return None
    return lambda calls: resent([which[i] for i in calls])


def run_batch(
    client: Any, calls: list[plan.Call], wait: Any, resent: plan.Resent | None = None
) -> list[Any]:
    """(reply, WAIT's count or None) per call of a batch on a sync cluster, in order;
    `resent` is told of the calls sent again after a dropped connection."""
    if not wait:
        batch = plan.batch(calls, None, NO_RETRY, resent=resent)
        replies: list[Any] = plan.run(batch, partial(send_batch, client), None)
        return replies
    out: list[Any] = [None] * len(calls)
    try:
        groups = _groups(client, calls)
    except redis.exceptions.ConnectionError:
        _refresh_sync(client)
        raise
    for node, which in groups:
        part = plan.batch([calls[i] for i in which], wait, NO_RETRY, resent=_part(resent, which))
        results = plan.run(part, partial(_to_node, client, node), None)
        for i, result in zip(which, results, strict=True):
            out[i] = result
    return out


async def arun_batch(
    client: Any, calls: list[plan.Call], wait: Any, resent: plan.Resent | None = None
) -> list[Any]:
    """`run_batch` for an asyncio cluster client (guarded or not)."""
    if not wait:
        batch = plan.batch(calls, None, NO_RETRY, resent=resent)
        replies: list[Any] = await plan.arun(batch, partial(asend_batch, client), None)
        return replies
    cluster = client.client if isinstance(client, GuardedCluster) else client
    await _guard(cluster.initialize())
    out: list[Any] = [None] * len(calls)
    try:
        groups = _groups(cluster, calls)
    except redis.exceptions.ConnectionError:
        await _refresh_async(cluster)
        raise

    async def one(node: Any, which: list[int]) -> None:
        part = plan.batch([calls[i] for i in which], wait, NO_RETRY, resent=_part(resent, which))
        results = await plan.arun(part, partial(_ato_node, cluster, node), None)
        for i, result in zip(which, results, strict=True):
            out[i] = result

    await asyncio.gather(*(one(node, which) for node, which in groups))
    return out
